/* The lock order's checks (lock.h). */
#include "lock.h"

#include "log.h"

#include <sched.h>

__thread bool sv_tls_goes_first __attribute__((tls_model("initial-exec")));

void sv_lock_go_first(void)
{
	sv_tls_goes_first = true;
}

void sv_lock_contended(struct sv_lock *l)
{
	if (sv_tls_goes_first) {
		if (pthread_mutex_trylock(&l->m) == 0)
			return;
		atomic_fetch_add(&l->first, 1);
		pthread_mutex_lock(&l->m);
		atomic_fetch_sub(&l->first, 1);
		return;
	}
	/* Its holder lets go soon (no lock is held across a wait): the
	 * thread that goes first is woken then, and takes it while we yield. */
	while (atomic_load(&l->first))
		sched_yield();
	pthread_mutex_lock(&l->m);
}

void sv_lock_init(struct sv_lock *l, enum sv_lock_rank rank)
{
	pthread_mutex_init(&l->m, NULL);
	atomic_init(&l->first, 0);
	l->rank = rank;
}

void sv_lock_destroy(struct sv_lock *l)
{
	pthread_mutex_destroy(&l->m);
}

void sv_lock_reinit(struct sv_lock *l)
{
	pthread_mutex_init(&l->m, NULL);
	atomic_store_explicit(&l->first, 0, memory_order_relaxed); /* no helper in the child */
}

#ifdef SOVIA_CHECKS

/* The locks this thread holds, in the order taken. No thread holds more
 * than a handful: a chain of the ranks above is at most nine long. */
#define SV_LOCKS_HELD_MAX 16
static __thread const struct sv_lock *held[SV_LOCKS_HELD_MAX];
static __thread int nheld;

static void push(const struct sv_lock *l)
{
	if (nheld == SV_LOCKS_HELD_MAX)
		sv_fatal("lock order: more than %d locks held", SV_LOCKS_HELD_MAX);
	held[nheld++] = l;
}

void sv_lock(struct sv_lock *l)
{
	for (int i = 0; i < nheld; i++)
		if (held[i]->rank >= l->rank)
			sv_fatal("lock order: taking a lock of rank %d while holding one of rank %d",
				 (int)l->rank, (int)held[i]->rank);
	if (l->rank == SV_RANK_STREAM)
		sv_lock_contended(l);
	else
		pthread_mutex_lock(&l->m);
	push(l);
}

bool sv_trylock(struct sv_lock *l)
{
	if (pthread_mutex_trylock(&l->m) != 0)
		return false;
	push(l);
	return true;
}

void sv_unlock(struct sv_lock *l)
{
	for (int i = nheld - 1; i >= 0; i--) {
		if (held[i] == l) {
			held[i] = held[--nheld];
			pthread_mutex_unlock(&l->m);
			return;
		}
	}
	sv_fatal("lock order: unlocking a lock of rank %d this thread does not hold",
		 (int)l->rank);
}

void sv_lock_assert_held(const struct sv_lock *l)
{
	for (int i = 0; i < nheld; i++)
		if (held[i] == l)
			return;
	sv_fatal("a lock of rank %d must be held here", (int)l->rank);
}

#endif
