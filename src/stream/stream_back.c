/* The way back: an upgraded connection becomes plain TCP again, with nothing
 * held by libsovia, so that a call libsovia cannot serve (fork, exec,
 * SCM_RIGHTS, ...) can go straight to the kernel and be right.
 *
 * Both ends send BACK over the QP: "my bytes went over the QP up to here;
 * your application consumed X of yours". Each gives the other back, in
 * RETURN messages, the bytes its application has not read, and each writes
 * what came back on TCP before anything new. Afterwards each direction runs
 * on TCP from exactly where its reader stands. docs/protocol.md, section
 * 10, has the details. */
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "real.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

/* How long a detached stream keeps its QP, so that the peer's last
 * completions arrive before the QP goes. */
#define SV_DETACH_GRACE_US 2000000u

/* May our BACK go now? Only with both directions settled on the QP: a
 * switch in progress (a TO_RDMA not yet verified, our echo not yet written)
 * must finish first, since its echo sits in the TCP stream. */
static bool back_ready(const struct sv_stream *s)
{
	return s->proto && !s->error && sv_proto_back_ready(s->proto) && !s->sw.tx_held &&
	       !s->sw.echo_owed && !s->sw.chal_len;
}

static int send_back(struct sv_stream *s)
{
	/* The peer's TCP bytes we read but the application did not: they go
	 * back first. */
	struct sv_clock clk = SV_CLOCK_INIT;
	bool peer_first = sv_proto_back_wanted(s->proto);
	int r = sv_proto_send_back(s->proto, s->tcpbuf.buf ? s->tcpbuf.buf + s->tcpbuf.off : NULL,
				   sv_stream_tcpbuf_held(s), &clk);
	if (r < 0)
		return r;
	s->tcpbuf.off = s->tcpbuf.len = 0;
	s->back_wanted = false;
	sv_stream_set_state(s, SV_CONN_DETACHING);
	/* From here on the kernel's socket carries both directions' next
	 * bytes: its counts now are where a second life counts from. */
	if (s->share)
		sv_copies->back(s, peer_first);
	s->cl.back_deadline_us = sv_clock_now(&clk) + SV_PEER_SILENCE_US;
	s->st.switches_to_tcp++;
	sv_helper_watch(s); /* it finishes the exchange if nobody calls in */
	sv_dbg("fd %d: BACK sent", s->fd);
	return 0;
}

void sv_stream_kernel_shut(struct sv_stream *s)
{
	/* A failed connection was reset: no clean end on TCP. */
	if (!s->cl.shut_deferred || s->sw.echo_owed || s->fd < 0 || s->error)
		return;
	bool on_qp = s->proto && !s->error &&
		     (s->state == SV_CONN_RDMA || s->state == SV_CONN_SWITCHING ||
		      s->state == SV_CONN_DETACHING) &&
		     sv_proto_tx_state(s->proto) != SV_TX_TCP;
	if (on_qp || s->state == SV_CONN_RESUMING)
		return; /* resuming: our bytes the peer lacks go first */
	s->cl.shut_deferred = false;
	SV_REAL(shutdown)(s->fd, SHUT_WR);
}

/* What came back goes on TCP first, in order, as it arrives. */
bool sv_stream_write_owed(struct sv_stream *s)
{
	const void *buf;
	size_t len;
	sv_proto_owed(s->proto, &buf, &len);
	while (len) {
		ssize_t n = SV_REAL(send)(s->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return false;
			s->error = -errno;
			sv_warn("fd %d: writing our owed bytes on TCP: %s", s->fd,
				strerror(errno));
			sv_stream_wake(s);
			return false;
		}
		sv_proto_owed_consume(s->proto, (size_t)n);
		sv_proto_owed(s->proto, &buf, &len);
	}
	return true;
}

void sv_stream_back_progress(struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	if (!p || s->error)
		return;
	if ((sv_proto_back_wanted(p) || s->back_wanted) && back_ready(s)) {
		int r = send_back(s);
		if (r < 0 && r != -EAGAIN) {
			sv_stream_break(s, r);
			return;
		}
	}
	if (s->state != SV_CONN_DETACHING)
		return;
	struct sv_clock clk = SV_CLOCK_INIT;
	int r = sv_proto_send_returns(p, &clk);
	if (r < 0 && r != -EAGAIN) {
		sv_stream_break(s, r);
		return;
	}
	if (!sv_stream_write_owed(s) || !sv_proto_back_done(p))
		return;
	if (s->share)
		sv_copies->detached(s);
	sv_stream_set_state(s, SV_CONN_DETACHED);
	s->cl.linger_deadline_us = sv_clock_now(&clk) + SV_DETACH_GRACE_US;
	sv_stream_kernel_shut(s);
	const struct sv_proto_stats *st = sv_proto_stats(p);
	sv_info("fd %d is plain TCP again (gave back %llu bytes, got back %llu)", s->fd,
		(unsigned long long)st->gave_back, (unsigned long long)st->got_back);
	if (sv_cfg.stats)
		sv_stream_print_stats(s, "detach");
	sv_stream_wake(s);
	sv_helper_watch(s); /* it ends the QP after a grace period */
}

bool sv_stream_back_overdue(struct sv_stream *s, uint64_t now)
{
	if (s->state != SV_CONN_DETACHING || !s->proto || sv_proto_back_done(s->proto) ||
	    now < s->cl.back_deadline_us)
		return false;
	sv_warn("fd %d: the peer did not give back what it holds in %u s: the connection is "
		"reset", s->fd, SV_PEER_SILENCE_US / 1000000u);
	sv_stream_break(s, -ETIMEDOUT);
	return true;
}

/* One step of the way back in the current state. 1: done (r says how),
 * 0: wait and look again. */
static int detach_step(struct sv_stream *s, int *r, bool *wait_tcp_out, bool fork,
		       const char *call)
{
	switch (s->state) {
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
		if (s->proto)
			return 0; /* a QP exists: let the switch settle first */
		if (fork && s->share && sv_copies->fork_hand(s)) {
			sv_info("fd %d: handed to the fork's child before its upgrade", s->fd);
			s->fallback = SV_FB_HANDED;
			sv_stream_fall_back(s, SV_FB_HANDED);
			break;
		}
		/* No QP yet: the upgrade is simply called off (a request that
		 * comes later finds no TCP stream). A connection handed to us
		 * leaves the holders' table: the owner redirects no more. */
		if (s->share)
			sv_copies->called_off(s);
		sv_info("fd %d: upgrade called off by %s, a call libsovia does not serve", s->fd,
			call);
		sv_stream_unserved(s, call);
		break;
	case SV_CONN_SWITCHING:
		return 0;
	case SV_CONN_RDMA:
		if (back_ready(s)) {
			*r = send_back(s);
			if (*r < 0 && *r != -EAGAIN)
				return 1;
			*r = 0;
		}
		return 0;
	case SV_CONN_DETACHING:
		sv_stream_back_progress(s);
		*wait_tcp_out = true;
		return 0;
	case SV_CONN_DETACHED:
		*r = 0;
		return 1;
	case SV_CONN_RESUMING:
		*wait_tcp_out = true;
		return 0; /* then broken: TCP carries both directions */
	case SV_CONN_FALLBACK:
	case SV_CONN_BROKEN:
		/* TCP carries both directions (or the connection is dead and the
		 * kernel's socket will say so); bytes we read ahead from TCP
		 * cannot be put back. */
		if (sv_stream_tcpbuf_held(s) ||
		    (s->proto && !s->error && sv_proto_readable(s->proto) > 0)) {
			*r = -EBUSY;
		} else {
			if (s->state == SV_CONN_FALLBACK && s->fallback == SV_FB_NONE) {
				s->fallback = SV_FB_UNSUPPORTED;
				s->unserved = call;
			}
			sv_stream_kernel_shut(s);
			*r = 0;
		}
		return 1;
	case SV_CONN_NSTATES:
		break;
	}
	return 0;
}

/* away: the application's fd becomes the kernel's (the caller hands it on),
 * so the connection gets no second life here (not parked, not handed). */
static int detach(struct sv_stream *s, bool fork, bool away, const char *call)
{
	sv_lock(&s->lock);
	bool escaped = s->escaped;
	/* Before the BACK: a request that comes once it is detached, before
	 * our caller returns, must not revive it, nor be refused for good
	 * before a fork could hand it to its child. */
	s->escaped = escaped || away;
	struct sv_clock clk = SV_CLOCK_INIT;
	uint64_t deadline = sv_upgrade_deadline(sv_clock_now(&clk));
	int r = 0;
	for (;;) {
		bool wait_tcp_out = false;
		if (s->proto && !s->error)
			sv_stream_progress(s, &clk, 0);
		if (detach_step(s, &r, &wait_tcp_out, fork, call))
			break;
		if (s->state == SV_CONN_DETACHED || s->state == SV_CONN_FALLBACK)
			continue;
		if (s->error) {
			r = s->error;
			break;
		}
		if (sv_stream_back_overdue(s, sv_clock_update(&clk)))
			continue; /* broken: the error ends it */
		if (clk.us >= deadline) {
			r = -ETIMEDOUT;
			break;
		}
		/* Interrupted by a signal: the call we serve goes on regardless. */
		(void)sv_stream_wait(s, &clk, wait_tcp_out ? POLLOUT : 0, clk.us + 10000, 0);
	}
	if (r < 0) {
		s->escaped = escaped;
		sv_warn("fd %d: cannot go back to plain TCP (%s, state %s): libsovia keeps it",
			s->fd, strerror(-r), sv_conn_state_name(s->state));
	}
	sv_unlock(&s->lock);
	return r;
}

int sv_stream_detach(struct sv_stream *s, const char *call)
{
	return detach(s, false, true, call);
}

int sv_stream_detach_for_copies(struct sv_stream *s)
{
	return detach(s, false, false, "fork(copy-used)");
}

int sv_stream_detach_for_fork(struct sv_stream *s, bool away)
{
	return detach(s, true, away, "fork");
}

uint64_t sv_stream_detached_service(struct sv_stream *s, uint64_t now, bool *done)
{
	if (now < s->cl.linger_deadline_us)
		return s->cl.linger_deadline_us;
	if (s->id && s->proto)
		sv_stream_cm_disconnect(s);
	*done = true;
	return 0;
}
