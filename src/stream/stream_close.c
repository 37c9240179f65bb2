/* Closing: the application's close() returns at once; the helper thread
 * delivers what is still queued, sends FIN, and closes the QP and the TCP
 * socket (SOVIA's close thread). Process exit pushes everything out. Also
 * the copies of a stream's fd (dup), which close does one at a time. */
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "ownfd.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

/* How long a closed connection may take to deliver its last bytes. */
#define SV_LINGER_US (30u * 1000000u)

/* A lingering close lives on a copy of the socket, the kernel's orphan
 * has none. Ours go above the application's range (sv_ownfd_base); when
 * none is free there, at most this many take numbers of the
 * application's range at once, so that a peer that keeps connections
 * lingering (withholding credits) cannot run the application out of fds.
 * Past that, a close is abortive, as the kernel resets orphans past its
 * own bound (tcp_max_orphans); it never waits for room. */
#define SV_LINGER_LOW_MAX 16
static atomic_int linger_low;

/* The fd the closed connection lingers on: 1 when it is the
 * application's own number (no other was free: the number is given back
 * when the linger ends, not at close), 0 for a copy, -EMFILE. */
static int keep_lingering(struct sv_stream *s)
{
	int keep = sv_ownfd_dup_above(s->fd);
	if (keep >= 0) {
		s->fd = keep;
		s->fd_private = true;
		return 0;
	}
	if (atomic_fetch_add(&linger_low, 1) >= SV_LINGER_LOW_MAX) {
		atomic_fetch_sub(&linger_low, 1);
		return -EMFILE;
	}
	s->cl.low_fd = true;
	s->fd_private = true;
	keep = sv_ownfd_dup(s->fd);
	if (keep < 0) {
		sv_ownfd_add(s->fd); /* kept from close-all loops, as ours are */
		return 1;
	}
	s->fd = keep;
	return 0;
}

/* The lingering copy is closed (with the lock). */
static void lingered(struct sv_stream *s)
{
	sv_ownfd_close(s->fd);
	s->fd = -1;
	if (s->cl.low_fd) {
		s->cl.low_fd = false;
		atomic_fetch_sub(&linger_low, 1);
	}
}

/* The stream's own copy of its socket: the application may close any of
 * its fds, or its only one, while the connection lives on. */
static int keep_private(struct sv_stream *s)
{
	int keep = sv_ownfd_dup(s->fd);
	if (keep < 0)
		return keep;
	s->fd = keep;
	s->fd_private = true;
	return 0;
}

int sv_stream_share(struct sv_stream *s)
{
	sv_lock(&s->lock);
	int r = s->fd_private ? 0 : keep_private(s);
	sv_unlock(&s->lock);
	return r;
}

void sv_stream_opened(struct sv_stream *s)
{
	sv_lock(&s->lock);
	s->opens++;
	sv_unlock(&s->lock);
}

/* Nothing of ours to finish: the kernel closes as usual. */
static int close_now(struct sv_stream *s, int r)
{
	int fd = s->fd;
	if (sv_cfg.stats)
		sv_stream_print_stats(s, "close");
	s->fd = -1;
	/* Judged under the lock: the helper's start_connect sets id and state
	 * under it. */
	bool helper_part = s->id || s->state == SV_CONN_RESOLVING ||
			   s->state == SV_CONN_REQUESTED || s->state == SV_CONN_DETACHED ||
			   s->up.connect_pending;
	sv_unlock(&s->lock);
	if (helper_part)
		sv_helper_watch(s); /* let the helper drop its part */
	if (SV_REAL(close)(fd) < 0 && r == 0)
		r = -errno;
	return r;
}

/* No descriptor for the connection to linger on (keep_lingering): what
 * it could deliver without waiting goes, then it ends abortively, the
 * peer seeing a reset if anything was left. Under the lock. */
static void close_abortive(struct sv_stream *s)
{
	s->cl.linger_deadline_us = 0;
	bool done = false;
	sv_stream_linger(s, sv_now_us(), &done);
}

int sv_stream_close(struct sv_stream *s, int appfd)
{
	sv_lock(&s->lock);
	int r = 0;
	if (s->fd != appfd && SV_REAL(close)(appfd) < 0)
		r = -errno; /* a copy: the stream has its own */
	if (s->opens > 1) {
		s->opens--; /* other copies keep the connection */
		sv_unlock(&s->lock);
		return r;
	}
	s->opens = 0;
	if (s->share) {
		/* A fork's child may hold a copy: it gets the connection. */
		sv_unlock(&s->lock);
		sv_copies->let_go(s, false);
		sv_lock(&s->lock);
	}
	s->cl.app_closed = true;
	if (s->share)
		sv_copies->closed(s);
	if (!s->proto || s->state == SV_CONN_FALLBACK || s->state == SV_CONN_DETACHED)
		return close_now(s, r);
	if (s->fd == appfd) {
		/* The application's fd number is free again at once; the
		 * connection lives on a private copy until it is finished. */
		int fd = s->fd;
		int k = keep_lingering(s);
		if (k == 1)
			sv_dbg("fd %d: no other descriptor free: it lingers on this one", fd);
		if (k < 0) {
			static atomic_bool told;
			if (!atomic_exchange(&told, true))
				sv_info("fd %d: no descriptor of libsovia's for a lingering close (%s): "
					"it ends at once, as an orphan past the kernel's bound does", fd,
					strerror(-k));
			close_abortive(s);
			sv_unlock(&s->lock);
			return r;
		}
		if (k == 0 && SV_REAL(close)(fd) < 0)
			r = -errno;
	}
	if (s->state == SV_CONN_SWITCHING)
		sv_info("fd %d: closed while switching to RDMA: the switch finishes first", appfd);
	s->cl.linger_deadline_us = sv_now_us() + SV_LINGER_US;
	sv_unlock(&s->lock);
	sv_helper_watch(s);
	return r;
}

/* Is everything of ours out, so the connection may end? */
static bool linger_finished(struct sv_stream *s, uint64_t now)
{
	struct sv_proto *p = s->proto;
	struct sv_clock clk = {.us = now, .source = sv_now_us};
	if (s->state == SV_CONN_DETACHING) {
		sv_stream_progress(s, &clk, 0);
		return s->state != SV_CONN_DETACHING;
	}
	if (s->state == SV_CONN_RESUMING) {
		sv_stream_progress(s, &clk, 0);
		if (s->state == SV_CONN_RESUMING)
			return false;
	}
	if (!sv_stream_resume_settled(s))
		return false;
	/* Resumed: TCP carries the rest, as the kernel's close does. */
	if (s->state == SV_CONN_BROKEN && s->fo.cause != SV_FO_NONE)
		return true;
	if (!p || s->state == SV_CONN_FALLBACK || s->state == SV_CONN_DETACHED || s->error)
		return true;
	sv_stream_progress(s, &clk, 0);
	if (s->state == SV_CONN_RESUMING)
		return false; /* that look found the QP lost */
	if (sv_proto_tx_state(p) == SV_TX_OPEN && !s->sw.tx_held)
		sv_proto_send_fin(p, &clk); /* -EAGAIN: try again after credits */
	bool delivered = sv_proto_sends_done(p) && !sv_proto_tx_pending(p);
	/* A switch under way finishes first (the helper pumps the peer's TCP
	 * bytes up to its echo): closed now, the peer's echo would find our
	 * socket closed or unread, and the kernel would answer with a reset
	 * instead of the FIN the peer must see. */
	return (sv_proto_tx_state(p) != SV_TX_OPEN || s->sw.tx_held) && delivered &&
	       !s->sw.echo_owed && s->state != SV_CONN_SWITCHING;
}

uint64_t sv_stream_linger(struct sv_stream *s, uint64_t now, bool *done)
{
	bool finished = linger_finished(s, now);
	if (!finished && now < s->cl.linger_deadline_us) {
		struct sv_clock clk = {.us = now, .source = sv_now_us};
		uint64_t next = s->proto ? sv_proto_next_deadline(s->proto, &clk) : 0;
		uint64_t tick = now + 10000; /* completions also wake us */
		return next && next < tick ? next : tick;
	}
	if (!finished)
		sv_info("fd %d: closing with data undelivered after the linger time", s->fd);
	sv_stream_kernel_shut(s);
	if (sv_cfg.stats)
		sv_stream_print_stats(s, "close");
	if (s->id && s->proto)
		sv_stream_cm_disconnect(s); /* the peer learns at once, not by timeout */
	if (s->fd >= 0) {
		if (!finished || s->error) {
			/* Like TCP's abortive close: the peer sees a reset. */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};
			SV_REAL(setsockopt)(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		}
		lingered(s);
	}
	*done = true;
	return 0;
}

/* A connection closed in the middle of its switch: let it finish, as its
 * lingering close would have (sv_stream_linger), for up to 2 s. */
static void exit_finish_switch(struct sv_stream *s, struct sv_clock *clk)
{
	uint64_t until = sv_clock_now(clk) + 2000000u;
	while (s->cl.app_closed && s->state == SV_CONN_SWITCHING && !s->error &&
	       sv_clock_update(clk) < until) {
		sv_stream_progress(s, clk, 0);
		sv_stream_pump_tcp(s);
		if (s->state == SV_CONN_SWITCHING)
			sv_stream_wait(s, clk, 0, clk->us + 1000, 0);
	}
}

/* Our sending on the QP: everything out, then the FIN of a connection the
 * application closed but the helper had not finished yet. A connection
 * left open (an inetd service: cat exits with the connection on its
 * stdin) ends too, as the kernel's close of the process's fds ends TCP:
 * this process is its only holder (a fork, an exec or SCM_RIGHTS takes a
 * connection on the QP back to TCP first), and the peer must see the end
 * of our stream, not a lost QP. Its FIN is sent only if a credit allows
 * now: the exit does not wait for peers that give none (they see the QP
 * lost, as before). The destructor runs before glibc flushes its FILEs;
 * ours were flushed first (sv_stdio_exit_flush). */
static void exit_finish_tx(struct sv_stream *s, struct sv_clock *clk)
{
	struct sv_proto *p = s->proto;
	if (!p || s->state == SV_CONN_FALLBACK || s->error || sv_proto_tx_state(p) != SV_TX_OPEN)
		return;
	sv_stream_drain(s);
	if (!s->cl.app_closed && s->state == SV_CONN_RDMA && !s->error &&
	    sv_proto_tx_state(p) == SV_TX_OPEN) {
		sv_stream_progress(s, clk, 0);
		(void)sv_proto_send_fin(p, clk);
	}
	uint64_t end = sv_clock_update(clk) + 2000000u;
	while (s->cl.app_closed && sv_proto_tx_state(p) == SV_TX_OPEN && !s->error &&
	       sv_clock_update(clk) < end) {
		sv_stream_progress(s, clk, 0);
		if (sv_proto_send_fin(p, clk) != -EAGAIN)
			break;
		sv_stream_wait(s, clk, 0, end, 0);
	}
	sv_stream_drain(s);
}

void sv_stream_exit_flush(struct sv_stream *s)
{
	if (s->share)
		sv_copies->let_go(s, true);
	sv_lock(&s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	exit_finish_switch(s, &clk);
	exit_finish_tx(s, &clk);
	uint64_t end = sv_clock_update(&clk) + 5000000u;
	/* The way back, or resuming over TCP after a lost QP: the bytes given
	 * back, or kept, go out before the process ends. */
	while ((s->state == SV_CONN_DETACHING || s->state == SV_CONN_RESUMING) && !s->error &&
	       sv_clock_update(&clk) < end) {
		sv_stream_progress(s, &clk, 0);
		if (s->state == SV_CONN_DETACHING || s->state == SV_CONN_RESUMING)
			sv_stream_wait(s, &clk, POLLOUT, clk.us + 10000, 0);
	}
	if (sv_cfg.stats && !s->st.printed)
		sv_stream_print_stats(s, "exit");
	sv_unlock(&s->lock);
}
