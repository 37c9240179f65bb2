/* epoll served by libsovia.
 *
 * The kernel's epoll cannot see a stream whose data travels over the QP, so
 * an accelerated stream added to an epoll set is not given to the kernel:
 * the set's shadow here keeps it (its events, data and edge/one-shot state,
 * src/readiness.h). Everything else (kernel fds, listening sockets, streams
 * that are plain TCP for good) stays in the kernel's set.
 *
 * epoll_wait over a set with a shadow is sv_poll_mixed over the set's own
 * fd (readable when the kernel's part has events) and the shadow's streams;
 * the streams' readiness comes from libsovia's state, the kernel's events
 * from a non-blocking epoll_wait on the real set. Waiting sleeps in the
 * kernel, on the completion channels, the streams' wake fds and the set.
 *
 * A stream that becomes plain TCP (fallback, or the way back for fork, exec,
 * dup...) moves from the shadow into the kernel's set with its event and
 * data, so nothing is lost and the kernel answers for it from then on.
 *
 * Not covered: an epoll fd with shadowed streams watched by poll/select or
 * by another epoll set sees only the kernel's part; a socket added to a
 * kernel set before its connect() stays plain TCP (fdtable.h, in_epoll). */
#include "clock.h"
#include "guard.h"
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
#include <time.h>

struct ep_entry {
	atomic_int refs;
	bool dead;       /* out of the set (under the set's lock) */
	int fd;
	struct sv_fd *f; /* a reference on the stream's fd entry */
	epoll_data_t data;
	struct sv_ep_rule rule;
	struct ep_entry *next;
};

struct sv_ep {
	atomic_int refs;
	struct sv_lock lock;
	int epfd;
	struct ep_entry *head;
	unsigned n;   /* live entries */
	unsigned rot; /* where the next wait starts judging (fairness) */
};

/* The shadows, by epoll fd. */
static struct sv_ep **eps;
static int neps_cap;
static atomic_int neps;
static struct sv_lock eps_lock = SV_LOCK_INIT(SV_RANK_EPOLL_TABLE);

static void entry_put(struct ep_entry *e)
{
	if (atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	sv_fd_put(e->f);
	free(e);
}

static void ep_put(struct sv_ep *ep)
{
	if (!ep || atomic_fetch_sub(&ep->refs, 1) != 1)
		return;
	struct ep_entry *e = ep->head;
	while (e) {
		struct ep_entry *next = e->next;
		entry_put(e);
		e = next;
	}
	sv_lock_destroy(&ep->lock);
	free(ep);
}

/* The shadow of epfd with a reference, or NULL; with `create`, made when
 * missing (NULL only on ENOMEM or an fd beyond the table). */
static struct sv_ep *ep_get(int epfd, bool create)
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

static struct ep_entry *ep_find(struct sv_ep *ep, int fd)
{
	for (struct ep_entry *e = ep->head; e; e = e->next)
		if (e->fd == fd)
			return e;
	return NULL;
}

/* Take e out of the set (under ep->lock). */
static void ep_unlink(struct sv_ep *ep, struct ep_entry *e)
{
	for (struct ep_entry **pp = &ep->head; *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			e->dead = true;
			ep->n--;
			entry_put(e);
			return;
		}
	}
}

static bool kernel_only(const struct ep_entry *e)
{
	return e->f->ops->wait->kernel_only(e->f);
}

static void marks_of(const struct ep_entry *e, struct sv_marks *m)
{
	e->f->ops->wait->marks(e->f, m);
}

/* Hand the entries whose streams are plain TCP for good (or, with `fd` >=
 * 0, fd's entry once it is) to the kernel's set. Under ep->lock. */
static void ep_migrate(struct sv_ep *ep, int fd)
{
	struct ep_entry *e = ep->head;
	while (e) {
		struct ep_entry *next = e->next;
		bool go = fd >= 0 ? e->fd == fd : kernel_only(e);
		if (go) {
			/* A disabled one-shot entry keeps only its flags, as the
			 * kernel's own would. */
			uint32_t ev = e->rule.events;
			if (e->rule.disabled)
				ev &= EPOLLET | EPOLLONESHOT | EPOLLWAKEUP;
			struct epoll_event kev = {.events = ev & ~(uint32_t)EPOLLEXCLUSIVE,
						  .data = e->data};
			int r = sv_real.epoll_ctl(ep->epfd, EPOLL_CTL_ADD, e->fd, &kev);
			if (r < 0 && errno != EEXIST)
				sv_warn("fd %d: the kernel's epoll %d refused it (%s): it is "
					"no longer watched", e->fd, ep->epfd, strerror(errno));
			else
				sv_dbg("fd %d: plain TCP now: epoll %d watches it in the kernel",
				       e->fd, ep->epfd);
			ep_unlink(ep, e);
		}
		e = next;
	}
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
		ep_migrate(ep, fd);
		sv_unlock(&ep->lock);
		ep_put(ep);
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
		ep_put(ep);
	}
	sv_lock(&eps_lock);
	ep = fd >= 0 && fd < neps_cap ? eps[fd] : NULL;
	if (ep) {
		eps[fd] = NULL;
		atomic_fetch_sub(&neps, 1);
	}
	sv_unlock(&eps_lock);
	ep_put(ep); /* the table's reference */
}

void sv_epoll_atfork_child(void)
{
	sv_lock_reinit(&eps_lock);
	for (int i = 0; i < neps_cap; i++) {
		struct sv_ep *ep = eps[i];
		if (!ep)
			continue;
		sv_lock_reinit(&ep->lock);
		/* Streams still here could not go back to TCP before the fork;
		 * they are the parent's. The kernel's set is shared with the
		 * parent, so the child leaves it alone. */
		while (ep->head) {
			sv_warn("fd %d: accelerated in the parent; this child's epoll %d no "
				"longer watches it", ep->head->fd, i);
			ep_unlink(ep, ep->head);
		}
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
		e = calloc(1, sizeof(*e));
		if (!e)
			return -ENOMEM;
		atomic_init(&e->refs, 1);
		e->fd = fd;
		e->f = f;
		atomic_fetch_add(&f->refs, 1);
		e->data = ev->data;
		sv_ep_rule_set(&e->rule, ev->events);
		e->next = ep->head;
		ep->head = e;
		ep->n++;
		return 0;
	case EPOLL_CTL_MOD:
		if (!e)
			return -ENOENT;
		if (ev->events & EPOLLEXCLUSIVE)
			return -EINVAL;
		e->data = ev->data;
		sv_ep_rule_set(&e->rule, ev->events);
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

SV_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	if (sv_passthrough())
		return SV_REAL(epoll_ctl)(epfd, op, fd, ev);
	int saved = errno;
	struct sv_ep *ep = ep_get(epfd, false);
	if (ep) {
		sv_lock(&ep->lock);
		ep_migrate(ep, -1);
		struct ep_entry *e = ep_find(ep, fd);
		long r = 1;
		if (e) {
			if (op != EPOLL_CTL_DEL && !ev)
				r = -EFAULT;
			else
				r = ctl_shadow(ep, op, fd, e->f, ev);
		}
		sv_unlock(&ep->lock);
		ep_put(ep);
		if (r <= 0)
			return (int)sv_ret(r, saved);
	}
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return SV_REAL(epoll_ctl)(epfd, op, fd, ev);
	bool own = f->ops->wait && !f->ops->wait->kernel_only(f);
	if (!own || op != EPOLL_CTL_ADD) {
		/* A socket that may still become a stream stays the kernel's
		 * once the kernel's epoll watches it (sv_socket_connected). */
		if (f->ops->connected && op == EPOLL_CTL_ADD)
			atomic_store(&f->in_epoll, true);
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
	ep = ep_get(epfd, true);
	if (!ep) {
		r = -ENOMEM;
		goto put_f;
	}
	sv_lock(&ep->lock);
	r = ctl_shadow(ep, op, fd, f, ev);
	sv_unlock(&ep->lock);
	ep_put(ep);
	if (r == 0)
		sv_dbg("fd %d: epoll %d watches it through libsovia", fd, epfd);
put_f:
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

/* ---- epoll_wait ------------------------------------------------------------ */

static int64_t now_ms(void)
{
	return (int64_t)(sv_now_us() / 1000);
}

#define ALWAYS_BITS (EPOLLERR | EPOLLHUP)

/* One wait's view of the shadow: the entries worth watching now, and the
 * poll set (the epoll fd itself first, then one per entry). */
struct ep_view {
	struct ep_entry **es;
	struct pollfd *pfd;
	unsigned k;
};

static void view_free(struct ep_view *v)
{
	for (unsigned i = 0; i < v->k; i++)
		entry_put(v->es[i]);
	free(v->es);
	free(v->pfd);
}

/* Gather the entries to watch, each with a reference. Under ep->lock, with
 * n = ep->n > 0 entries. 0 or -ENOMEM. */
static int view_gather(struct sv_ep *ep, struct ep_view *v)
{
	unsigned n = ep->n;
	v->k = 0;
	v->es = calloc(n, sizeof(*v->es));
	v->pfd = calloc(n + 1, sizeof(*v->pfd));
	if (!v->es || !v->pfd) {
		view_free(v);
		return -ENOMEM;
	}
	v->pfd[0] = (struct pollfd){.fd = ep->epfd, .events = POLLIN};
	/* Start the walk at a rotating place so that a busy stream does not
	 * always fill `max` first. */
	unsigned skip = ep->rot++ % n;
	struct ep_entry *e = ep->head;
	for (unsigned i = 0; i < skip; i++)
		e = e->next;
	for (unsigned i = 0; i < n; i++, e = e->next ? e->next : ep->head) {
		struct sv_marks m;
		marks_of(e, &m);
		uint32_t want = sv_ep_rule_watch(&e->rule, &m);
		if (!want)
			continue;
		atomic_fetch_add(&e->refs, 1);
		v->es[v->k] = e;
		v->pfd[++v->k] = (struct pollfd){.fd = e->fd, .events = (short)(want & ~ALWAYS_BITS)};
	}
	return 0;
}

/* The events to report after the poll, by the entries' rules. */
static int view_report(struct sv_ep *ep, struct ep_view *v, struct epoll_event *evs, int max)
{
	int count = 0;
	sv_lock(&ep->lock);
	for (unsigned i = 0; i < v->k && count < max; i++) {
		struct ep_entry *e = v->es[i];
		if (e->dead || !v->pfd[i + 1].revents)
			continue;
		struct sv_marks m;
		marks_of(e, &m);
		uint32_t bits = sv_ep_rule_report(&e->rule, (uint16_t)v->pfd[i + 1].revents, &m);
		if (bits)
			evs[count++] = (struct epoll_event){.events = bits, .data = e->data};
	}
	sv_unlock(&ep->lock);
	return count;
}

/* The count, 0 on timeout, or -errno; *empty when the shadow has no entry
 * (left) and the kernel's epoll_wait is the call. */
static int ep_wait(struct sv_ep *ep, struct epoll_event *evs, int max, int timeout_ms,
		   const sigset_t *mask, bool *empty)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	*empty = false;
	for (;;) {
		struct ep_view v;
		sv_lock(&ep->lock);
		ep_migrate(ep, -1);
		*empty = ep->n == 0;
		int r = *empty ? 0 : view_gather(ep, &v);
		sv_unlock(&ep->lock);
		if (*empty || r < 0)
			return r;
		int t = -1;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			t = left > 0 ? (int)left : 0;
		}
		r = sv_poll_mixed(v.pfd, v.k + 1, t, mask, true);
		int count = r >= 0 ? view_report(ep, &v, evs, max) : 0;
		short set_ev = v.pfd[0].revents;
		view_free(&v);
		if (r < 0)
			return r;
		if (set_ev & POLLNVAL)
			return -EBADF;
		if ((set_ev & POLLIN) && count < max) {
			int kr = sv_real.epoll_wait(ep->epfd, evs + count, max - count, 0);
			if (kr > 0)
				count += kr;
		}
		if (count || (deadline >= 0 && now_ms() >= deadline))
			return count;
	}
}

/* The served wait, or -1 with *served false when the kernel's is right. */
static int wait_common(int epfd, struct epoll_event *evs, int max, int timeout_ms,
		       const sigset_t *mask, bool *served)
{
	*served = false;
	if (sv_passthrough())
		return -1;
	struct sv_ep *ep = ep_get(epfd, false);
	if (!ep)
		return -1;
	int saved = errno;
	int r = -EINVAL;
	bool empty = false;
	if (max > 0) {
		sv_enter();
		r = ep_wait(ep, evs, max, timeout_ms, mask, &empty);
		sv_leave();
	}
	ep_put(ep);
	if (empty)
		return -1;
	*served = true;
	return (int)sv_ret(r, saved);
}

SV_EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	bool served;
	int r = wait_common(epfd, evs, max, timeout, NULL, &served);
	return served ? r : SV_REAL(epoll_wait)(epfd, evs, max, timeout);
}

SV_EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout,
			  const sigset_t *mask)
{
	bool served;
	int r = wait_common(epfd, evs, max, timeout, mask, &served);
	return served ? r : SV_REAL(epoll_pwait)(epfd, evs, max, timeout, mask);
}

SV_EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max,
			   const struct timespec *ts, const sigset_t *mask)
{
	int timeout = -1;
	if (ts) {
		int64_t ms = (int64_t)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000;
		timeout = ms > INT32_MAX ? INT32_MAX : (int)ms;
	}
	bool served;
	int r = wait_common(epfd, evs, max, timeout, mask, &served);
	return served ? r : SV_REAL(epoll_pwait2)(epfd, evs, max, ts, mask);
}
