/* Waiting on a stream: the adaptive spin on the completion queue, the
 * sleep in the kernel, wake-ups, blocking mode, timeouts and signals. */
#include "stream_int.h"

#include "config.h"
#include "log.h"
#include "real.h"
#include "spin.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>

void sv_stream_wake(struct sv_stream *s)
{
	sv_lock_assert_held(&s->lock);
	s->wt.wake_gen++; /* a poll between its judgement and its sleep sees it */
	sv_hub_notify(&s->wt.node);
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

/* Arm the CQ and look once more (a completion that came before the arming
 * would not wake the sleep). 1 when that look took completions, -1 when
 * it found the QP broken, 0 when the CQ is armed. */
static int arm(struct sv_stream *s, struct sv_clock *clk)
{
	if (sv_qp_arm(s->qp) < 0)
		return 0;
	int r = sv_stream_poll_cq(s, clk); /* a break: the caller sees the new state */
	return r > 0 ? 1 : r < 0 ? -1 : 0;
}

/* Sleep in the kernel, the lock let go, on the TCP socket (for
 * tcp_events) and the hub (sl: the thread's eventfd, which the stream's
 * changes and completions kick, and the channels when it leads). 1 when
 * a kick or a channel ended it, 0 for the TCP socket or the time, or
 * -errno. */
static int sleep_in_kernel(struct sv_stream *s, struct sv_hub_sleeper *sl, short tcp_events,
			   uint64_t deadline, struct sv_clock *clk, short *tcp_revents)
{
	*tcp_revents = 0;
	struct pollfd pfd[2 + SV_HUB_MAX_CHANS];
	int n = 0;
	if (tcp_events)
		pfd[n++] = (struct pollfd){.fd = s->fd, .events = tcp_events};
	int hub_at = n;
	int nhub = sv_hub_sleep_fds(sl, &pfd[n]);
	n += nhub;
	uint64_t now = clk->us;
	int timeout = -1;
	if (deadline)
		timeout = deadline > now ? (int)((deadline - now + 999) / 1000) : 0;
	if (sl->efd < 0 && (timeout < 0 || timeout > SV_HUB_TICK_MS))
		timeout = SV_HUB_TICK_MS; /* nothing can kick us: look again soon */
	s->wt.waiters++;
	sv_unlock(&s->lock);
	int r = SV_REAL(poll)(pfd, (nfds_t)n, timeout);
	int err = errno;
	bool kicked = sv_hub_sleep_end(sl, &pfd[hub_at], nhub);
	sv_lock(&s->lock);
	s->wt.waiters--;
	sv_clock_update(clk);
	if (r < 0 && err == EINTR && signals_restart())
		r = 0; /* as if restarted: the caller judges again and waits */
	if (r < 0)
		return -err;
	if (tcp_events)
		*tcp_revents = pfd[0].revents;
	bool chan = false;
	for (int i = hub_at; i < n; i++)
		chan = chan || (pfd[i].fd != sl->efd && (pfd[i].revents & POLLIN));
	sv_stream_count_sleep(s, now, clk->us, r == 0, chan, kicked && !chan);
	return kicked ? 1 : 0;
}

int sv_stream_wait(struct sv_stream *s, struct sv_clock *clk, short tcp_events,
		   uint64_t deadline, unsigned flags)
{
	uint64_t start = sv_clock_now(clk);
	bool drained;
	/* On RDMA TCP is watched for the peer's resume record; while
	 * resuming, the exchange's events are what the wait is for. */
	short resume = sv_stream_resume_events(s);
	if (!tcp_events && s->state != SV_CONN_RESUMING && spin(s, clk, deadline, &drained)) {
		sv_stream_waited(s, clk->us - start);
		s->st.waits_spun++;
		return drained ? 1 : 0;
	}
	/* Begun and watching before the arming: the completion after it, or
	 * another thread's change, kicks this sleep (hub.h). */
	struct sv_hub_sleeper sl;
	struct sv_hub_watch w = {.fn = sv_hub_kick_fn, .arg = &sl};
	sv_hub_sleep_begin(&sl, sv_hub_thread_fd());
	sv_hub_attach(&s->wt.node, &w);
	int r = 0;
	if (s->qp && !s->error) {
		int a = arm(s, clk);
		if (a != 0) {
			s->st.waits_spun++;
			r = a > 0 ? 1 : 0;
			goto end_sleep;
		}
	}
	uint64_t next = s->proto ? sv_proto_next_deadline(s->proto, clk) : 0;
	if (!deadline || (next && next < deadline))
		deadline = next;
	if ((flags & SV_WAIT_APP) && !mode_blocking(s)) {
		r = -EAGAIN; /* made non-blocking since it was last seen */
		goto end_sleep;
	}
	short tcp_rev;
	r = sleep_in_kernel(s, &sl, tcp_events | resume, deadline, clk, &tcp_rev);
	sv_hub_detach(&w);
	if (r < 0)
		return r;
	if (tcp_rev && s->state == SV_CONN_RDMA)
		sv_stream_resume_peek(s);
	if (r > 0)
		sv_stream_waited(s, clk->us - start); /* a completion ended it */
	if (s->proto && !s->error)
		sv_proto_timers(s->proto, clk);
	return 0;

end_sleep:
	sv_hub_detach(&w);
	sv_hub_sleep_end(&sl, NULL, 0);
	return r;
}
