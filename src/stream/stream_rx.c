/* The stream's receive path: TCP bytes up to the peer's switch point, its
 * challenge echo, then the QP; and back to TCP after a TO_TCP. */
#include "stream_int.h"

#include "bytebuf.h"
#include "guard.h"
#include "iov.h"
#include "log.h"
#include "real.h"

#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

int sv_stream_tcpbuf_append(struct sv_stream *s, const void *data, size_t len)
{
	return sv_bytes_append(&s->tcpbuf.buf, &s->tcpbuf.len, &s->tcpbuf.cap, data, len);
}

/* TCP read while no switch can come any more. */
static long plain_read(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
	ssize_t r = SV_REAL(recvmsg)(s->fd, &m, flags | MSG_DONTWAIT);
	if (r > 0 && !(flags & MSG_PEEK)) {
		s->tcp_rx += (uint64_t)r;
		s->st.tcp_rx_bytes += (uint64_t)r;
		sv_copies_moved(s);
	}
	return r < 0 ? -errno : r;
}

/* At the peer's switch point: what follows is its echo, then nothing. */
static long read_echo(struct sv_stream *s)
{
	ssize_t r = SV_REAL(recv)(s->fd, s->sw.chal_got + s->sw.chal_len,
				  SV_CHALLENGE_SIZE - s->sw.chal_len, MSG_DONTWAIT);
	if (r == 0) {
		sv_stream_challenge_failed(s, "TCP ended before the echo");
		return -EAGAIN;
	}
	if (r < 0)
		return -errno;
	s->sw.chal_len += (uint32_t)r;
	if (s->sw.chal_len == SV_CHALLENGE_SIZE)
		sv_stream_check_echo(s);
	return -EAGAIN; /* no application bytes; the caller looks again */
}

/* Read first, then look at the completion queue: the peer writes its echo
 * only after its TO_RDMA completed, so if the r bytes just read include
 * the echo, the TO_RDMA is visible now. Returns the application's bytes. */
static long after_unannounced_read(struct sv_stream *s, const struct iovec *use, int usecnt,
				   int flags, long r)
{
	struct sv_clock clk = SV_CLOCK_INIT;
	sv_stream_progress(s, &clk, 0);
	uint64_t seq;
	if (!s->proto || !sv_proto_peer_switch(s->proto, &seq))
		return r;
	if (!sv_stream_switch_point_ok(s, seq))
		return r;
	uint64_t left = seq - s->tcp_rx;
	if ((uint64_t)r <= left)
		return r;
	size_t extra = (size_t)r - (size_t)left;
	if (flags & MSG_PEEK)
		return (long)left; /* the echo stays in the socket */
	if (extra > SV_CHALLENGE_SIZE) {
		/* More than an echo after the switch point: the announcement did
		 * not come from the TCP peer. Everything read is the
		 * application's. */
		sv_stream_challenge_failed(s, "data beyond the switch point");
		return r;
	}
	sv_iov_gather(s->sw.chal_got, use, usecnt, (size_t)left, extra);
	s->sw.chal_len = (uint32_t)extra;
	if (s->sw.chal_len == SV_CHALLENGE_SIZE)
		sv_stream_check_echo(s);
	return (long)left;
}

long sv_stream_tcp_read(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags)
{
	if (!sv_stream_may_switch(s))
		return plain_read(s, iov, iovcnt, flags);
	uint64_t seq = 0;
	bool announced = s->proto && sv_proto_peer_switch(s->proto, &seq);
	if (announced && !sv_stream_switch_point_ok(s, seq))
		return -EAGAIN;
	if (announced && s->tcp_rx == seq)
		return read_echo(s);

	/* Never past an announced switch point. */
	struct iovec lim[SV_IOV_MAX];
	int limcnt = iovcnt;
	const struct iovec *use = iov;
	if (announced && seq - s->tcp_rx < sv_iov_total(iov, iovcnt)) {
		limcnt = sv_iov_slice(iov, iovcnt, 0, (size_t)(seq - s->tcp_rx), lim, SV_IOV_MAX);
		use = lim;
	}
	struct msghdr m = {.msg_iov = (struct iovec *)use, .msg_iovlen = (size_t)limcnt};
	ssize_t r = SV_REAL(recvmsg)(s->fd, &m, flags | MSG_DONTWAIT);
	if (r < 0)
		return -errno;
	if (r == 0) {
		/* TCP ended without the server's switch: it cannot prove
		 * itself any more, so we stop waiting for it. */
		if (s->sw.tx_held && !s->sw.echo_owed)
			sv_stream_unhold(s, "TCP ended", SV_FB_CHALLENGE);
		return 0;
	}
	if (!announced && s->proto && s->qp)
		r = after_unannounced_read(s, use, limcnt, flags, r);
	if (!(flags & MSG_PEEK)) {
		s->tcp_rx += (uint64_t)r;
		s->st.tcp_rx_bytes += (uint64_t)r;
		if (r > 0)
			sv_copies_moved(s);
	}
	return r ? r : -EAGAIN;
}

/* Copy from the bytes read ahead. */
static long from_tcpbuf(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags)
{
	size_t avail = sv_stream_tcpbuf_held(s), done = 0;
	for (int i = 0; i < iovcnt && done < avail; i++) {
		size_t n = iov[i].iov_len < avail - done ? iov[i].iov_len : avail - done;
		memcpy(iov[i].iov_base, s->tcpbuf.buf + s->tcpbuf.off + done, n);
		done += n;
	}
	if (!(flags & MSG_PEEK)) {
		s->tcpbuf.off += done;
		if (s->tcpbuf.off == s->tcpbuf.len)
			s->tcpbuf.off = s->tcpbuf.len = 0;
	}
	return (long)done;
}

/* What one pass of a receive call found. */
enum rx_pass {
	RX_DONE,  /* *r is the result */
	RX_AGAIN, /* the medium changed: look again at once */
	RX_WAIT,  /* nothing yet: wait (or EAGAIN) */
};

static enum rx_pass rx_pass(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags,
			    struct sv_clock *clk, unsigned progress, long *r)
{
	if (sv_stream_tcpbuf_held(s)) {
		*r = from_tcpbuf(s, iov, iovcnt, flags);
		return RX_DONE;
	}
	struct sv_proto *p = s->proto;
	if (p && !s->error)
		sv_stream_progress(s, clk, progress);
	if (sv_stream_rx_medium(s) == SV_MEDIUM_QP) {
		*r = sv_proto_recv(p, iov, iovcnt, flags, clk);
		if (*r > 0 && !s->st.to_rdma_us)
			sv_stream_first_on_qp(s, clk);
		if (*r < 0 && *r != -EAGAIN && sv_proto_error(p)) {
			if (!s->error)
				sv_stream_break(s, sv_proto_error(p));
			/* Resuming: what the QP delivered is read first (the
			 * core holds it now that the break is known), then TCP. */
			if (sv_stream_resuming(s))
				return RX_AGAIN;
			*r = sv_stream_app_error(s, false);
		}
		if (*r != -EAGAIN)
			return RX_DONE;
		if (!sv_proto_rx_on_qp(p)) {
			s->st.switches_to_tcp += !sv_proto_back_sent(p);
			return RX_AGAIN; /* the rest comes from TCP */
		}
		return RX_WAIT;
	}
	/* SOVIA: a receive call pushes out coalesced writes. */
	if (p && sv_proto_tx_pending(p))
		sv_proto_flush(p, SV_FLUSH_RECV, clk);
	if (s->error) {
		*r = sv_stream_app_error(s, false);
		return RX_DONE;
	}
	if (!sv_stream_resume_heard(s))
		return RX_WAIT; /* TCP holds the peer's resume record first */
	*r = sv_stream_tcp_read(s, iov, iovcnt, flags);
	if (*r != -EAGAIN)
		return RX_DONE;
	if (sv_stream_rx_medium(s) == SV_MEDIUM_QP || sv_stream_tcpbuf_held(s))
		return RX_AGAIN; /* the challenge just moved us to the QP, or failed */
	return RX_WAIT;
}

/* One receive: what is there, or (blocking) the first bytes that come. */
static long recv_some(struct sv_stream *s, struct msghdr *msg, int flags)
{
	const struct iovec *iov = msg->msg_iov;
	int iovcnt = (int)msg->msg_iovlen;
	/* A stream socket has no source address or ancillary data to give. */
	msg->msg_namelen = 0;
	msg->msg_controllen = 0;
	msg->msg_flags = 0;
	if (flags & MSG_OOB)
		return -EINVAL;
	if (sv_iov_total(iov, iovcnt) == 0)
		return 0;

	sv_lock(&s->lock);
	s->wt.app_calls++;
	if (sv_stream_rx_medium(s) == SV_MEDIUM_KERNEL) {
		sv_stream_note_kernel_only(s);
		struct sv_stream *succ = sv_kcalls_enter(&s->kc);
		sv_unlock(&s->lock);
		if (succ) {
			long r = sv_stream_recvmsg(succ, msg, flags);
			sv_stream_put(succ);
			return r;
		}
		int inside = sv_guard_suspend();
		ssize_t n = SV_REAL(recvmsg)(s->fd, msg, flags);
		sv_guard_resume(inside);
		int err = errno;
		sv_kcalls_leave(&s->kc);
		errno = err;
		if (n > 0 && !(flags & MSG_PEEK)) {
			__atomic_fetch_add(&s->st.tcp_rx_bytes, (uint64_t)n, __ATOMIC_RELAXED);
			sv_copies_moved(s);
		}
		return n < 0 ? -errno : n;
	}
	long r;
	struct sv_clock clk = SV_CLOCK_INIT;
	uint64_t timeout_at = 0; /* SO_RCVTIMEO: from the first wait on */
	unsigned progress = 0;   /* SV_PROGRESS_DRAINED after a wait that drained the CQ */
	for (;;) {
		enum rx_pass pass = rx_pass(s, iov, iovcnt, flags, &clk, progress, &r);
		progress = 0;
		if (pass == RX_DONE)
			break;
		if (pass == RX_AGAIN)
			continue;
		if (s->error && !(s->proto && sv_proto_readable(s->proto))) {
			r = sv_stream_app_error(s, false);
			break;
		}
		r = -EAGAIN;
		if (!sv_stream_blocking(s, flags) ||
		    sv_stream_timed_out(s->opt.rcvtimeo_us, &clk, &timeout_at))
			break;
		bool on_tcp = sv_stream_rx_medium(s) != SV_MEDIUM_QP;
		int w = sv_stream_wait(s, &clk, on_tcp ? POLLIN : 0, timeout_at, SV_WAIT_APP);
		if (w < 0) {
			r = w;
			break;
		}
		progress = w > 0 ? SV_PROGRESS_DRAINED : 0;
		if (sv_copies_superseded(s) &&
		    sv_stream_rx_medium(s) == SV_MEDIUM_KERNEL) {
			/* Back on TCP while we waited, and it may get a
			 * successor or has one: the kernel's socket is read as
			 * its calls are, counted (a successor takes its counts
			 * only once none is under way) or passed on. */
			sv_unlock(&s->lock);
			return recv_some(s, msg, flags);
		}
	}
	sv_unlock(&s->lock);
	if (r > 0 && !(flags & MSG_PEEK)) /* what we wrote got its answer */
		atomic_store_explicit(&s->wt.writes_seen,
				      atomic_load_explicit(&s->wt.writes, memory_order_relaxed),
				      memory_order_relaxed);
	return r;
}

/* MSG_WAITALL: until the buffer is full, the end, an error, a signal or a
 * timeout; what came before one of those is the result. */
static long recv_all(struct sv_stream *s, struct msghdr *msg, int flags)
{
	size_t want = sv_iov_total(msg->msg_iov, (int)msg->msg_iovlen), got = 0;
	for (;;) {
		struct iovec rest[SV_IOV_MAX];
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
	sv_stream_app_uses(s);
	sv_lock(&s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->proto && !s->error)
		sv_stream_progress(s, &clk, 0);
	long n = (long)sv_stream_tcpbuf_held(s);
	bool rx_qp = s->proto && sv_proto_rx_on_qp(s->proto) && !s->error;
	if (rx_qp) {
		n += (long)sv_proto_readable(s->proto);
	} else if (!s->proto || !sv_proto_peer_switch(s->proto, NULL)) {
		/* TCP carries it: the kernel's count (during a switch it may
		 * hold the echo, which is not data). */
		int k = 0;
		if (SV_REAL(ioctl)(s->fd, FIONREAD, &k) < 0)
			n = -errno;
		else
			n += k;
	}
	sv_unlock(&s->lock);
	return n;
}

long sv_stream_recvmsg(struct sv_stream *s, struct msghdr *msg, int flags)
{
	sv_stream_app_uses(s);
	long r = (flags & MSG_WAITALL) && !(flags & MSG_PEEK) ? recv_all(s, msg, flags)
							     : recv_some(s, msg, flags);
	if (r == -EAGAIN) /* epoll's edge rules (readiness.h) */
		atomic_fetch_add_explicit(&s->wt.rx_eagain, 1, memory_order_relaxed);
	return r;
}
