/* poll() and ppoll() over a mix of kernel fds and accelerated streams.
 *
 * A stream's direction that travels over the QP is invisible to the kernel,
 * so its readiness comes from libsovia's state; everything else is the
 * kernel's. To sleep, the kernel poll also watches each stream's completion
 * channel and wake eventfd; after a wake the streams are judged again. */
#include "config.h"
#include "guard.h"
#include "preload.h"
#include "real.h"
#include "sovia_ops.h"
#include "stream.h"
#include "wait.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

/* Any accelerated stream among the fds? (The common case: none.) */
static bool any_stream(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++) {
		struct sv_fd *f = sv_fd_get(fds[i].fd);
		if (f) {
			bool st = f->ops == &sv_stream_ops;
			sv_fd_put(f);
			if (st)
				return true;
		}
	}
	return false;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int sv_poll_mixed(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask,
		  bool return_on_wake)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	struct sv_fd **ents = calloc(n, sizeof(*ents));
	short *own = calloc(n, sizeof(*own));
	struct pollfd *k = calloc(n * 4 + 1, sizeof(*k));
	int result = -ENOMEM;
	if (!ents || !own || !k)
		goto free_all;
	for (nfds_t i = 0; i < n; i++) {
		struct sv_fd *f = sv_fd_get(fds[i].fd);
		if (f && f->ops != &sv_stream_ops) {
			sv_fd_put(f);
			f = NULL;
		}
		ents[i] = f; /* a reference for the whole call */
	}
	/* Poll without sleeping first (judging the streams polls their
	 * completion queues), as long as the longest spin of the streams
	 * (sv_stream_spin_us: it adapts to their recent waits). */
	uint64_t t0 = sv_now_us(), spin = 0;
	for (nfds_t i = 0; i < n; i++) {
		uint32_t us = ents[i] ? sv_stream_spin_us(ents[i]->priv) : 0;
		spin = us > spin ? us : spin;
	}
	uint64_t spin_until = spin ? t0 + spin : 0;
	bool flushed = false;
	for (;;) {
		int ready = 0;
		bool spinning = spin_until && sv_now_us() < spin_until;
		uint64_t gen[n ? n : 1]; /* each stream's state as judged here */
		for (nfds_t i = 0; i < n; i++) {
			k[i] = fds[i];
			own[i] = 0;
			if (!ents[i])
				continue;
			short kernel;
			sv_stream_poll_split(ents[i]->priv, fds[i].events, &own[i], &kernel, &gen[i]);
			k[i].events = kernel;
			if (own[i])
				ready++;
		}
		/* Nothing of ours is ready: the application is about to wait
		 * (spin, then sleep). Once per call, push out what it
		 * coalesced; a poll that finds something ready does not, so a
		 * loop that polls between its writes still coalesces. */
		if (!ready && !flushed) {
			flushed = true;
			for (nfds_t i = 0; i < n; i++)
				if (ents[i])
					sv_stream_poll_waits(ents[i]->priv);
		}
		/* Sleep sources of the streams, unless something is ready. */
		nfds_t nk = n;
		bool again = false;
		int start[n ? n : 1], cnt[n ? n : 1];
		for (nfds_t i = 0; i < n; i++) {
			cnt[i] = 0;
			if (!ents[i] || ready || spinning)
				continue;
			start[i] = (int)nk;
			cnt[i] = sv_stream_poll_sources(ents[i]->priv, &k[nk], &again, gen[i]);
			nk += (nfds_t)cnt[i];
		}
		int t = -1;
		if (ready || again || spinning) {
			t = 0;
		} else if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			t = left > 0 ? (int)left : 0;
		}
		int r;
		if (mask) {
			struct timespec ts = {t / 1000, (long)(t % 1000) * 1000000}, *tp = t < 0 ? NULL : &ts;
			r = sv_real.ppoll(k, nk, tp, mask);
		} else {
			r = sv_real.poll(k, nk, t);
		}
		int err = errno;
		for (nfds_t i = 0; i < n; i++)
			if (cnt[i])
				sv_stream_poll_done(ents[i]->priv, &k[start[i]], cnt[i]);
		if (r < 0) {
			result = -err;
			break;
		}
		int count = 0;
		for (nfds_t i = 0; i < n; i++) {
			short rev = own[i];
			if (k[i].fd >= 0)
				rev |= k[i].revents;
			/* The kernel reports a hang-up of the TCP connection even
			 * while libsovia answers for reading (a switch pending):
			 * the application must then read, and our receive path
			 * gives it the data and the end, in order; a hang-up
			 * without readability would make it stop reading early. */
			short mine = (short)(fds[i].events & ~k[i].events);
			if (ents[i] && (mine & POLLIN) && (k[i].revents & (POLLHUP | POLLRDHUP)))
				rev |= fds[i].events & (POLLIN | POLLRDNORM);
			/* The kernel found TCP bytes to read, but they may be the
			 * peer's echo of a switch that completed while we slept:
			 * no bytes for the application, whose read would then
			 * block. Judge again now that the switch is visible. */
			if (ents[i] && (k[i].events & POLLIN) && (k[i].revents & (POLLIN | POLLRDNORM)))
				rev = sv_stream_poll_recheck(ents[i]->priv, fds[i].events, rev);
			fds[i].revents = rev;
			count += rev != 0;
		}
		if (count || (return_on_wake && !spinning) ||
		    (deadline >= 0 && now_ms() >= deadline)) {
			/* A stream that became ready after this call had to wait
			 * tells its spin how long that took. */
			if (flushed && count) {
				uint64_t waited = sv_now_us() - t0;
				for (nfds_t i = 0; i < n; i++)
					if (ents[i] && own[i])
						sv_stream_waited(ents[i]->priv, waited);
			}
			result = count;
			break;
		}
		if (spinning)
			sched_yield();
		/* A stream woke us (or changed while arming): judge again. */
	}
free_all:
	if (ents)
		for (nfds_t i = 0; i < n; i++)
			sv_fd_put(ents[i]);
	free(ents);
	free(own);
	free(k);
	return result;
}

SV_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
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
