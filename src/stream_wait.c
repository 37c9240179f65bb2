/* Waiting on a stream: the adaptive spin on the completion queue, the
 * sleep in the kernel, wake-ups, blocking mode, timeouts and signals. */
#include "stream_int.h"

#include "config.h"
#include "log.h"
#include "ownfd.h"
#include "real.h"
#include "spin.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>

void sv_stream_wake(struct sv_stream *s)
{
	s->wt.wake_gen++; /* a poll between its judgement and its sleep sees it */
	if (s->wt.waiters && s->wt.wake_fd >= 0) {
		uint64_t one = 1;
		ssize_t r = SV_REAL(write)(s->wt.wake_fd, &one, sizeof(one));
		(void)r; /* EAGAIN means it is signalled already */
	}
	sv_stream_wake_fd_trim(s);
}

int sv_stream_wake_fd(struct sv_stream *s)
{
	sv_lock_assert_held(&s->lock);
	if (s->wt.wake_fd < 0) {
		int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd >= 0)
			s->wt.wake_fd = sv_ownfd_move(fd);
	}
	return s->wt.wake_fd;
}

void sv_stream_wake_fd_trim(struct sv_stream *s)
{
	sv_lock_assert_held(&s->lock);
	if (s->wt.wake_fd >= 0 && !s->wt.waiters && sv_stream_tcp_for_good(s)) {
		SV_REAL(close)(s->wt.wake_fd);
		s->wt.wake_fd = -1;
	}
}

/* ---- Blocking mode, timeouts, errors ------------------------------------------ */

static bool mode_blocking(struct sv_stream *s)
{
	int fl = SV_REAL(fcntl)(s->fd, F_GETFL);
	bool b = fl >= 0 && !(fl & O_NONBLOCK);
	atomic_store_explicit(&s->wt.seen_blocking, b, memory_order_relaxed);
	return b;
}

bool sv_stream_blocking(struct sv_stream *s, int flags)
{
	if (flags & MSG_DONTWAIT)
		return false;
	/* A ping-pong's every read waits: an fcntl per wait is a system call
	 * on the way from the message to the reply. */
	if (atomic_load_explicit(&s->wt.seen_blocking, memory_order_relaxed))
		return true;
	return mode_blocking(s);
}

void sv_stream_mode_changed(struct sv_stream *s)
{
	atomic_store_explicit(&s->wt.seen_blocking, false, memory_order_relaxed);
}

static uint64_t timeo_of(int fd, int name)
{
	struct timeval tv;
	socklen_t l = sizeof(tv);
	if (SV_REAL(getsockopt)(fd, SOL_SOCKET, name, &tv, &l) < 0)
		return 0;
	return (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec;
}

void sv_stream_load_timeouts(struct sv_stream *s)
{
	s->opt.rcvtimeo_us = timeo_of(s->fd, SO_RCVTIMEO);
	s->opt.sndtimeo_us = timeo_of(s->fd, SO_SNDTIMEO);
}

bool sv_stream_timed_out(uint64_t timeo_us, struct sv_clock *clk, uint64_t *at)
{
	if (!timeo_us)
		return false;
	uint64_t now = sv_clock_now(clk);
	if (!*at) {
		*at = now + timeo_us;
		return false;
	}
	return now >= *at;
}

long sv_stream_app_error(struct sv_stream *s, bool sending)
{
	if (s->error && !s->error_told) {
		s->error_told = true;
		return s->error;
	}
	/* Told already, or the core failed on its own (the stream's error
	 * is set only where bytes may be lost): a send is refused as to a
	 * peer that reset, and never returns 0. */
	return sending ? -EPIPE : 0;
}

/* A blocking socket call interrupted by a signal: the kernel restarts it
 * when the handler that ran has SA_RESTART, and fails it with EINTR when
 * not. Which handler ran is not known here, so restart only when every
 * handler installed has SA_RESTART (the usual case: signal() sets it). */
static bool signals_restart(void)
{
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
			continue;
		if (!(sa.sa_flags & SA_SIGINFO) &&
		    (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
			continue;
		if (!(sa.sa_flags & SA_RESTART))
			return false;
	}
	return true;
}

/* ---- The spin ---------------------------------------------------------------- */

uint32_t sv_stream_spin_us(struct sv_stream *s)
{
	uint32_t budget = sv_spin_budget(atomic_load_explicit(&s->wt.wait_avg_us,
							      memory_order_relaxed),
					 sv_cfg.spin_us);
	if (atomic_load_explicit(&s->wt.writes, memory_order_relaxed) ==
	    atomic_load_explicit(&s->wt.writes_seen, memory_order_relaxed))
		budget = sv_spin_reader(budget); /* nothing written since the last read */
	return budget;
}

void sv_stream_waited(struct sv_stream *s, uint64_t us)
{
	/* Racing updates from two threads lose one sample: harmless. */
	uint32_t avg = atomic_load_explicit(&s->wt.wait_avg_us, memory_order_relaxed);
	atomic_store_explicit(&s->wt.wait_avg_us, sv_spin_average(avg, us, sv_cfg.spin_us),
			      memory_order_relaxed);
}

/* Poll the CQ for sv_stream_spin_us (spin.h) before sleeping. The lock is
 * let go between looks so the application's other threads get in. Returns
 * true when something came (or changed); *drained tells whether the last
 * look took completions (the CQ was emptied just now, lock held since).
 * The clock is read every SV_SPIN_CLOCK_PASSES looks. */
static bool spin(struct sv_stream *s, struct sv_clock *clk, uint64_t deadline, bool *drained)
{
	uint32_t budget = sv_stream_spin_us(s);
	*drained = false;
	if (!budget || !s->qp || s->error)
		return false;
	uint64_t gen = s->wt.wake_gen, until = sv_clock_now(clk) + budget;
	if (deadline && deadline < until)
		until = deadline;
	for (unsigned pass = 0;; pass++) {
		if (pass && pass % SV_SPIN_CLOCK_PASSES == 0)
			sv_clock_update(clk);
		int r = sv_stream_poll_cq(s, clk);
		if (r != 0 || s->wt.wake_gen != gen) {
			*drained = r > 0;
			return true;
		}
		if (clk->us >= until || !s->qp)
			return false;
		s->wt.app_calls++; /* busy here: the helper leaves the CQ to us */
		sv_unlock(&s->lock);
		if (pass % SV_SPIN_YIELD_PASSES == SV_SPIN_YIELD_PASSES - 1)
			sched_yield();
		sv_lock(&s->lock);
		if (!s->qp || s->error)
			return true;
	}
}

/* ---- The sleep ------------------------------------------------------------------ */

struct sleep_fds {
	struct pollfd pfd[3];
	int n, chan, wake;
};

/* Arm the CQ and look once more (a completion that came before the arming
 * would not wake the sleep). 1 when that look took completions, -1 when
 * it found the QP broken, 0 when the channel is armed. */
static int arm(struct sv_stream *s, struct sv_clock *clk)
{
	if (sv_qp_arm(s->qp) < 0)
		return 0;
	int r = sv_stream_poll_cq(s, clk); /* a break: the caller sees the new state */
	return r > 0 ? 1 : r < 0 ? -1 : 0;
}

static void sleep_fds(struct sv_stream *s, short tcp_events, struct sleep_fds *f)
{
	f->n = 0;
	f->chan = -1;
	if (s->qp && !s->error) {
		f->chan = f->n;
		f->pfd[f->n++] = (struct pollfd){.fd = sv_qp_fd(s->qp), .events = POLLIN};
	}
	if (tcp_events)
		f->pfd[f->n++] = (struct pollfd){.fd = s->fd, .events = tcp_events};
	f->wake = -1;
	int w = sv_stream_wake_fd(s);
	if (w >= 0) {
		f->wake = f->n;
		f->pfd[f->n++] = (struct pollfd){.fd = w, .events = POLLIN};
	}
}

/* Sleep in the kernel, the lock let go. 0 (woken or timed out) or -errno. */
static int sleep_in_kernel(struct sv_stream *s, struct sleep_fds *f, uint64_t deadline,
			   struct sv_clock *clk)
{
	uint64_t now = clk->us;
	int timeout = -1;
	if (deadline)
		timeout = deadline > now ? (int)((deadline - now + 999) / 1000) : 0;
	if (f->wake < 0 && (timeout < 0 || timeout > SV_POLL_TICK_MS))
		timeout = SV_POLL_TICK_MS; /* nothing can wake us: look again soon */
	s->wt.waiters++;
	sv_unlock(&s->lock);
	int r = SV_REAL(poll)(f->pfd, (nfds_t)f->n, timeout);
	int err = errno;
	sv_lock(&s->lock);
	s->wt.waiters--;
	sv_clock_update(clk);
	if (r < 0 && err == EINTR && signals_restart())
		r = 0; /* as if restarted: the caller judges again and waits */
	if (r < 0)
		return -err;
	bool chan = f->chan >= 0 && (f->pfd[f->chan].revents & POLLIN);
	bool kick = f->wake >= 0 && (f->pfd[f->wake].revents & POLLIN);
	if (kick && s->wt.waiters == 0) {
		uint64_t v;
		ssize_t rr = SV_REAL(read)(s->wt.wake_fd, &v, sizeof(v));
		(void)rr;
	}
	sv_stream_wake_fd_trim(s);
	sv_stream_count_sleep(s, now, clk->us, r == 0, chan, kick);
	if (chan && s->qp)
		sv_qp_drain_events(s->qp);
	return chan ? 1 : 0;
}

int sv_stream_wait(struct sv_stream *s, struct sv_clock *clk, short tcp_events,
		   uint64_t deadline, unsigned flags)
{
	uint64_t start = sv_clock_now(clk);
	bool drained;
	if (!tcp_events && spin(s, clk, deadline, &drained)) {
		sv_stream_waited(s, clk->us - start);
		s->st.waits_spun++;
		return drained ? 1 : 0;
	}
	if (s->qp && !s->error) {
		int a = arm(s, clk);
		if (a != 0) {
			s->st.waits_spun++;
			return a > 0 ? 1 : 0;
		}
	}
	struct sleep_fds f;
	sleep_fds(s, tcp_events, &f);
	uint64_t next = s->proto ? sv_proto_next_deadline(s->proto, clk) : 0;
	if (!deadline || (next && next < deadline))
		deadline = next;
	if ((flags & SV_WAIT_APP) && !mode_blocking(s))
		return -EAGAIN; /* made non-blocking since it was last seen */
	int r = sleep_in_kernel(s, &f, deadline, clk);
	if (r < 0)
		return r;
	if (r > 0)
		sv_stream_waited(s, clk->us - start); /* a completion ended it */
	if (s->proto && !s->error)
		sv_proto_timers(s->proto, clk);
	return 0;
}
