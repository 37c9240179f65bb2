/* Shared by epoll's files: epoll.c (the shadows, epoll_ctl, their ends)
 * and epoll_wait.c (the waits). See epoll.c for the design. */
#ifndef SV_EPOLL_INT_H
#define SV_EPOLL_INT_H

#include "fdtable.h"
#include "hub.h"
#include "lock.h"
#include "readiness.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/epoll.h>

struct sv_ep;

struct ep_entry {
	atomic_int refs;
	bool dead;       /* out of the set (under the set's lock) */
	int fd;
	struct sv_fd *f; /* a reference on the stream's fd entry */
	epoll_data_t data;
	struct sv_ep_rule rule;
	struct ep_entry *next;
	struct sv_ep *ep;
	/* On the stream's node while in the set: puts the entry on the
	 * ready list. */
	struct sv_hub_watch hw;
	/* Under the set's ready lock: on the ready list (holding a
	 * reference), and its link there. */
	bool queued;
	struct ep_entry *rnext;
	/* Its link in a list taken from the ready list (sv_ep_ready_take):
	 * the taker's, under the set's lock. */
	struct ep_entry *taken_next;
	/* Under the set's lock: the TCP socket's events that count for it
	 * (the kernel answers for some of its readiness, or a pending switch
	 * reads TCP); with any, it is on the TCP list, judged every wait. */
	short tcp_events;
	struct ep_entry *tprev, *tnext;
	unsigned round; /* the last wait round that judged it */
};

/* A thread asleep in the set's wait (its stack). */
struct ep_sleeper {
	struct sv_hub_sleeper sl;
	struct ep_sleeper *next;
};

struct sv_ep {
	atomic_int refs;
	struct sv_lock lock;
	int epfd;
	struct ep_entry *head;
	unsigned n; /* live entries */
	struct ep_entry **byfd; /* live entries by fd */
	int byfd_cap;
	struct ep_entry *tcp; /* the TCP list */
	unsigned ntcp;
	unsigned round;
	struct sv_lock rlock; /* the ready list and the sleepers */
	struct ep_entry *ready, *ready_tail;
	struct ep_sleeper *sleepers;
};

/* Drop a reference on an entry (the last frees it and its fd reference). */
void sv_ep_entry_put(struct ep_entry *e);
/* The shadow of epfd with a reference, or NULL; with `create`, made when
 * missing. sv_ep_put drops the reference. */
struct sv_ep *sv_ep_get(int epfd, bool create);
void sv_ep_put(struct sv_ep *ep);
/* The ready list's entries, taken (each with the list's reference); put
 * one on it (unless it is there or out of the set). */
struct ep_entry *sv_ep_ready_take(struct sv_ep *ep);
void sv_ep_ready_push(struct sv_ep *ep, struct ep_entry *e);
/* On or off the TCP list by the TCP events that count for it (under
 * ep->lock). */
void sv_ep_tcp_update(struct sv_ep *ep, struct ep_entry *e, short events);
/* Hand e, whose stream is plain TCP for good, to the kernel's set (under
 * ep->lock). */
void sv_ep_migrate(struct sv_ep *ep, struct ep_entry *e);

static inline bool sv_ep_kernel_only(const struct ep_entry *e)
{
	return e->f->ops->wait->kernel_only(e->f);
}

static inline void sv_ep_marks_of(const struct ep_entry *e, struct sv_marks *m)
{
	e->f->ops->wait->marks(e->f, m);
}

#endif
