/* The way back: an upgraded connection becomes plain TCP again, with nothing
 * held by libsovia, so that a call libsovia cannot serve (fork, exec, epoll,
 * dup, sendfile, ...) can go straight to the kernel and be right.
 *
 * Both ends send BACK over the QP: "my bytes went over the QP up to here;
 * your application consumed X of yours". Each gives the other back, in
 * RETURN messages, the bytes its application has not read, and each writes
 * what came back on TCP before anything new. Afterwards each direction runs
 * on TCP from exactly where its reader stands. docs/protocol.md, section 7,
 * has the details. */
#include "real.h"
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "verbs.h"

#include <errno.h>
#include <rdma/rdma_cma.h>
#include <string.h>
#include <sys/socket.h>

/* How long a detached stream keeps its QP, so that the peer's last
 * completions arrive before the QP goes. */
#define SV_DETACH_GRACE_US 2000000u

/* May our BACK go now? Only with both directions settled on the QP: a
 * switch in progress (a TO_RDMA not yet verified, our echo not yet written)
 * must finish first, since its echo sits in the TCP stream. */
static bool back_ready(const struct sv_stream *s)
{
	const struct sv_proto *p = &s->proto;
	return s->proto_ready && !s->error && p->rx_on_qp && !p->peer_to_rdma &&
	       !p->rx_switch_pending && (p->tx_state == SV_TX_OPEN || p->tx_state == SV_TX_FIN) &&
	       !s->tx_held && !s->echo_owed && !s->chal_len;
}

static int send_back(struct sv_stream *s)
{
	/* The peer's TCP bytes we read but the application did not: they go
	 * back first. */
	size_t pre = s->tcpbuf_len - s->tcpbuf_off;
	int r = sv_proto_send_back(&s->proto, s->tcpbuf ? s->tcpbuf + s->tcpbuf_off : NULL, pre,
				   sv_now_us());
	if (r < 0)
		return r;
	s->tcpbuf_off = s->tcpbuf_len = 0;
	s->state = SV_CONN_DETACHING;
	s->st.switches_to_tcp++;
	sv_helper_watch(s); /* it finishes the exchange if nobody calls in */
	sv_dbg("fd %d: BACK sent (our stream ends on the QP at %llu, we read %llu)", s->fd,
	       (unsigned long long)s->proto.back_seq, (unsigned long long)s->proto.back_x);
	return 0;
}

void sv_stream_kernel_shut(struct sv_stream *s)
{
	if (!s->shut_deferred || s->echo_owed || s->fd < 0)
		return;
	bool on_qp = s->proto_ready && !s->error &&
		     (s->state == SV_CONN_RDMA || s->state == SV_CONN_SWITCHING ||
		      s->state == SV_CONN_DETACHING) &&
		     s->proto.tx_state != SV_TX_TCP;
	if (on_qp)
		return;
	s->shut_deferred = false;
	SV_REAL(shutdown)(s->fd, SHUT_WR);
}

void sv_stream_back_progress(struct sv_stream *s)
{
	struct sv_proto *p = &s->proto;
	if (!s->proto_ready || s->error)
		return;
	if (sv_proto_back_wanted(p) && back_ready(s)) {
		int r = send_back(s);
		if (r < 0 && r != -EAGAIN) {
			sv_stream_break(s, r);
			return;
		}
	}
	if (s->state != SV_CONN_DETACHING)
		return;
	int r = sv_proto_send_returns(p, sv_now_us());
	if (r < 0 && r != -EAGAIN) {
		sv_stream_break(s, r);
		return;
	}
	/* What came back goes on TCP first, in order, as it arrives. */
	const void *buf;
	size_t len;
	sv_proto_owed(p, &buf, &len);
	while (len) {
		ssize_t n = SV_REAL(send)(s->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				break;
			s->error = -errno;
			sv_warn("fd %d: writing the bytes given back on TCP: %s", s->fd,
				strerror(errno));
			sv_stream_wake(s);
			return;
		}
		sv_proto_owed_consume(p, (size_t)n);
		sv_proto_owed(p, &buf, &len);
	}
	if (len || !sv_proto_back_done(p))
		return;
	s->state = SV_CONN_DETACHED;
	s->linger_deadline_us = sv_now_us() + SV_DETACH_GRACE_US;
	sv_stream_kernel_shut(s);
	sv_info("fd %d is plain TCP again (gave back %llu bytes, got back %llu)", s->fd,
		(unsigned long long)(p->peer_back_seq - p->back_x),
		(unsigned long long)(p->back_seq - p->peer_back_x));
	if (sv_cfg.stats)
		sv_stream_print_stats(s, "detach");
	sv_stream_wake(s);
	sv_helper_watch(s); /* it ends the QP after a grace period */
}

int sv_stream_detach(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	struct sv_proto *p = &s->proto;
	uint64_t deadline = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	int r = 0;
	for (;;) {
		bool wait_tcp_out = false;
		if (s->proto_ready && !s->error)
			sv_stream_progress(s);
		switch (s->state) {
		case SV_CONN_TCP:
		case SV_CONN_RESOLVING:
		case SV_CONN_REQUESTED:
			if (!s->proto_ready) {
				/* No QP yet: the upgrade is simply called off (a
				 * request that comes later finds no TCP stream). */
				sv_info("fd %d: upgrade called off (a call libsovia does not serve)",
					s->fd);
				s->state = SV_CONN_FALLBACK;
				s->fallback = SV_FB_UNSUPPORTED;
				sv_stream_wake(s);
				continue;
			}
			break; /* a QP exists: let the switch settle first */
		case SV_CONN_SWITCHING:
			break;
		case SV_CONN_RDMA:
			if (back_ready(s)) {
				r = send_back(s);
				if (r < 0 && r != -EAGAIN)
					goto out;
				r = 0;
			}
			break;
		case SV_CONN_DETACHING:
			sv_stream_back_progress(s);
			if (s->error) {
				r = s->error;
				goto out;
			}
			wait_tcp_out = true;
			break;
		case SV_CONN_DETACHED:
			r = 0;
			goto out;
		case SV_CONN_FALLBACK:
		case SV_CONN_BROKEN:
			/* TCP carries both directions (or the connection is dead and
			 * the kernel's socket will say so); bytes we read ahead from
			 * TCP cannot be put back. */
			if (s->tcpbuf_len != s->tcpbuf_off ||
			    (s->proto_ready && !s->error && sv_proto_readable(p) > 0)) {
				r = -EBUSY;
			} else {
				if (s->state == SV_CONN_FALLBACK && s->fallback == SV_FB_NONE)
					s->fallback = SV_FB_UNSUPPORTED;
				sv_stream_kernel_shut(s);
				r = 0;
			}
			goto out;
		}
		if (s->state == SV_CONN_DETACHED)
			continue;
		if (s->error) {
			r = s->error;
			goto out;
		}
		if (sv_now_us() >= deadline) {
			r = -ETIMEDOUT;
			goto out;
		}
		/* Interrupted by a signal: the call we serve goes on regardless. */
		(void)sv_stream_wait(s, wait_tcp_out ? POLLOUT : 0, sv_now_us() + 10000);
	}
out:
	if (r < 0)
		sv_warn("fd %d: cannot go back to plain TCP (%s, state %s): libsovia keeps it",
			s->fd, strerror(-r), sv_conn_state_name(s->state));
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* The helper's part once detached: end the QP after the grace period. */
uint64_t sv_stream_detached_service(struct sv_stream *s, uint64_t now, bool *done)
{
	if (now < s->linger_deadline_us)
		return s->linger_deadline_us;
	if (s->id && s->proto_ready)
		sv_upgrade_disconnect(s);
	*done = true;
	return 0;
}
