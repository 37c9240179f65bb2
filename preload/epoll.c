/* epoll served by libsovia.
 *
 * The kernel's epoll cannot see a stream whose data travels over the QP, so
 * an accelerated stream added to an epoll set is not given to the kernel:
 * the set's shadow here keeps it (its events, data and edge/one-shot state,
 * src/base/readiness.h). Everything else (kernel fds, listening sockets, streams
 * that are plain TCP for good) stays in the kernel's set.
 *
 * Like the kernel's, a wait costs in proportion to what is ready, not to
 * the set's size. Each entry keeps a watch on its stream (src/base/hub.h): the
 * stream's changes and its armed CQ's completions put the entry on the
 * set's ready list and kick the set's sleeping waiters. A wait judges the
 * entries on that list (and the few whose readiness is partly the
 * kernel's: TCP before the switch), reports them by their rules, puts
 * back the level-triggered ones that stay ready, and arms the CQ of every
 * other one before it sleeps. The kernel's part comes from a non-blocking
 * epoll_wait on the real set, whose fd the sleep also polls.
 *
 * A stream that becomes plain TCP (fallback, or the way back for fork, exec,
 * dup...) moves from the shadow into the kernel's set with its event and
 * data, so nothing is lost and the kernel answers for it from then on.
 *
 * Not covered: an epoll fd with shadowed streams watched by poll/select or
 * by another epoll set sees only the kernel's part; a socket added to a
 * kernel set before its connect() stays plain TCP (fdtable.h, in_epoll). */
#include "epoll_int.h"

#include "guard.h"
#include "hub.h"
#include "log.h"
#include "preload.h"
#include "readiness.h"
#include "real.h"
#include "lock.h"
#include "wait.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

/* The shadows, by epoll fd. */
static struct sv_ep **eps;
static int neps_cap;
static atomic_int neps;
static struct sv_lock eps_lock = SV_LOCK_INIT(SV_RANK_EPOLL_TABLE);

void sv_ep_entry_put(struct ep_entry *e)
{
	if (atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	sv_fd_put(e->f);
	free(e);
}

/* The ready list's entries, taken (each with the list's reference). */
struct ep_entry *sv_ep_ready_take(struct sv_ep *ep)
{
	sv_lock(&ep->rlock);
	struct ep_entry *list = ep->ready;
	ep->ready = ep->ready_tail = NULL;
	/* Linked apart: once off the list (queued false), a watch may put an
	 * entry back on it, and rnext then belongs to the new list. */
	for (struct ep_entry *e = list; e; e = e->rnext) {
		e->queued = false;
		e->taken_next = e->rnext;
	}
	sv_unlock(&ep->rlock);
	return list;
}

/* Under the ready lock. */
static void ready_push_locked(struct sv_ep *ep, struct ep_entry *e)
{
	if (e->queued || e->dead)
		return;
	e->queued = true;
	atomic_fetch_add(&e->refs, 1);
	e->rnext = NULL;
	if (ep->ready_tail)
		ep->ready_tail->rnext = e;
	else
		ep->ready = e;
	ep->ready_tail = e;
}

void sv_ep_ready_push(struct sv_ep *ep, struct ep_entry *e)
{
	sv_lock(&ep->rlock);
	ready_push_locked(ep, e);
	sv_unlock(&ep->rlock);
}

/* The entry's watch (under the hub's lock): its stream changed. */
static void entry_fire(struct sv_hub_watch *w)
{
	struct ep_entry *e = w->arg;
	struct sv_ep *ep = e->ep;
	sv_lock(&ep->rlock);
	ready_push_locked(ep, e);
	for (struct ep_sleeper *z = ep->sleepers; z; z = z->next)
		sv_hub_kick(&z->sl);
	sv_unlock(&ep->rlock);
}

void sv_ep_put(struct sv_ep *ep)
{
	if (!ep || atomic_fetch_sub(&ep->refs, 1) != 1)
		return;
	struct ep_entry *e = ep->head;
	while (e) {
		struct ep_entry *next = e->next;
		sv_hub_detach(&e->hw);
		e->dead = true;
		sv_ep_entry_put(e);
		e = next;
	}
	for (e = sv_ep_ready_take(ep); e;) {
		struct ep_entry *next = e->taken_next;
		sv_ep_entry_put(e);
		e = next;
	}
	free(ep->byfd);
	sv_lock_destroy(&ep->rlock);
	sv_lock_destroy(&ep->lock);
	free(ep);
}

/* The shadow of epfd with a reference, or NULL; with `create`, made when
 * missing (NULL only on ENOMEM or an fd beyond the table). */
struct sv_ep *sv_ep_get(int epfd, bool create)
{
	if (!create && atomic_load(&neps) == 0)
		return NULL;
	struct sv_ep *ep = NULL;
	sv_lock(&eps_lock);
	if (!eps && create) {
		int cap = sv_fdtable_size();
		eps = calloc((size_t)cap, sizeof(*eps));
		if (eps)
			neps_cap = cap;
	}
	if (epfd >= 0 && epfd < neps_cap) {
		ep = eps[epfd];
		if (!ep && create) {
			ep = calloc(1, sizeof(*ep));
			if (ep) {
				atomic_init(&ep->refs, 1); /* the table's */
				sv_lock_init(&ep->lock, SV_RANK_EPOLL_SET);
				sv_lock_init(&ep->rlock, SV_RANK_EPOLL_READY);
				ep->epfd = epfd;
				eps[epfd] = ep;
				atomic_fetch_add(&neps, 1);
			}
		}
		if (ep)
			atomic_fetch_add(&ep->refs, 1);
	}
	sv_unlock(&eps_lock);
	return ep;
}

/* Calls from inside libsovia learn without a lock that the set has
 * entries of ours (fdtable.h's marks). Under ep->lock. */
static void ep_mark(const struct sv_ep *ep)
{
	sv_fd_set_mark(ep->epfd, SV_MARK_EPOLL, ep->n ? SV_MARK_EPOLL : 0);
}

static struct ep_entry *ep_find(struct sv_ep *ep, int fd)
{
	return fd >= 0 && fd < ep->byfd_cap ? ep->byfd[fd] : NULL;
}

/* Room in byfd for fd (under ep->lock). 0 or -ENOMEM. */
static int byfd_fit(struct sv_ep *ep, int fd)
{
	if (fd < ep->byfd_cap)
		return 0;
	int cap = ep->byfd_cap ? ep->byfd_cap : 64;
	while (cap <= fd)
		cap *= 2;
	struct ep_entry **b = realloc(ep->byfd, (size_t)cap * sizeof(*b));
	if (!b)
		return -ENOMEM;
	memset(b + ep->byfd_cap, 0, (size_t)(cap - ep->byfd_cap) * sizeof(*b));
	ep->byfd = b;
	ep->byfd_cap = cap;
	return 0;
}

/* On or off the TCP list by its tcp_events (under ep->lock). */
void sv_ep_tcp_update(struct sv_ep *ep, struct ep_entry *e, short events)
{
	bool was = e->tcp_events != 0, is = events != 0 && !e->dead;
	e->tcp_events = is ? events : 0;
	if (was == is)
		return;
	if (is) {
		e->tprev = NULL;
		e->tnext = ep->tcp;
		if (ep->tcp)
			ep->tcp->tprev = e;
		ep->tcp = e;
		ep->ntcp++;
		return;
	}
	if (e->tprev)
		e->tprev->tnext = e->tnext;
	else
		ep->tcp = e->tnext;
	if (e->tnext)
		e->tnext->tprev = e->tprev;
	e->tprev = e->tnext = NULL;
	ep->ntcp--;
}

/* Take e out of the set (under ep->lock). */
static void ep_unlink(struct sv_ep *ep, struct ep_entry *e)
{
	for (struct ep_entry **pp = &ep->head; *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			sv_hub_detach(&e->hw); /* no watch runs on it from here */
			sv_ep_tcp_update(ep, e, 0);
			e->dead = true;
			ep->byfd[e->fd] = NULL;
			ep->n--;
			ep_mark(ep);
			sv_ep_entry_put(e);
			return;
		}
	}
}

/* Hand e, whose stream is plain TCP for good, to the kernel's set. Under
 * ep->lock. */
void sv_ep_migrate(struct sv_ep *ep, struct ep_entry *e)
{
	/* A disabled one-shot entry keeps only its flags, as the kernel's own
	 * would. */
	uint32_t ev = e->rule.events;
	if (e->rule.disabled)
		ev &= EPOLLET | EPOLLONESHOT | EPOLLWAKEUP;
	struct epoll_event kev = {.events = ev & ~(uint32_t)EPOLLEXCLUSIVE, .data = e->data};
	int r = sv_real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, e->fd, &kev);
	if (r < 0 && errno != EEXIST)
		sv_warn("fd %d: the kernel's epoll %d refused it (%s): it is no longer watched",
			e->fd, ep->epfd, strerror(errno));
	else
		sv_dbg("fd %d: plain TCP now: epoll %d watches it in the kernel", e->fd, ep->epfd);
	ep_unlink(ep, e);
}

/* Every shadow, one at a time, with a reference. */
static struct sv_ep *ep_next(int *i)
{
	struct sv_ep *ep = NULL;
	sv_lock(&eps_lock);
	for (; !ep && *i < neps_cap; (*i)++) {
		ep = eps[*i];
		if (ep)
			atomic_fetch_add(&ep->refs, 1);
	}
	sv_unlock(&eps_lock);
	return ep;
}

void sv_epoll_fd_plain(int fd)
{
	if (atomic_load(&neps) == 0)
		return;
	int saved = errno;
	struct sv_ep *ep;
	for (int i = 0; (ep = ep_next(&i));) {
		sv_lock(&ep->lock);
		struct ep_entry *e = ep_find(ep, fd);
		if (e)
			sv_ep_migrate(ep, e);
		sv_unlock(&ep->lock);
		sv_ep_put(ep);
	}
	errno = saved;
}

void sv_epoll_on_close(int fd)
{
	if (atomic_load(&neps) == 0)
		return;
	struct sv_ep *ep;
	for (int i = 0; (ep = ep_next(&i));) {
		sv_lock(&ep->lock);
		struct ep_entry *e = ep_find(ep, fd);
		if (e)
			ep_unlink(ep, e);
		sv_unlock(&ep->lock);
		sv_ep_put(ep);
	}
	sv_lock(&eps_lock);
	ep = fd >= 0 && fd < neps_cap ? eps[fd] : NULL;
	if (ep) {
		eps[fd] = NULL;
		atomic_fetch_sub(&neps, 1);
		sv_fd_set_mark(fd, SV_MARK_EPOLL, 0);
	}
	sv_unlock(&eps_lock);
	sv_ep_put(ep); /* the table's reference */
}

void sv_epoll_atfork_child(void)
{
	sv_lock_reinit(&eps_lock);
	for (int i = 0; i < neps_cap; i++) {
		struct sv_ep *ep = eps[i];
		if (!ep)
			continue;
		sv_lock_reinit(&ep->lock);
		sv_lock_reinit(&ep->rlock);
		/* Streams still here could not go back to TCP before the fork;
		 * they are the parent's. The kernel's set is shared with the
		 * parent, so the child leaves it alone. The entries are left
		 * as they are (leaked): their streams' nodes, the parent's,
		 * still list their watches, and the hub is not ours yet. */
		for (struct ep_entry *e = ep->head; e; e = e->next) {
			sv_info("fd %d: carried by the parent's RDMA; this child's epoll %d no "
				"longer watches it", e->fd, i);
			e->dead = true;
			e->hw.node = NULL;
		}
		ep->head = NULL;
		ep->n = 0;
		ep_mark(ep);
		if (ep->byfd)
			memset(ep->byfd, 0, (size_t)ep->byfd_cap * sizeof(*ep->byfd));
		ep->tcp = NULL;
		ep->ntcp = 0;
		ep->ready = ep->ready_tail = NULL;
		ep->sleepers = NULL;
	}
}

/* ---- epoll_ctl ---------------------------------------------------------- */

static int ctl_shadow(struct sv_ep *ep, int op, int fd, struct sv_fd *f,
		      const struct epoll_event *ev)
{
	struct ep_entry *e = ep_find(ep, fd);
	switch (op) {
	case EPOLL_CTL_ADD:
		if (e)
			return -EEXIST;
		if (byfd_fit(ep, fd) < 0)
			return -ENOMEM;
		e = calloc(1, sizeof(*e));
		if (!e)
			return -ENOMEM;
		atomic_init(&e->refs, 1);
		e->fd = fd;
		e->f = f;
		atomic_fetch_add(&f->refs, 1);
		atomic_store(&f->in_epoll, true); /* no successor (fdtable.h) */
		e->data = ev->data;
		sv_ep_rule_set(&e->rule, ev->events);
		e->ep = ep;
		e->next = ep->head;
		ep->head = e;
		ep->byfd[fd] = e;
		ep->n++;
		ep_mark(ep);
		e->hw = (struct sv_hub_watch){.fn = entry_fire, .arg = e};
		sv_hub_attach(f->ops->wait->node(f), &e->hw);
		sv_ep_ready_push(ep, e); /* the next wait judges it */
		return 0;
	case EPOLL_CTL_MOD:
		if (!e)
			return -ENOENT;
		if (ev->events & EPOLLEXCLUSIVE)
			return -EINVAL;
		e->data = ev->data;
		sv_ep_rule_set(&e->rule, ev->events);
		sv_ep_ready_push(ep, e);
		return 0;
	case EPOLL_CTL_DEL:
		if (!e)
			return -ENOENT;
		ep_unlink(ep, e);
		return 0;
	default:
		return -EINVAL;
	}
}

/* epoll_ctl for the application (inside libsovia: its locks). */
static int ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	int saved = errno;
	struct sv_ep *ep = sv_ep_get(epfd, false);
	if (ep) {
		sv_lock(&ep->lock);
		struct ep_entry *e = ep_find(ep, fd);
		long r = 1;
		if (e) {
			if (op != EPOLL_CTL_DEL && !ev)
				r = -EFAULT;
			else
				r = ctl_shadow(ep, op, fd, e->f, ev);
		}
		sv_unlock(&ep->lock);
		sv_ep_put(ep);
		if (r <= 0)
			return (int)sv_ret(r, saved);
	}
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return SV_REAL(epoll_ctl)(epfd, op, fd, ev);
	bool own = f->ops->wait && !f->ops->wait->kernel_only(f);
	if (!own || op != EPOLL_CTL_ADD) {
		/* A socket that may still become a stream stays the kernel's
		 * once the kernel's epoll watches it (sv_socket_connected);
		 * so does a connection back on TCP (no successor). */
		if ((f->ops->connected || f->ops->wait) && op == EPOLL_CTL_ADD)
			atomic_store(&f->in_epoll, true);
		if (f->ops->will_accept && op == EPOLL_CTL_ADD)
			f->ops->will_accept(f);
		sv_fd_put(f);
		return SV_REAL(epoll_ctl)(epfd, op, fd, ev);
	}
	/* A stream joins epfd's shadow. The kernel judges the arguments: a
	 * removal of fd, which is not in its set, fails with ENOENT exactly
	 * when epfd is an epoll set other than fd. */
	long r;
	if (!ev) {
		r = -EFAULT;
		goto put_f;
	}
	if (sv_real.epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL) == 0)
		sv_warn("fd %d was in the kernel's epoll %d too", fd, epfd);
	else if (errno != ENOENT) {
		r = -errno;
		goto put_f;
	}
	ep = sv_ep_get(epfd, true);
	if (!ep) {
		r = -ENOMEM;
		goto put_f;
	}
	sv_lock(&ep->lock);
	r = ctl_shadow(ep, op, fd, f, ev);
	sv_unlock(&ep->lock);
	sv_ep_put(ep);
	if (r == 0)
		sv_dbg("fd %d: epoll %d watches it through libsovia", fd, epfd);
put_f:
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

SV_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	/* From inside libsovia (reentry.c): neither the set's shadow nor the
	 * fd's entry can be looked at. */
	if (sv_reentered() &&
	    (sv_fd_claimed(fd, SV_CLAIM_ANY) || sv_fd_claimed(epfd, SV_MARK_EPOLL)))
		return sv_refuse(fd, "epoll_ctl", EBUSY);
	if (sv_passthrough())
		return SV_REAL(epoll_ctl)(epfd, op, fd, ev);
	sv_enter(); /* the shadows' locks: a signal handler must not wait for them */
	int r = ctl(epfd, op, fd, ev);
	sv_leave();
	return r;
}
