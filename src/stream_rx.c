/* The stream's receive path: TCP bytes up to the peer's switch point, its
 * challenge echo, then the QP; and back to TCP after a TO_TCP. */
#include "real.h"
#include "stream_int.h"

#include "log.h"
#include "verbs.h"

#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

/* The RDMA peer is not the TCP peer (or announced something the TCP
 * stream contradicts): drop the QP. The TCP stream is untouched: what we
 * took for an echo is the TCP peer's data and goes back in front. */
static void challenge_failed(struct sv_stream *s, const char *why)
{
	sv_warn("fd %d: the RDMA peer failed the challenge (%s); the connection stays on TCP",
		s->fd, why);
	sv_proto_send_reset(&s->proto);
	s->proto.peer_to_rdma = false;
	s->state = SV_CONN_FALLBACK;
	s->fallback = SV_FB_CHALLENGE;
	if (sv_stream_tcpbuf_append(s, s->chal_got, s->chal_len) < 0)
		sv_stream_break(s, -ENOMEM);
	s->chal_len = 0;
	sv_stream_wake(s);
}

/* The peer's echo is complete: is it our challenge? */
static void check_echo(struct sv_stream *s)
{
	if (memcmp(s->chal_got, s->my_challenge, SV_CHALLENGE_SIZE) != 0) {
		challenge_failed(s, "wrong echo");
		return;
	}
	s->chal_len = 0;
	if (s->qp_lost) {
		/* A real echo, but its QP is gone: TCP carries on after it. */
		s->proto.peer_to_rdma = false;
		s->state = SV_CONN_FALLBACK;
		s->fallback = SV_FB_QP_LOST;
		sv_stream_wake(s);
		return;
	}
	if (sv_proto_rx_accept(&s->proto) < 0) {
		sv_stream_break(s, -ECONNRESET);
		return;
	}
	sv_stream_rx_switched(s);
}

/* Bytes of iov [off, off+n) into dst. */
static void iov_copy_out(const struct iovec *iov, int iovcnt, size_t off, uint8_t *dst, size_t n)
{
	for (int i = 0; i < iovcnt && n; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t take = iov[i].iov_len - off < n ? iov[i].iov_len - off : n;
		memcpy(dst, (uint8_t *)iov[i].iov_base + off, take);
		dst += take;
		n -= take;
		off = 0;
	}
}

/* Limit an iovec to n bytes (into out, at most 64 entries). */
static int iov_limit(const struct iovec *iov, int iovcnt, size_t n, struct iovec *out)
{
	int k = 0;
	for (int i = 0; i < iovcnt && n && k < 64; i++) {
		size_t take = iov[i].iov_len < n ? iov[i].iov_len : n;
		out[k].iov_base = iov[i].iov_base;
		out[k].iov_len = take;
		n -= take;
		k++;
	}
	return k;
}

long sv_stream_tcp_read(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct sv_proto *p = &s->proto;
	bool watch = s->proto_ready && sv_stream_may_switch(s);
	if (!sv_stream_may_switch(s)) {
		/* No switch can come any more. */
		struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
		ssize_t r = SV_REAL(recvmsg)(s->fd, &m, flags | MSG_DONTWAIT);
		if (r > 0 && !(flags & MSG_PEEK)) {
			s->tcp_rx += (uint64_t)r;
			s->st.tcp_rx_bytes += (uint64_t)r;
		}
		return r < 0 ? -errno : r;
	}

	if (watch && p->peer_to_rdma && p->peer_to_rdma_seq < s->tcp_rx) {
		/* The real peer cannot have sent fewer bytes than we read. */
		challenge_failed(s, "switch point behind the TCP stream");
		return -EAGAIN;
	}
	if (watch && p->peer_to_rdma && s->tcp_rx == p->peer_to_rdma_seq) {
		/* At the switch point: what follows is the echo, then nothing. */
		ssize_t r = SV_REAL(recv)(s->fd, s->chal_got + s->chal_len, SV_CHALLENGE_SIZE - s->chal_len,
				 MSG_DONTWAIT);
		if (r == 0) {
			challenge_failed(s, "TCP ended before the echo");
			return -EAGAIN;
		}
		if (r < 0)
			return -errno;
		s->chal_len += (uint32_t)r;
		if (s->chal_len == SV_CHALLENGE_SIZE)
			check_echo(s);
		return -EAGAIN; /* no application bytes; the caller looks again */
	}

	size_t want = 0;
	for (int i = 0; i < iovcnt; i++)
		want += iov[i].iov_len;
	struct iovec lim[64];
	int limcnt = iovcnt;
	const struct iovec *use = iov;
	if (watch && p->peer_to_rdma) {
		uint64_t left = p->peer_to_rdma_seq - s->tcp_rx;
		if (left < want) {
			limcnt = iov_limit(iov, iovcnt, (size_t)left, lim);
			use = lim;
		}
	}
	bool announced = watch && p->peer_to_rdma;
	struct msghdr m = {.msg_iov = (struct iovec *)use, .msg_iovlen = (size_t)limcnt};
	ssize_t r = SV_REAL(recvmsg)(s->fd, &m, flags | MSG_DONTWAIT);
	if (r < 0)
		return -errno;
	if (r == 0) {
		/* TCP ended without the server's switch: it cannot prove
		 * itself any more, so we stop waiting for it. */
		if (s->tx_held && !s->echo_owed)
			sv_stream_unhold(s, "TCP ended");
		return 0;
	}

	/* Read first, then look at the completion queue: the peer writes its
	 * echo only after its TO_RDMA completed, so if these bytes include the
	 * echo, the TO_RDMA is visible now. */
	if (watch && !announced && s->verbs) {
		sv_stream_progress(s);
		if (p->peer_to_rdma && p->peer_to_rdma_seq < s->tcp_rx) {
			challenge_failed(s, "switch point behind the TCP stream");
		} else if (p->peer_to_rdma) {
			uint64_t left = p->peer_to_rdma_seq - s->tcp_rx;
			if ((uint64_t)r > left) {
				size_t extra = (size_t)r - (size_t)left;
				if (flags & MSG_PEEK) {
					r = (ssize_t)left; /* the echo stays in the socket */
				} else if (extra > SV_CHALLENGE_SIZE) {
					/* More than an echo after the switch point: the
					 * announcement did not come from the TCP peer.
					 * Everything read is the application's. */
					challenge_failed(s, "data beyond the switch point");
				} else {
					iov_copy_out(use, limcnt, (size_t)left, s->chal_got, extra);
					s->chal_len = (uint32_t)extra;
					r = (ssize_t)left;
					if (s->chal_len == SV_CHALLENGE_SIZE)
						check_echo(s);
				}
			}
		}
	}
	if (!(flags & MSG_PEEK)) {
		s->tcp_rx += (uint64_t)r;
		s->st.tcp_rx_bytes += (uint64_t)r;
	}
	return r ? r : -EAGAIN;
}

/* Copy from the pump's buffer. */
static long from_tcpbuf(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags)
{
	size_t avail = s->tcpbuf_len - s->tcpbuf_off, done = 0;
	for (int i = 0; i < iovcnt && done < avail; i++) {
		size_t n = iov[i].iov_len < avail - done ? iov[i].iov_len : avail - done;
		memcpy(iov[i].iov_base, s->tcpbuf + s->tcpbuf_off + done, n);
		done += n;
	}
	if (!(flags & MSG_PEEK)) {
		s->tcpbuf_off += done;
		if (s->tcpbuf_off == s->tcpbuf_len)
			s->tcpbuf_off = s->tcpbuf_len = 0;
	}
	return (long)done;
}

/* One receive: what is there, or (blocking) the first bytes that come. */
static long recv_some(struct sv_stream *s, struct msghdr *msg, int flags)
{
	const struct iovec *iov = msg->msg_iov;
	int iovcnt = (int)msg->msg_iovlen;
	size_t want = 0;
	for (int i = 0; i < iovcnt; i++)
		want += iov[i].iov_len;
	/* A stream socket has no source address or ancillary data to give. */
	msg->msg_namelen = 0;
	msg->msg_controllen = 0;
	msg->msg_flags = 0;
	if (flags & MSG_OOB)
		return -EINVAL;

	pthread_mutex_lock(&s->lock);
	s->app_calls++;
	bool tcp_for_good = s->state == SV_CONN_FALLBACK || s->state == SV_CONN_DETACHING ||
			    s->state == SV_CONN_DETACHED;
	if (tcp_for_good && s->tcpbuf_len == s->tcpbuf_off) {
		/* TCP for good: the kernel's own call, blocking as it likes. */
		pthread_mutex_unlock(&s->lock);
		ssize_t n = SV_REAL(recvmsg)(s->fd, msg, flags);
		if (n > 0 && !(flags & MSG_PEEK))
			__atomic_fetch_add(&s->st.tcp_rx_bytes, (uint64_t)n, __ATOMIC_RELAXED);
		return n < 0 ? -errno : n;
	}
	long r;
	uint64_t timeout_at = 0; /* SO_RCVTIMEO: from the first wait on */
	uint64_t waited_at = 0;  /* the clock at the end of the last wait */
	bool drained = false;    /* that wait emptied the CQ (it returned 1) */
	for (;;) {
		if (s->tcpbuf_len > s->tcpbuf_off && want) {
			r = from_tcpbuf(s, iov, iovcnt, flags);
			break;
		}
		struct sv_proto *p = &s->proto;
		/* The clock only if a timer or the wait needs it. */
		uint64_t now = waited_at ? waited_at : SV_NOW_UNREAD;
		waited_at = 0;
		if (s->proto_ready && !s->error) {
			if (drained)
				sv_stream_progress_drained(s, now);
			else
				sv_stream_progress_at(s, now);
		}
		drained = false;
		if (s->proto_ready && p->rx_on_qp && !p->back_sent) {
			r = sv_proto_recv(p, iov, iovcnt, flags, now);
			if (r < 0 && r != -EAGAIN && p->error) {
				if (!s->error)
					sv_stream_break(s, p->error);
				r = sv_stream_app_error(s, false);
			}
			if (r >= 0 || (r != -EAGAIN))
				break;
			if (!p->rx_on_qp || p->back_sent) {
				s->st.switches_to_tcp += !p->back_sent;
				continue; /* the rest comes from TCP */
			}
		} else {
			/* SOVIA: a receive call pushes out coalesced writes. */
			if (s->proto_ready && p->pending_slot >= 0)
				sv_proto_flush(p, SV_FLUSH_RECV, now);
			if (s->error) {
				r = sv_stream_app_error(s, false);
				break;
			}
			r = sv_stream_tcp_read(s, iov, iovcnt, flags);
			if (r >= 0 || r != -EAGAIN)
				break;
			if (s->proto_ready && p->rx_on_qp && !p->back_sent)
				continue; /* the challenge just moved us to the QP */
		}
		if (s->error && !(s->proto_ready && sv_proto_readable(p))) {
			r = sv_stream_app_error(s, false);
			break;
		}
		if (!sv_stream_blocking(s, flags)) {
			r = -EAGAIN;
			break;
		}
		if (sv_stream_timed_out(s->rcvtimeo_us, &timeout_at)) {
			r = -EAGAIN;
			break;
		}
		bool on_tcp = !(s->proto_ready && p->rx_on_qp && !p->back_sent);
		if (now == SV_NOW_UNREAD)
			now = sv_now_us();
		int w = sv_stream_app_wait(s, on_tcp ? POLLIN : 0, timeout_at, &now);
		waited_at = now;
		drained = w > 0;
		if (w < 0) {
			r = w;
			break;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (r > 0 && !(flags & MSG_PEEK)) /* what we wrote got its answer */
		atomic_store_explicit(&s->writes_seen,
				      atomic_load_explicit(&s->writes, memory_order_relaxed),
				      memory_order_relaxed);
	return r;
}

long sv_stream_recvmsg(struct sv_stream *s, struct msghdr *msg, int flags)
{
	if (!(flags & MSG_WAITALL) || (flags & MSG_PEEK))
		return recv_some(s, msg, flags);
	/* MSG_WAITALL: until the buffer is full, the end, an error, a signal
	 * or a timeout; what came before one of those is the result. */
	size_t want = 0, got = 0;
	for (size_t i = 0; i < msg->msg_iovlen; i++)
		want += msg->msg_iov[i].iov_len;
	for (;;) {
		struct iovec rest[64];
		struct msghdr m = *msg;
		m.msg_iov = rest;
		m.msg_iovlen = (size_t)sv_iov_advance(msg->msg_iov, (int)msg->msg_iovlen, got, rest);
		long r = recv_some(s, &m, flags & ~MSG_WAITALL);
		msg->msg_flags = m.msg_flags;
		if (r <= 0)
			return got ? (long)got : r;
		got += (size_t)r;
		if (got >= want)
			return (long)got;
	}
}

long sv_stream_inq(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->proto_ready && !s->error)
		sv_stream_progress(s);
	long n = (long)(s->tcpbuf_len - s->tcpbuf_off);
	bool rx_qp = s->proto_ready && s->proto.rx_on_qp && !s->proto.back_sent && !s->error;
	if (rx_qp) {
		n += (long)sv_proto_readable(&s->proto);
	} else if (!s->proto_ready || !s->proto.peer_to_rdma) {
		/* TCP carries it: the kernel's count (during a switch it may
		 * hold the echo, which is not data). */
		int k = 0;
		if (SV_REAL(ioctl)(s->fd, FIONREAD, &k) < 0) {
			n = -errno;
		} else {
			n += k;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

void sv_stream_pump_tcp(struct sv_stream *s)
{
	if (!s->proto_ready || !s->proto.peer_to_rdma || s->error)
		return;
	static __thread uint8_t scratch[65536];
	for (;;) {
		struct iovec iov = {scratch, sizeof(scratch)};
		size_t before = s->tcpbuf_len;
		long n = sv_stream_tcp_read(s, &iov, 1, 0);
		if (n <= 0)
			return;
		/* A failed challenge may have queued the would-be echo, which
		 * comes after these bytes in the stream. */
		size_t echo = s->tcpbuf_len - before;
		uint8_t held[SV_CHALLENGE_SIZE];
		memcpy(held, s->tcpbuf + before, echo);
		s->tcpbuf_len = before;
		if (sv_stream_tcpbuf_append(s, scratch, (size_t)n) < 0 ||
		    sv_stream_tcpbuf_append(s, held, echo) < 0) {
			sv_stream_break(s, -ENOMEM);
			return;
		}
		sv_stream_wake(s);
	}
}
