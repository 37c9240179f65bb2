/* libsovia's mutexes, each with its place in the lock order.
 *
 * A thread may take a lock only while every lock it already holds has a
 * lower rank (docs/design.md, "Locks", says why each pair is ordered so).
 * Checked builds (SOVIA_CHECKS) keep the ranks each thread holds and abort
 * with a message at the first lock taken out of order; other builds compile
 * the checks away. A trylock cannot deadlock and is not checked, but what
 * it takes counts as held.
 *
 * The helper thread goes first on a stream's lock. An application that
 * calls in a tight loop (a sender on TCP before its upgrade) would
 * otherwise take the lock again each time before the woken helper runs,
 * and hold its upgrade off for as long as it keeps sending. A thread
 * marked with sv_lock_go_first() announces its wait on a stream's lock;
 * the others, before they take it, give way until it has it. Giving way
 * cannot deadlock: a thread that gives way holds only locks of lower rank,
 * which the holder the first thread waits for never needs. Other locks
 * are short leaves, taken on every call (the fd table's stripes): the
 * rule stays off them. */
#ifndef SV_LOCK_H
#define SV_LOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

enum sv_lock_rank {
	SV_RANK_EPOLL_SET = 10, /* one epoll set's shadow (preload/epoll.c) */
	SV_RANK_UPGRADE = 20,   /* rdma_cm: requests, listeners (upgrade.c) */
	SV_RANK_STREAM = 30,    /* one stream, its core and its QP */
	SV_RANK_HUB = 35,       /* wake-ups: watches, sleepers, channels (hub.c) */
	SV_RANK_TRANSPORT = 40, /* below a stream: the devices' PDs (verbs.c), a
				 * test's fake connection manager and QPs */
	SV_RANK_EPOLL_READY = 45, /* an epoll set's ready list (a hub watch adds) */
	SV_RANK_REGCACHE = 50,  /* a PD's registration cache */
	SV_RANK_HELPER = 60,    /* the helper's watch list and jobs */
	SV_RANK_STREAMS = 70,   /* the list of live streams */
	SV_RANK_EPOLL_TABLE = 80, /* the table of epoll shadows */
	SV_RANK_FDTABLE = 90,   /* the fd table's stripes */
	SV_RANK_STDIO = 95,     /* the FILEs fdopen made (preload/stdio.c) */
};

/* Are the run-time checks compiled in? */
#ifdef SOVIA_CHECKS
#define sv_checks 1
#else
#define sv_checks 0
#endif

struct sv_lock {
	pthread_mutex_t m;
	atomic_uint first; /* threads that go first, waiting for it (streams' locks) */
	enum sv_lock_rank rank;
};

/* This thread's sv_lock calls go before the others' (the helper thread). */
void sv_lock_go_first(void);
extern __thread bool sv_tls_goes_first __attribute__((tls_model("initial-exec")));
/* sv_lock of a stream's lock when this thread goes first or another one
 * waits. */
void sv_lock_contended(struct sv_lock *l);

#define SV_LOCK_INIT(r) {.m = PTHREAD_MUTEX_INITIALIZER, .rank = (r)}

void sv_lock_init(struct sv_lock *l, enum sv_lock_rank rank);
void sv_lock_destroy(struct sv_lock *l);
/* After fork, in the child: the lock as new (its holder may be a thread
 * that does not exist here). */
void sv_lock_reinit(struct sv_lock *l);

#ifdef SOVIA_CHECKS
void sv_lock(struct sv_lock *l);
void sv_unlock(struct sv_lock *l);
bool sv_trylock(struct sv_lock *l);
/* Abort unless the calling thread holds l. */
void sv_lock_assert_held(const struct sv_lock *l);
#else
static inline void sv_lock(struct sv_lock *l)
{
	if (l->rank == SV_RANK_STREAM &&
	    (sv_tls_goes_first || atomic_load_explicit(&l->first, memory_order_relaxed)))
		sv_lock_contended(l);
	else
		pthread_mutex_lock(&l->m);
}
static inline void sv_unlock(struct sv_lock *l)
{
	pthread_mutex_unlock(&l->m);
}
static inline bool sv_trylock(struct sv_lock *l)
{
	return pthread_mutex_trylock(&l->m) == 0;
}
static inline void sv_lock_assert_held(const struct sv_lock *l)
{
	(void)l;
}
#endif

#endif
