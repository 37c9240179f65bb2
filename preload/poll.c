/* poll(), ppoll(), select() and pselect() over a mix of kernel fds and
 * accelerated streams.
 *
 * A stream's direction that travels over the QP is invisible to the kernel,
 * so its readiness comes from libsovia's state; everything else is the
 * kernel's. To sleep, the kernel poll also watches each stream's completion
 * channel and wake eventfd; after a wake the streams are judged again. */
#include "clock.h"
#include "guard.h"
#include "hub.h"
#include "preload.h"
#include "real.h"
#include "wait.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

/* Any fd libsovia answers for among them? (The common case: none.) The
 * array is not const: glibc declares poll()'s write-only, and gcc takes a
 * read of it through a const pointer for a read of uninitialised memory. */
static bool any_stream(struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++) {
		struct sv_fd *f = sv_fd_get(fds[i].fd);
		bool own = f && f->ops->wait;
		sv_fd_put(f);
		if (own)
			return true;
	}
	return false;
}

/* From inside libsovia (reentry.c): a connection libsovia serves among
 * them cannot be judged without its lock. */
static bool served_among(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (sv_fd_claimed(fds[i].fd, SV_MARK_SERVED))
			return true;
	return false;
}

static bool served_in_sets(int n, const fd_set *rd, const fd_set *wr, const fd_set *ex)
{
	for (int fd = 0; fd < n && fd < FD_SETSIZE; fd++)
		if (((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) ||
		     (ex && FD_ISSET(fd, ex))) &&
		    sv_fd_claimed(fd, SV_MARK_SERVED))
			return true;
	return false;
}

/* One fd of a call of sv_poll_mixed. */
struct mixed_ent {
	struct sv_fd *f; /* libsovia answers for it (a reference), or NULL */
	short own;       /* the events libsovia found ready */
	uint64_t gen;    /* the state libsovia judged */
	bool watching;   /* w is attached to its stream for this sleep */
	struct sv_hub_watch w;
};

/* One call of sv_poll_mixed: the application's fds, what libsovia knows
 * of each, and the kernel's poll set: the application's fds with the
 * events the kernel answers, then the streams' sleep sources (at most one
 * each), then the hub's (the thread's eventfd, the channels it leads).
 * One allocation holds both arrays. */
struct mixed {
	struct pollfd *fds;
	nfds_t n;
	struct mixed_ent *e;
	struct pollfd *k;
	nfds_t nk;
	struct sv_hub_sleeper sl;
	int hub_at, nhub; /* the hub's fds in k[] (nhub 0: not asleep) */
};

static void mixed_free(struct mixed *m)
{
	for (nfds_t i = 0; i < m->n; i++)
		sv_fd_put(m->e[i].f);
	free(m->e);
}

static int mixed_init(struct mixed *m, struct pollfd *fds, nfds_t n)
{
	*m = (struct mixed){.fds = fds, .n = n};
	m->e = calloc(1, n * sizeof(*m->e) + (n * 2 + 1 + SV_HUB_MAX_CHANS) * sizeof(*m->k));
	if (!m->e)
		return -ENOMEM;
	m->k = (struct pollfd *)(m->e + n);
	for (nfds_t i = 0; i < n; i++) {
		struct sv_fd *f = sv_fd_get(fds[i].fd);
		if (f && !f->ops->wait) {
			sv_fd_put(f);
			f = NULL;
		}
		m->e[i].f = f; /* a reference for the whole call */
	}
	return 0;
}

/* Judge every fd libsovia answers for; the rest go to the kernel's set.
 * Returns how many of ours are ready. */
static int judge(struct mixed *m)
{
	int ready = 0;
	for (nfds_t i = 0; i < m->n; i++) {
		struct mixed_ent *e = &m->e[i];
		m->k[i] = m->fds[i];
		e->own = 0;
		if (!e->f)
			continue;
		short kernel;
		e->f->ops->wait->split(e->f, m->fds[i].events, &e->own, &kernel, &e->gen);
		m->k[i].events = kernel;
		ready += e->own != 0;
	}
	return ready;
}

/* Before a sleep: begin it in the hub, watch every stream (a change
 * kicks this thread) and add their sleep sources and the hub's fds after
 * the application's. Sets *again when a stream changed since it was
 * judged, and *tick_ms when nothing can wake the poll (look again then). */
static void add_sources(struct mixed *m, bool *again, int *tick_ms)
{
	sv_hub_sleep_begin(&m->sl, sv_hub_thread_fd());
	for (nfds_t i = 0; i < m->n; i++) {
		struct mixed_ent *e = &m->e[i];
		if (!e->f)
			continue;
		e->w = (struct sv_hub_watch){.fn = sv_hub_kick_fn, .arg = &m->sl};
		e->watching = true;
		int c = e->f->ops->wait->sources(e->f, &e->w, &m->k[m->nk], again, e->gen);
		m->nk += (nfds_t)c;
	}
	m->hub_at = (int)m->nk;
	m->nhub = sv_hub_sleep_fds(&m->sl, &m->k[m->nk]);
	m->nk += (nfds_t)m->nhub;
	if (m->sl.efd < 0)
		*tick_ms = SV_HUB_TICK_MS;
}

/* After the sleep: stop watching, end it in the hub. */
static void end_sources(struct mixed *m)
{
	for (nfds_t i = 0; i < m->n; i++) {
		struct mixed_ent *e = &m->e[i];
		if (e->watching)
			e->f->ops->wait->done(e->f, &e->w);
		e->watching = false;
	}
	sv_hub_sleep_end(&m->sl, &m->k[m->hub_at], m->nhub);
	m->nhub = 0;
}

/* Every fd's events after the kernel's poll. Returns how many have some. */
static int collect(struct mixed *m)
{
	int count = 0;
	for (nfds_t i = 0; i < m->n; i++) {
		struct sv_fd *f = m->e[i].f;
		struct pollfd *k = &m->k[i];
		short ev = m->fds[i].events, rev = m->e[i].own;
		if (k->fd >= 0)
			rev |= k->revents;
		/* The kernel reports a hang-up of the TCP connection even while
		 * libsovia answers for reading (a switch pending): the
		 * application must then read, and our receive path gives it the
		 * data and the end, in order; a hang-up without readability
		 * would make it stop reading early. */
		short mine = (short)(ev & ~k->events);
		if (f && (mine & POLLIN) && (k->revents & (POLLHUP | POLLRDHUP)))
			rev |= ev & (POLLIN | POLLRDNORM);
		/* The kernel found TCP bytes to read, but they may be the peer's
		 * echo of a switch that completed while we slept: no bytes for
		 * the application, whose read would then block. Judge again now
		 * that the switch is visible. */
		if (f && (k->events & POLLIN) && (k->revents & (POLLIN | POLLRDNORM)))
			rev = f->ops->wait->recheck(f, ev, rev);
		m->fds[i].revents = rev;
		count += rev != 0;
	}
	return count;
}

static int kernel_poll(struct mixed *m, int t, const sigset_t *mask)
{
	if (!mask)
		return sv_real.poll(m->k, m->nk, t);
	struct timespec ts = {t / 1000, (long)(t % 1000) * 1000000};
	return sv_real.ppoll(m->k, m->nk, t < 0 ? NULL : &ts, mask);
}

/* Poll without sleeping first, as long as the longest spin of the streams
 * (sv_stream_spin_us: it adapts to their recent waits); 0: none. */
static uint64_t spin_until(struct mixed *m, uint64_t t0)
{
	uint64_t spin = 0;
	for (nfds_t i = 0; i < m->n; i++) {
		struct sv_fd *f = m->e[i].f;
		uint32_t us = f ? f->ops->wait->spin_us(f) : 0;
		spin = us > spin ? us : spin;
	}
	return spin ? t0 + spin : 0;
}

int sv_poll_mixed(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask,
		  bool return_on_wake)
{
	struct mixed m;
	int result = mixed_init(&m, fds, n);
	if (result < 0)
		return result;
	/* One clock reading per round: at its start (the call's own at first). */
	uint64_t t0 = sv_now_us(), now = t0, until = spin_until(&m, t0);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ms * 1000u;
	bool flushed = false;
	for (;;) {
		bool spinning = until && now < until;
		int ready = judge(&m);
		/* Nothing of ours is ready: the application is about to wait
		 * (spin, then sleep). Once per call, push out what it coalesced;
		 * a poll that finds something ready does not, so a loop that
		 * polls between its writes still coalesces. */
		if (!ready && !flushed) {
			flushed = true;
			for (nfds_t i = 0; i < n; i++)
				if (m.e[i].f)
					m.e[i].f->ops->wait->waits(m.e[i].f);
		}
		bool again = false, sleeps = !ready && !spinning;
		int tick = 0;
		m.nk = n;
		if (sleeps)
			add_sources(&m, &again, &tick);
		int t = -1;
		if (ready || again || spinning) {
			t = 0;
		} else if (deadline != UINT64_MAX) {
			uint64_t left = deadline > now ? (deadline - now + 999) / 1000 : 0;
			t = left < INT_MAX ? (int)left : INT_MAX;
		}
		if (tick && (t < 0 || t > tick))
			t = tick; /* a stream that cannot wake us */
		int r = kernel_poll(&m, t, mask);
		int err = errno;
		if (sleeps)
			end_sources(&m);
		if (r < 0) {
			result = -err;
			break;
		}
		int count = collect(&m);
		now = sv_now_us();
		if (count || (return_on_wake && !spinning) || now >= deadline) {
			/* A stream that became ready after this call had to wait
			 * tells its spin how long that took. */
			if (flushed && count)
				for (nfds_t i = 0; i < n; i++)
					if (m.e[i].f && m.e[i].own)
						m.e[i].f->ops->wait->waited(m.e[i].f, now - t0);
			result = count;
			break;
		}
		if (spinning)
			sched_yield();
		/* A stream woke us (or changed while arming): judge again. */
	}
	mixed_free(&m);
	return result;
}

SV_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (sv_reentered() && served_among(fds, n))
		return sv_refuse(fds[0].fd, "poll", EBUSY);
	if (sv_passthrough() || !any_stream(fds, n))
		return SV_REAL(poll)(fds, n, timeout);
	int saved = errno;
	sv_enter();
	int r = sv_poll_mixed(fds, n, timeout, NULL, false);
	sv_leave();
	return (int)sv_ret(r, saved);
}

SV_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	if (sv_reentered() && served_among(fds, n))
		return sv_refuse(fds[0].fd, "ppoll", EBUSY);
	if (sv_passthrough() || !any_stream(fds, n))
		return SV_REAL(ppoll)(fds, n, ts, mask);
	int timeout = -1;
	if (ts)
		timeout = (int)(ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000);
	sigset_t cur;
	if (!mask) {
		pthread_sigmask(SIG_SETMASK, NULL, &cur);
		mask = &cur;
	}
	int saved = errno;
	sv_enter();
	int r = sv_poll_mixed(fds, n, timeout, mask, false);
	sv_leave();
	return (int)sv_ret(r, saved);
}

/* Fortified variants (_FORTIFY_SOURCE, Debian's packages): a program built
 * so calls these, not poll and ppoll. fdslen is the array's size in bytes. */
extern void __chk_fail(void) __attribute__((noreturn));
SV_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen);
SV_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
			  const sigset_t *mask, size_t fdslen);

SV_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return poll(fds, n, timeout);
}

SV_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
			  const sigset_t *mask, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return ppoll(fds, n, ts, mask);
}

/* select through poll, which knows the streams. */
static int select_common(int n, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
			 const sigset_t *mask, bool *served)
{
	*served = false;
	if (n < 0 || n > FD_SETSIZE)
		return -EINVAL;
	bool any = false;
	int count = 0;
	for (int fd = 0; fd < n; fd++) {
		if ((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex))) {
			count++;
			struct sv_fd *f = sv_fd_get(fd);
			any = any || (f && f->ops->wait);
			sv_fd_put(f);
		}
	}
	if (!any)
		return 0;
	*served = true;
	struct pollfd *p = calloc(count ? (size_t)count : 1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	int k = 0;
	for (int fd = 0; fd < n; fd++) {
		short ev = 0;
		if (rd && FD_ISSET(fd, rd))
			ev |= POLLIN;
		if (wr && FD_ISSET(fd, wr))
			ev |= POLLOUT;
		if (ex && FD_ISSET(fd, ex))
			ev |= POLLPRI;
		if (ev)
			p[k++] = (struct pollfd){.fd = fd, .events = ev};
	}
	sv_enter();
	int r = sv_poll_mixed(p, (nfds_t)k, timeout_ms, mask, false);
	sv_leave();
	if (r < 0) {
		free(p);
		return r;
	}
	for (int i = 0; i < k; i++)
		if (p[i].revents & POLLNVAL) {
			free(p);
			return -EBADF;
		}
	if (rd)
		FD_ZERO(rd);
	if (wr)
		FD_ZERO(wr);
	if (ex)
		FD_ZERO(ex);
	int bits = 0;
	for (int i = 0; i < k; i++) {
		short re = p[i].revents;
		/* As the kernel's select: an error or hang-up makes a socket
		 * readable and writable. */
		if (rd && (p[i].events & POLLIN) && (re & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(p[i].fd, rd);
			bits++;
		}
		if (wr && (p[i].events & POLLOUT) && (re & (POLLOUT | POLLERR))) {
			FD_SET(p[i].fd, wr);
			bits++;
		}
		if (ex && (p[i].events & POLLPRI) && (re & POLLPRI)) {
			FD_SET(p[i].fd, ex);
			bits++;
		}
	}
	free(p);
	return bits;
}

static int64_t tv_ms(const struct timeval *tv)
{
	if (!tv)
		return -1;
	return (int64_t)tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000;
}

SV_EXPORT int select(int n, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	if (sv_reentered() && served_in_sets(n, rd, wr, ex))
		return sv_refuse(-1, "select", EBUSY);
	if (sv_passthrough())
		return SV_REAL(select)(n, rd, wr, ex, tv);
	int saved = errno;
	int64_t ms = tv_ms(tv);
	bool served;
	int r = select_common(n, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, NULL, &served);
	if (!served)
		return SV_REAL(select)(n, rd, wr, ex, tv);
	if (tv && r == 0)
		tv->tv_sec = tv->tv_usec = 0; /* Linux reports the time left */
	return (int)sv_ret(r, saved);
}

SV_EXPORT int pselect(int n, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts,
		      const sigset_t *mask)
{
	if (sv_reentered() && served_in_sets(n, rd, wr, ex))
		return sv_refuse(-1, "pselect", EBUSY);
	if (sv_passthrough())
		return SV_REAL(pselect)(n, rd, wr, ex, ts, mask);
	int saved = errno;
	int64_t ms = ts ? (int64_t)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000 : -1;
	sigset_t cur;
	if (!mask) {
		pthread_sigmask(SIG_SETMASK, NULL, &cur);
		mask = &cur;
	}
	bool served;
	int r = select_common(n, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, mask, &served);
	if (!served)
		return SV_REAL(pselect)(n, rd, wr, ex, ts, mask);
	return (int)sv_ret(r, saved);
}
