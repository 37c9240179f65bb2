/* The stream's life: creation, waiting, the upgrade's steps, statistics.
 * The data paths are in stream_rx.c and stream_tx.c, closing in close.c. */
#include "real.h"
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "spin.h"
#include "regcache.h"
#include "verbs.h"

#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

uint64_t sv_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

const char *sv_conn_state_name(enum sv_conn_state s)
{
	switch (s) {
	case SV_CONN_TCP:
		return "tcp";
	case SV_CONN_RESOLVING:
		return "resolving";
	case SV_CONN_REQUESTED:
		return "requested";
	case SV_CONN_SWITCHING:
		return "switching";
	case SV_CONN_RDMA:
		return "rdma";
	case SV_CONN_FALLBACK:
		return "fallback";
	case SV_CONN_BROKEN:
		return "broken";
	case SV_CONN_DETACHING:
		return "detaching";
	case SV_CONN_DETACHED:
		return "detached";
	}
	return "?";
}

const char *sv_fallback_name(enum sv_fallback f)
{
	switch (f) {
	case SV_FB_NONE:
		return "none";
	case SV_FB_DISABLED:
		return "disabled";
	case SV_FB_NO_ROUTE:
		return "no-rdma-route";
	case SV_FB_REJECTED:
		return "rejected";
	case SV_FB_UNREACHABLE:
		return "unreachable";
	case SV_FB_VERSION:
		return "version-mismatch";
	case SV_FB_TIMEOUT:
		return "timeout";
	case SV_FB_NO_MATCH:
		return "no-matching-connection";
	case SV_FB_CHALLENGE:
		return "challenge-failed";
	case SV_FB_RESOURCES:
		return "no-resources";
	case SV_FB_UNSUPPORTED:
		return "unsupported-call";
	case SV_FB_SHUTDOWN:
		return "shut-down-before-upgrade";
	case SV_FB_QP_LOST:
		return "qp-lost";
	case SV_FB_CALLED_OFF:
		return "called-off-by-peer";
	case SV_FB_CREDENTIALS:
		return "credentials";
	}
	return "?";
}

/* Every live stream, for the exit flush. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_stream *all_streams;

static void all_add(struct sv_stream *s)
{
	pthread_mutex_lock(&all_lock);
	s->next_all = all_streams;
	all_streams = s;
	pthread_mutex_unlock(&all_lock);
}

static void all_remove(struct sv_stream *s)
{
	pthread_mutex_lock(&all_lock);
	for (struct sv_stream **pp = &all_streams; *pp; pp = &(*pp)->next_all) {
		if (*pp == s) {
			*pp = s->next_all;
			break;
		}
	}
	pthread_mutex_unlock(&all_lock);
}

void sv_stream_atfork_child(void)
{
	pthread_mutex_init(&all_lock, NULL);
	/* The parent's private copies of its sockets would keep its
	 * connections open as long as this child lives. */
	for (struct sv_stream *s = all_streams; s; s = s->next_all)
		if (s->fd_private && s->fd >= 0)
			SV_REAL(close)(s->fd);
	all_streams = NULL; /* never flushed nor freed here */
}

void sv_stream_exit_flush_all(void)
{
	/* Streams stay alive: the exit path only holds the list lock while it
	 * takes references, then flushes each without it. */
	struct sv_stream *batch[256];
	size_t n = 0;
	pthread_mutex_lock(&all_lock);
	for (struct sv_stream *s = all_streams; s && n < 256; s = s->next_all) {
		/* A stream whose last reference is being dropped right now
		 * (it is still listed until its release takes this lock) must
		 * not be revived. */
		int refs = atomic_load(&s->refs);
		while (refs > 0 && !atomic_compare_exchange_weak(&s->refs, &refs, refs + 1))
			;
		if (refs > 0)
			batch[n++] = s;
	}
	pthread_mutex_unlock(&all_lock);
	for (size_t i = 0; i < n; i++) {
		sv_stream_exit_flush(batch[i]);
		sv_stream_put(batch[i]);
	}
}

static bool tcp_flag(int fd, int name)
{
	int v = 0;
	socklen_t l = sizeof(v);
	return SV_REAL(getsockopt)(fd, IPPROTO_TCP, name, &v, &l) == 0 && v != 0;
}

struct sv_stream *sv_stream_new(int fd, bool is_client)
{
	struct sv_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_fd < 0) {
		free(s);
		return NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	atomic_init(&s->refs, 1);
	s->fd = fd;
	s->opens = 1;
	sv_stream_load_timeouts(s); /* set before the connect, or the listener's */
	s->is_client = is_client;
	s->state = SV_CONN_TCP;
	socklen_t l = sizeof(s->tuple.local);
	getsockname(fd, (struct sockaddr *)&s->tuple.local, &l);
	l = sizeof(s->tuple.peer);
	getpeername(fd, (struct sockaddr *)&s->tuple.peer, &l);
	/* TCP_NODELAY and TCP_CORK set before the connect, or on the listener
	 * (accepted sockets inherit them), are the kernel socket's. */
	s->nodelay = !sv_cfg.coalesce || tcp_flag(fd, TCP_NODELAY);
	s->cork = tcp_flag(fd, TCP_CORK);
	all_add(s);
	return s;
}

void sv_stream_get(struct sv_stream *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void sv_stream_put(struct sv_stream *s)
{
	if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	all_remove(s);
	sv_upgrade_forget(s); /* the QP before the core whose buffers it used */
	if (s->proto_ready)
		sv_proto_destroy(&s->proto);
	if (s->wake_fd >= 0)
		SV_REAL(close)(s->wake_fd);
	if (s->fd_private && s->fd >= 0)
		SV_REAL(close)(s->fd); /* e.g. after the way back, the last copy gone */
	free(s->tcpbuf);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* ---- Waiting ----------------------------------------------------------- */

void sv_stream_wake(struct sv_stream *s)
{
	s->wake_gen++; /* a poll between its judgement and its sleep sees it */
	if (s->waiters) {
		uint64_t one = 1;
		ssize_t r = SV_REAL(write)(s->wake_fd, &one, sizeof(one));
		(void)r; /* EAGAIN means it is signalled already */
	}
}

/* The part of an iovec after `skip` bytes (at most 64 entries). */
int sv_iov_advance(const struct iovec *iov, int iovcnt, size_t skip, struct iovec *out)
{
	int k = 0;
	for (int i = 0; i < iovcnt && k < 64; i++) {
		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		out[k].iov_base = (uint8_t *)iov[i].iov_base + skip;
		out[k].iov_len = iov[i].iov_len - skip;
		skip = 0;
		k++;
	}
	return k;
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
	s->rcvtimeo_us = timeo_of(s->fd, SO_RCVTIMEO);
	s->sndtimeo_us = timeo_of(s->fd, SO_SNDTIMEO);
}

bool sv_stream_timed_out(uint64_t timeo_us, uint64_t *at)
{
	if (!timeo_us)
		return false;
	uint64_t now = sv_now_us();
	if (!*at) {
		*at = now + timeo_us;
		return false;
	}
	return now >= *at;
}

long sv_stream_app_error(struct sv_stream *s, bool sending)
{
	if (!s->error_told) {
		s->error_told = true;
		return s->error;
	}
	return sending ? -EPIPE : 0;
}

static bool mode_blocking(struct sv_stream *s)
{
	int fl = SV_REAL(fcntl)(s->fd, F_GETFL);
	bool b = fl >= 0 && !(fl & O_NONBLOCK);
	atomic_store_explicit(&s->seen_blocking, b, memory_order_relaxed);
	return b;
}

bool sv_stream_blocking(struct sv_stream *s, int flags)
{
	if (flags & MSG_DONTWAIT)
		return false;
	/* A ping-pong's every read waits: in the guest an fcntl is a 0.55 us
	 * system call. */
	if (atomic_load_explicit(&s->seen_blocking, memory_order_relaxed))
		return true;
	return mode_blocking(s);
}

void sv_stream_mode_changed(struct sv_stream *s)
{
	atomic_store_explicit(&s->seen_blocking, false, memory_order_relaxed);
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

uint32_t sv_stream_spin_us(struct sv_stream *s)
{
	uint32_t budget = sv_spin_budget(atomic_load_explicit(&s->wait_avg_us, memory_order_relaxed),
					 sv_cfg.spin_us);
	if (atomic_load_explicit(&s->writes, memory_order_relaxed) ==
	    atomic_load_explicit(&s->writes_seen, memory_order_relaxed))
		budget = sv_spin_reader(budget); /* nothing written since the last read */
	return budget;
}

void sv_stream_waited(struct sv_stream *s, uint64_t us)
{
	/* Racing updates from two threads lose one sample: harmless. */
	uint32_t avg = atomic_load_explicit(&s->wait_avg_us, memory_order_relaxed);
	atomic_store_explicit(&s->wait_avg_us, sv_spin_average(avg, us, sv_cfg.spin_us),
			      memory_order_relaxed);
}

static void sv_stream_slept(struct sv_stream *s, uint64_t from, uint64_t to, bool timeout, bool chan,
			    bool kick)
{
	uint64_t us = to > from ? to - from : 0;
	s->st.waits_slept++;
	s->st.slept_us += us;
	if (us > s->st.slept_max_us)
		s->st.slept_max_us = us;
	s->st.woken_timeout += timeout;
	s->st.woken_chan += chan;
	s->st.woken_kick += kick;
}

/* Poll the CQ for sv_stream_spin_us (spin.h) before sleeping. The lock is
 * let go between looks so the application's other threads get in. Returns
 * true when something came (or changed); *drained tells whether the last
 * look took completions (the CQ was emptied just now, lock held since).
 * *now is the clock as last read (every SV_SPIN_CLOCK_PASSES looks; start
 * if never), for the caller to go on with. */
static bool spin(struct sv_stream *s, uint64_t *now, uint64_t deadline, bool *drained)
{
	uint32_t budget = sv_stream_spin_us(s);
	*drained = false;
	if (!budget || !s->verbs || s->error)
		return false;
	uint64_t gen = s->wake_gen, until = *now + budget;
	if (deadline && deadline < until)
		until = deadline;
	for (unsigned pass = 0;; pass++) {
		if (pass && pass % SV_SPIN_CLOCK_PASSES == 0)
			*now = sv_now_us();
		int r = sv_verbs_poll(s->verbs, &s->proto, *now);
		if (r < 0)
			sv_stream_break(s, r);
		if (r != 0 || s->wake_gen != gen) {
			*drained = r > 0;
			return true;
		}
		if (*now >= until || !s->verbs)
			return false;
		s->app_calls++; /* busy here: the helper leaves the CQ to us */
		pthread_mutex_unlock(&s->lock);
		if (pass % SV_SPIN_YIELD_PASSES == SV_SPIN_YIELD_PASSES - 1)
			sched_yield();
		pthread_mutex_lock(&s->lock);
		if (!s->verbs || s->error)
			return true;
	}
}

int sv_stream_wait(struct sv_stream *s, short tcp_events, uint64_t deadline)
{
	uint64_t now = sv_now_us();
	return sv_stream_wait_at(s, tcp_events, deadline, &now);
}

static int wait_common(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *at,
		       bool app);

int sv_stream_wait_at(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *at)
{
	return wait_common(s, tcp_events, deadline, at, false);
}

int sv_stream_app_wait(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *at)
{
	return wait_common(s, tcp_events, deadline, at, true);
}

static int wait_common(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *at,
		       bool app)
{
	struct pollfd pfd[3];
	int n = 0, chan = -1, tcp = -1;
	uint64_t start = *at, now = start;
	bool drained;
	if (!tcp_events && spin(s, &now, deadline, &drained)) {
		sv_stream_waited(s, now - start);
		s->st.waits_spun++;
		*at = now;
		return drained ? 1 : 0;
	}
	if (s->verbs && !s->error) {
		/* Arm, then look once more: a completion that came before the
		 * arming would not wake us. */
		if (sv_verbs_arm(s->verbs) == 0) {
			int r = sv_verbs_poll(s->verbs, &s->proto, now);
			if (r < 0)
				sv_stream_break(s, r); /* the caller sees the new state */
			if (r != 0) {
				s->st.waits_spun++;
				*at = now;
				return r > 0 ? 1 : 0;
			}
		}
		chan = n;
		pfd[n++] = (struct pollfd){.fd = sv_verbs_fd(s->verbs), .events = POLLIN};
	}
	if (tcp_events) {
		tcp = n;
		pfd[n++] = (struct pollfd){.fd = s->fd, .events = tcp_events};
	}
	int wake = n;
	pfd[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};

	uint64_t next = s->proto_ready ? sv_proto_next_deadline(&s->proto, now) : 0;
	if (!deadline || (next && next < deadline))
		deadline = next;
	int timeout = -1;
	if (deadline)
		timeout = deadline > now ? (int)((deadline - now + 999) / 1000) : 0;

	if (app && !mode_blocking(s)) {
		*at = now;
		return -EAGAIN; /* made non-blocking since it was last seen */
	}
	s->waiters++;
	uint64_t slept_from = now;
	pthread_mutex_unlock(&s->lock);
	int r = SV_REAL(poll)(pfd, (nfds_t)n, timeout);
	int err = errno;
	pthread_mutex_lock(&s->lock);
	s->waiters--;
	if (r < 0 && err == EINTR && signals_restart())
		r = 0; /* as if restarted: the caller judges again and waits */
	if (r < 0) {
		*at = sv_now_us();
		return -err;
	}
	if ((pfd[wake].revents & POLLIN) && s->waiters == 0) {
		uint64_t v;
		ssize_t rr = SV_REAL(read)(s->wake_fd, &v, sizeof(v));
		(void)rr;
	}
	now = sv_now_us();
	sv_stream_slept(s, slept_from, now, r == 0, chan >= 0 && (pfd[chan].revents & POLLIN),
			(pfd[wake].revents & POLLIN) != 0);
	if (chan >= 0 && (pfd[chan].revents & POLLIN) && s->verbs) {
		sv_verbs_drain_events(s->verbs);
		sv_stream_waited(s, now - start); /* a completion ended it */
	}
	(void)tcp;
	if (s->proto_ready && !s->error)
		sv_proto_timers(&s->proto, now);
	*at = now;
	return 0;
}

/* ---- Progress ----------------------------------------------------------- */

int sv_stream_progress(struct sv_stream *s)
{
	if (!s->verbs || s->error)
		return s->error;
	return sv_stream_progress_at(s, sv_now_us());
}

static int progress_common(struct sv_stream *s, uint64_t now, bool timers, bool poll_cq)
{
	if (!s->verbs || s->error)
		return s->error;
	int r = poll_cq ? sv_verbs_poll(s->verbs, &s->proto, now) : 0;
	if (r < 0) {
		sv_stream_break(s, r);
		return s->error;
	}
	if (timers)
		sv_proto_timers(&s->proto, now);
	if (s->state == SV_CONN_DETACHING || sv_proto_back_wanted(&s->proto)) {
		sv_stream_back_progress(s);
		if (s->error)
			return s->error;
	}
	if (s->echo_owed) {
		r = sv_stream_write_echo(s);
		if (r < 0 && r != -EAGAIN) {
			sv_stream_break(s, r);
			return s->error;
		}
	}
	if (r > 0)
		sv_stream_wake(s);
	return 0;
}

int sv_stream_progress_at(struct sv_stream *s, uint64_t now)
{
	return progress_common(s, now, true, true);
}

int sv_stream_progress_drained(struct sv_stream *s, uint64_t now)
{
	return progress_common(s, now, true, false);
}

int sv_stream_progress_before_send(struct sv_stream *s, uint64_t now)
{
	/* A coalesced buffer's timer is looked at by one write in
	 * SV_TX_TIMER_EVERY (or by any that has a clock reading anyway): each
	 * look reads the clock, a system call under emulation that cost a
	 * 64 B streaming writer a third of each write. Appending writes poll
	 * the CQ, so the peer's acknowledgment still sends the buffer at once
	 * (Nagle's idle); a read sends it too, and the helper does for an
	 * application that stopped calling. */
	bool timers = false;
	if (s->proto.pending_slot >= 0 &&
	    (now != SV_NOW_UNREAD || ++s->tx_unclocked >= SV_TX_TIMER_EVERY)) {
		timers = true;
		s->tx_unclocked = 0;
	}
	return progress_common(s, now, timers, true);
}

void sv_stream_break(struct sv_stream *s, int err)
{
	if (s->state == SV_CONN_BROKEN || s->state == SV_CONN_FALLBACK || s->qp_lost ||
	    s->state == SV_CONN_DETACHED)
		return;
	struct sv_proto *p = &s->proto;
	if (s->state == SV_CONN_DETACHING) {
		/* Bytes on their way back may be lost with the QP. */
		sv_warn("fd %d: the QP broke while going back to TCP", s->fd);
		s->state = SV_CONN_BROKEN;
		s->error = err < 0 ? err : -ECONNRESET;
		sv_stream_wake(s);
		return;
	}
	sv_dbg("fd %d: the QP is down (%s)", s->fd, strerror(err < 0 ? -err : ECONNRESET));
	/* Before the QP was established nothing can have gone over it. */
	bool established = s->state == SV_CONN_SWITCHING || s->state == SV_CONN_RDMA;
	bool moved = s->proto_ready && established &&
		     (p->tx_state != SV_TX_TCP || p->rx_on_qp || p->peer_to_rdma);
	if (!moved) {
		/* Nothing ever went over the QP: TCP simply carries on. */
		s->state = SV_CONN_FALLBACK;
		/* EACCES: the kernel refused our writes to the RDMA device's
		 * files (preload/creds.c); ECONNRESET: the peer disconnected
		 * (its client shut down on TCP before the QP was up); anything
		 * else: the QP failed on its own. */
		if (s->fallback == SV_FB_NONE)
			s->fallback = err == -EACCES	   ? SV_FB_CREDENTIALS
				      : err == -ECONNRESET ? SV_FB_CALLED_OFF
							   : SV_FB_QP_LOST;
		sv_stream_wake(s);
		return;
	}
	if (p->peer_to_rdma && !p->rx_on_qp && p->tx_state == SV_TX_TCP) {
		/* A switch was announced but not verified yet, and nothing of
		 * ours went over the QP. What follows its point on TCP decides:
		 * our challenge means a real peer whose QP died (the echo is
		 * dropped, TCP carries on); anything else is the TCP peer's own
		 * data (given back). The receive path keeps checking. */
		if (memcmp(s->chal_got, s->my_challenge, s->chal_len) != 0) {
			p->peer_to_rdma = false;
			s->state = SV_CONN_FALLBACK;
			s->fallback = SV_FB_CHALLENGE;
			if (sv_stream_tcpbuf_append(s, s->chal_got, s->chal_len) < 0)
				s->error = -ENOMEM;
			s->chal_len = 0;
		} else {
			s->qp_lost = true;
		}
		sv_stream_wake(s);
		return;
	}
	s->state = SV_CONN_BROKEN;
	/* Receiving: what the QP delivered is read first, then TCP carries
	 * on from there. A peer that exited or was killed closed its TCP
	 * socket too, so that gives EOF or ECONNRESET, never a hang. */
	if (p->rx_on_qp && !p->rx_switch_pending && !p->rx_fin) {
		p->rx_switch_pending = true;
		p->rx_switch_seq = p->rcv_nxt;
		if (p->rcv_read == p->rcv_nxt) {
			p->rx_on_qp = false;
			p->rx_switch_pending = false;
		}
	}
	if (p->peer_to_rdma) {
		s->error = -ECONNRESET; /* broke inside a switch */
	}
	/* Sending: if everything posted was delivered, TCP carries on from
	 * snd_nxt (with the bytes still held for coalescing); otherwise bytes
	 * are lost and the stream must fail rather than go on with a gap. */
	if (p->tx_state == SV_TX_OPEN) {
		bool all_done = p->nfree + (p->pending_slot >= 0) == sv_proto_nsend(&p->prm);
		if (all_done && !s->tx_held) {
			if (p->pending_slot >= 0) {
				uint8_t *b = p->xp.ops->send_buf(p->xp.ctx, (uint32_t)p->pending_slot);
				uint32_t len = p->pending_len, off = 0;
				while (off < len) {
					ssize_t n = SV_REAL(send)(s->fd, b + SV_HDR_SIZE + off, len - off,
							 MSG_NOSIGNAL);
					if (n <= 0)
						break;
					off += (uint32_t)n;
				}
				p->free_slots[p->nfree++] = (uint32_t)p->pending_slot;
				p->pending_slot = -1;
				p->pending_len = 0;
				if (off < len)
					s->error = -ECONNRESET;
			}
			p->tx_state = SV_TX_TCP;
		} else {
			s->error = err < 0 ? err : -ECONNRESET;
		}
	}
	/* The peer reads TCP from here on: a FIN we sent over the QP must
	 * reach it there too. */
	sv_stream_kernel_shut(s);
	sv_stream_wake(s);
}

void sv_stream_qp_down(struct sv_stream *s, int err)
{
	pthread_mutex_lock(&s->lock);
	if (s->state == SV_CONN_DETACHED) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (s->verbs && !s->error)
		sv_verbs_poll(s->verbs, &s->proto, sv_now_us()); /* keep what arrived */
	struct sv_proto *p = &s->proto;
	bool tx_done = p->tx_state != SV_TX_OPEN || s->tx_shut;
	/* Both directions finished, or the peer went first: its FIN came and
	 * none of our DATA is in flight. The second is the judgement the
	 * flushed work requests get (sv_proto_peer_ended), made here too:
	 * the disconnect can come before they are in the CQ, and the poll
	 * above then finds none. Judging it by tx_done alone broke such ends
	 * whenever the flush was late (bed.semantics' TCP_NODELAY client,
	 * 1 run in 40, "state=broken" with no failed work request). */
	if (s->proto_ready && !p->peer_to_rdma &&
	    ((p->rx_fin && tx_done) || sv_proto_peer_ended(p))) {
		/* An ordinary end, nothing is lost. */
		sv_stream_wake(s);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	sv_stream_break(s, err);
	pthread_mutex_unlock(&s->lock);
}

/* ---- The upgrade's steps ------------------------------------------------ */

void sv_stream_fallback(struct sv_stream *s, enum sv_fallback why)
{
	pthread_mutex_lock(&s->lock);
	if (s->state != SV_CONN_RDMA && s->state != SV_CONN_BROKEN &&
	    s->state != SV_CONN_DETACHING && s->state != SV_CONN_DETACHED) {
		sv_info("fd %d stays on TCP: %s", s->fd, sv_fallback_name(why));
		s->state = SV_CONN_FALLBACK;
		s->fallback = why;
		sv_stream_wake(s);
	}
	pthread_mutex_unlock(&s->lock);
}

void sv_stream_established(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->state == SV_CONN_FALLBACK || s->state == SV_CONN_BROKEN || s->error) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (s->tx_shut && s->is_client) {
		/* The client finished sending on TCP before the QP came up:
		 * the echo can no longer follow TCP's FIN, so this connection
		 * stays on TCP (nothing in-band happened yet). */
		s->state = SV_CONN_FALLBACK;
		s->fallback = SV_FB_SHUTDOWN;
		sv_upgrade_disconnect(s);
		sv_stream_wake(s);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (s->state == SV_CONN_RDMA || s->state == SV_CONN_SWITCHING) {
		/* The server's QP works from its accept on: the switch can be
		 * under way or done before ESTABLISHED reaches us. */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	s->state = SV_CONN_SWITCHING;
	s->deadline_us = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	if (s->is_client) {
		/* The client moves first: TCP carried [0, tcp_tx); its data then
		 * waits until the server proves it is the TCP peer. */
		int r = sv_proto_send_to_rdma(&s->proto, s->tcp_tx, sv_now_us());
		if (r < 0) {
			pthread_mutex_unlock(&s->lock);
			sv_stream_fallback(s, SV_FB_RESOURCES);
			return;
		}
		s->tx_held = true;
		s->echo_owed = true;
		s->echo_sent = 0;
	}
	sv_stream_progress(s);
	pthread_mutex_unlock(&s->lock);
}

/* The server's reply to a verified client: move our sending as well. */
static void server_switch_tx(struct sv_stream *s)
{
	if (s->tx_shut)
		return; /* finished on TCP: our direction simply stays there */
	int r = sv_proto_send_to_rdma(&s->proto, s->tcp_tx, sv_now_us());
	if (r < 0) {
		sv_stream_break(s, r);
		return;
	}
	s->echo_owed = true;
	s->echo_sent = 0;
	s->st.switches_to_rdma++;
}

void sv_stream_unhold(struct sv_stream *s, const char *why)
{
	if (!s->tx_held)
		return;
	/* The server cannot prove itself any more: our sending goes back to
	 * TCP with TO_TCP (it carries no data, so even an impostor learns
	 * nothing) and the connection carries on there. */
	sv_info("fd %d: the server did not prove itself (%s): sending stays on TCP", s->fd, why);
	if (sv_proto_send_to_tcp(&s->proto, sv_now_us()) < 0) {
		sv_stream_break(s, -ECONNRESET);
		return;
	}
	s->tx_held = false;
	s->st.switches_to_tcp++;
	s->state = SV_CONN_FALLBACK;
	s->fallback = SV_FB_CHALLENGE;
	sv_stream_wake(s);
}

void sv_stream_rx_switched(struct sv_stream *s)
{
	s->st.switches_to_rdma++;
	if (s->is_client) {
		s->tx_held = false; /* the server proved itself: our data may go */
	} else if (s->proto.tx_state == SV_TX_TCP) {
		server_switch_tx(s);
	}
	if (s->state == SV_CONN_REQUESTED)
		s->state = SV_CONN_SWITCHING; /* ESTABLISHED is still on its way */
	sv_stream_maybe_rdma(s);
	sv_stream_wake(s);
}

void sv_stream_maybe_rdma(struct sv_stream *s)
{
	if ((s->state == SV_CONN_SWITCHING || s->state == SV_CONN_REQUESTED) && s->proto_ready &&
	    s->proto.rx_on_qp && !s->tx_held && !s->echo_owed) {
		s->state = SV_CONN_RDMA;
		sv_info("fd %d: on RDMA", s->fd);
	}
}

/* How long the helper leaves a stream on RDMA alone while its application
 * calls in (its calls poll the CQ and run the timers), before it looks
 * whether the application went idle: SV_HELPER_LOOK_US at first, doubling
 * up to SV_HELPER_LOOK_MAX_US while the application stays active. Each look
 * costs the process a wake-up and the stream's lock (at 1 ms, a third of
 * the context switches of a ping-pong under emulation). */
#define SV_HELPER_LOOK_US 1000u
#define SV_HELPER_LOOK_MAX_US 16000u

/* On RDMA with nothing in between (switch, echo, close) for the helper: the
 * application's own calls drive the stream. */
static bool app_drives(const struct sv_stream *s)
{
	return s->state == SV_CONN_RDMA && !s->echo_owed && !s->proto.peer_to_rdma && s->verbs &&
	       !s->error && !s->app_closed;
}

/* Did the application call in since the helper's last look, or does it
 * wait inside libsovia now? Records this look. */
static bool app_active(struct sv_stream *s)
{
	bool active = s->waiters || s->app_calls != s->helper_seen;
	s->helper_seen = s->app_calls;
	return active;
}

/* The helper's next look at a stream its active application drives (see
 * SV_HELPER_LOOK_US). Coalesced bytes waiting for their timer keep the look
 * near that deadline (at least SV_HELPER_LOOK_US away): should the
 * application stop calling before it, the helper flushes them. A deadline
 * armed after this look, and the delayed ACK's, wait for the next look. */
/* The look interval for an application still active: doubled, bounded. */
static uint32_t look_back_off(struct sv_watch_io *io)
{
	uint32_t look = io->look_us ? io->look_us * 2 : SV_HELPER_LOOK_US;
	io->look_us = look < SV_HELPER_LOOK_MAX_US ? look : SV_HELPER_LOOK_MAX_US;
	return io->look_us;
}

static uint64_t active_look(const struct sv_stream *s, uint64_t now, struct sv_watch_io *io)
{
	uint64_t next = now + look_back_off(io);
	uint64_t flush = sv_proto_flush_deadline(&s->proto);
	if (flush) {
		uint64_t soon = flush > now + SV_HELPER_LOOK_US ? flush : now + SV_HELPER_LOOK_US;
		if (soon < next)
			next = soon;
	}
	return next;
}

/* A stream the application drives, found idle (no call since the last
 * look, nobody waiting in libsovia): arm the CQ and sleep on the completion
 * channel and the core's deadline, so an idle application's connection
 * still answers BACK, sends its delayed ACKs and flushes its coalesced
 * bytes. While the application is active the helper only looks every
 * SV_HELPER_LOOK_US (sv_stream_service). */
static uint64_t idle_watch(struct sv_stream *s, uint64_t now, struct sv_watch_io *io)
{
	io->idle = true;
	io->look_us = 0; /* when it calls in again, look often at first */
	uint64_t look = now + SV_HELPER_LOOK_US;
	int fd = sv_verbs_fd(s->verbs);
	if (io->chan < 0 || io->chan_of != fd) {
		int copy = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, 0);
		if (copy < 0) {
			sv_dbg("fd %d: helper: no copy of the completion channel: %s", s->fd,
			       strerror(errno));
			return look; /* keep looking by the clock */
		}
		io->chan = copy;
		io->chan_of = fd;
	}
	if (sv_verbs_arm(s->verbs) < 0)
		return look;
	int r = sv_verbs_poll(s->verbs, &s->proto, now);
	if (r < 0) {
		sv_stream_break(s, r);
		return now; /* the next service sees the new state */
	}
	if (r > 0) {
		/* Completions came before the arming: handle them, look again. */
		sv_stream_progress(s);
		sv_stream_wake(s);
		return now;
	}
	io->armed = true;
	return sv_proto_next_deadline(&s->proto, now);
}

uint64_t sv_stream_service(struct sv_stream *s, uint64_t now, bool *done, struct sv_watch_io *io)
{
	*done = false;
	io->idle = io->armed = false;
	if (io->look_us && !io->fired && !io->kicked) {
		/* The last look found the application driving the stream. If
		 * it holds the lock now, it is inside libsovia (its waits let
		 * go of the lock) and runs the timers itself: come back later
		 * rather than queue behind it and make it queue behind us. */
		if (pthread_mutex_trylock(&s->lock) != 0) {
			io->idle = true;
			return now + look_back_off(io);
		}
	} else {
		pthread_mutex_lock(&s->lock);
	}
	uint64_t next = 0;
	if (s->connecting) {
		/* A non-blocking connect in progress: upgrade once it is done.
		 * Not told by POLLOUT: the application may have filled the
		 * send buffer already (a peer that does not read yet), and
		 * not by SO_ERROR either: reading it would take the outcome
		 * away from the application. The TCP state tells. */
		struct tcp_info ti;
		socklen_t tl = sizeof(ti);
		if (SV_REAL(getsockopt)(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0 ||
		    ti.tcpi_state != TCP_SYN_SENT) {
			s->connecting = false;
			socklen_t ll = sizeof(s->tuple.local), pl = sizeof(s->tuple.peer);
			bool ok = getpeername(s->fd, (struct sockaddr *)&s->tuple.peer, &pl) == 0 &&
				  getsockname(s->fd, (struct sockaddr *)&s->tuple.local, &ll) == 0;
			if (!ok)
				sv_dbg("fd %d: the non-blocking connect failed", s->fd);
			pthread_mutex_unlock(&s->lock);
			if (ok)
				sv_upgrade_connect(s);
			else
				sv_stream_fallback(s, SV_FB_NO_ROUTE);
			*done = true; /* sv_upgrade_connect watches it again */
			return 0;
		}
		pthread_mutex_unlock(&s->lock);
		return now + 5000; /* connects take round trips: look every 5 ms */
	}
	if (s->upgrade_at) {
		/* A client connection that waits out SOVIA_UPGRADE_DELAY_MS,
		 * or to ask again after "no listener" (upgrade.c). A close, a
		 * fork or exec (which call the upgrade off) or a broken
		 * connection in the meantime: no upgrade. */
		bool go = s->state == SV_CONN_TCP && !s->app_closed && !s->error;
		if (go && now < s->upgrade_at) {
			pthread_mutex_unlock(&s->lock);
			return s->upgrade_at;
		}
		s->upgrade_at = 0;
		pthread_mutex_unlock(&s->lock);
		if (go)
			sv_upgrade_connect_now(s);
		*done = true; /* the upgrade watches it again */
		return 0;
	}
	switch (s->state) {
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
		if (s->deadline_us && now >= s->deadline_us) {
			pthread_mutex_unlock(&s->lock);
			sv_stream_fallback(s, SV_FB_TIMEOUT);
			*done = true;
			return 0;
		}
		next = s->deadline_us;
		break;
	case SV_CONN_SWITCHING:
	case SV_CONN_RDMA: {
		bool active = app_active(s);
		if (active && !io->fired && app_drives(s)) {
			/* Its calls poll the CQ and run the timers: only look
			 * again later, without taking its completions. */
			io->idle = true;
			next = active_look(s, now, io);
			break;
		}
		if (io->fired && s->verbs)
			sv_verbs_drain_events(s->verbs);
		if (s->state == SV_CONN_RDMA && s->verbs)
			s->st.helper_polls++;
		sv_stream_progress(s);
		/* What we took from the CQ may be what a waiter (or a spinning
		 * call between its looks) waits for; its poll may also have
		 * lost the channel's event to us. */
		sv_stream_wake(s);
		/* The upgrade completes even if the application is not reading. */
		sv_stream_pump_tcp(s);
		if (s->tx_held && s->deadline_us && now >= s->deadline_us && !s->echo_owed)
			sv_stream_unhold(s, "timeout");
		if (s->state == SV_CONN_SWITCHING && s->deadline_us && now >= s->deadline_us &&
		    s->proto_ready && !s->proto.rx_on_qp && s->proto.tx_state == SV_TX_TCP &&
		    !s->proto.peer_to_rdma) {
			/* Connected, yet nothing moved: nothing in-band happened,
			 * so TCP can simply carry on. */
			pthread_mutex_unlock(&s->lock);
			sv_stream_fallback(s, SV_FB_TIMEOUT);
			*done = true;
			return 0;
		}
		if (s->app_closed) {
			next = sv_stream_linger(s, now, done);
			break;
		}
		if (app_drives(s)) {
			/* The helper stands in only while the application is
			 * idle; a wake-up that found it active does not re-arm. */
			io->idle = true;
			next = active ? active_look(s, now, io) : idle_watch(s, now, io);
			break;
		}
		next = s->proto_ready ? sv_proto_next_deadline(&s->proto, now) : 0;
		if (s->state == SV_CONN_SWITCHING) {
			/* A switch takes a few round trips whose completions do
			 * not wake the helper: look again every millisecond until
			 * it is over (bounded by the upgrade deadline). */
			if (!next || next > now + 1000)
				next = now + 1000;
		}
		break;
	}
	case SV_CONN_FALLBACK:
	case SV_CONN_BROKEN:
		if (s->app_closed)
			next = sv_stream_linger(s, now, done);
		else
			*done = true;
		break;
	case SV_CONN_DETACHING:
		/* The peer asked, or our application did and went on: finish
		 * giving back (the bytes may wait for TCP's buffer space). */
		sv_stream_progress(s);
		if (s->state == SV_CONN_DETACHING) {
			next = now + 1000;
			break;
		}
		if (s->state != SV_CONN_DETACHED) {
			*done = !s->app_closed;
			if (s->app_closed)
				next = sv_stream_linger(s, now, done);
			break;
		}
		next = sv_stream_detached_service(s, now, done);
		break;
	case SV_CONN_DETACHED:
		next = sv_stream_detached_service(s, now, done);
		break;
	}
	pthread_mutex_unlock(&s->lock);
	return next;
}

void sv_stream_connecting(struct sv_stream *s)
{
	if (sv_helper_start() < 0 || sv_helper_rdma_state() < 0) {
		sv_stream_fallback(s, sv_helper_no_rdma_reason());
		return;
	}
	pthread_mutex_lock(&s->lock);
	s->connecting = true;
	pthread_mutex_unlock(&s->lock);
	sv_helper_watch(s);
}

/* ---- Statistics -------------------------------------------------------- */

static void addr_str(const struct sockaddr_storage *ss, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
	}
	snprintf(out, len, "%s:%u", host, port);
}

void sv_stream_print_stats(struct sv_stream *s, const char *when)
{
	if (s->stats_printed)
		return;
	char local[64], peer[64], line[1536];
	addr_str(&s->tuple.local, local, sizeof(local));
	addr_str(&s->tuple.peer, peer, sizeof(peer));
	s->stats_printed = true;
	const struct sv_proto_stats *p = &s->proto.st;
	/* The device's registration cache, shared by its connections. */
	struct sv_regcache_stats rc = {0};
	if (s->verbs)
		sv_verbs_regcache_stats(s->verbs, &rc);
	int n = snprintf(
		line, sizeof(line),
		"libsovia stats [%s] %s -> %s %s state=%s fallback=%s "
		"rdma_tx_bytes=%llu rdma_rx_bytes=%llu tcp_tx_bytes=%llu tcp_rx_bytes=%llu "
		"rdma_tx_msgs=%llu rdma_rx_msgs=%llu zcopy_tx_bytes=%llu credit_stalls=%llu "
		"acks_sent=%llu acks_piggybacked=%llu coalesced_writes=%llu collected_writes=%llu "
		"flushes=timer:%llu,full:%llu,large:%llu,recv:%llu,close:%llu,idle:%llu,nodelay:%llu "
		"switches=to_rdma:%llu,to_tcp:%llu gave_back_bytes=%llu got_back_bytes=%llu "
		"regcache=hits:%llu,misses:%llu,stale:%llu,uncached:%llu "
		"waits=spun:%llu,slept:%llu,slept_us:%llu,slept_max_us:%llu "
		"woken=chan:%llu,kick:%llu,timeout:%llu helper_polls=%llu spin_avg_us=%u\n",
		when, local, peer, s->is_client ? "client" : "server", sv_conn_state_name(s->state),
		sv_fallback_name(s->fallback), (unsigned long long)p->tx_bytes,
		(unsigned long long)p->rx_bytes, (unsigned long long)s->st.tcp_tx_bytes,
		(unsigned long long)s->st.tcp_rx_bytes, (unsigned long long)p->tx_msgs,
		(unsigned long long)p->rx_msgs, (unsigned long long)p->tx_zcopy_bytes,
		(unsigned long long)p->credit_stalls, (unsigned long long)p->updates_sent,
		(unsigned long long)p->acks_piggybacked, (unsigned long long)p->coalesced_writes,
		(unsigned long long)p->collected_writes,
		(unsigned long long)p->flushes_timer, (unsigned long long)p->flushes_full,
		(unsigned long long)p->flushes_large, (unsigned long long)p->flushes_recv,
		(unsigned long long)p->flushes_close, (unsigned long long)p->flushes_idle,
		(unsigned long long)p->flushes_nodelay, (unsigned long long)s->st.switches_to_rdma,
		(unsigned long long)s->st.switches_to_tcp,
		(unsigned long long)(s->proto.back_sent ? s->proto.ret_nxt - s->proto.back_x : 0),
		(unsigned long long)(s->proto.back_sent ? s->proto.owed_nxt - s->proto.peer_back_x : 0),
		(unsigned long long)rc.hits, (unsigned long long)rc.misses,
		(unsigned long long)rc.stale, (unsigned long long)rc.uncached,
		(unsigned long long)s->st.waits_spun, (unsigned long long)s->st.waits_slept,
		(unsigned long long)s->st.slept_us, (unsigned long long)s->st.slept_max_us,
		(unsigned long long)s->st.woken_chan, (unsigned long long)s->st.woken_kick,
		(unsigned long long)s->st.woken_timeout, (unsigned long long)s->st.helper_polls,
		(unsigned)atomic_load_explicit(&s->wait_avg_us, memory_order_relaxed));
	if (n > 0) {
		ssize_t w = SV_REAL(write)(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
		(void)w;
	}
}
