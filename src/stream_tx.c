/* The stream's send path: TCP until our TO_RDMA, the QP after it. */
#include "real.h"
#include "stream_int.h"

#include "bytebuf.h"
#include "helper.h"
#include "log.h"
#include "verbs.h"

#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

int sv_stream_tcpbuf_append(struct sv_stream *s, const void *data, size_t len)
{
	return sv_bytes_append(&s->tcpbuf, &s->tcpbuf_len, &s->tcpbuf_cap, data, len);
}

int sv_stream_write_echo(struct sv_stream *s)
{
	if (!s->echo_owed || sv_proto_to_rdma_pending(&s->proto))
		return -EAGAIN;
	while (s->echo_sent < SV_CHALLENGE_SIZE) {
		ssize_t r = SV_REAL(send)(s->fd, s->peer_challenge + s->echo_sent,
				 SV_CHALLENGE_SIZE - s->echo_sent, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r < 0)
			return -errno;
		s->echo_sent += (uint32_t)r;
	}
	s->echo_owed = false;
	sv_stream_kernel_shut(s); /* TCP's FIN after the echo, if it is due */
	sv_stream_maybe_rdma(s);
	return 1;
}

void sv_stream_drain(struct sv_stream *s)
{
	struct sv_proto *p = &s->proto;
	uint64_t end = sv_now_us() + 5000000u;
	while (!s->error && sv_now_us() < end) {
		sv_stream_progress(s);
		if (p->pending_slot >= 0)
			sv_proto_flush(p, SV_FLUSH_CLOSE, sv_now_us());
		if (p->pending_slot < 0 && p->nfree == sv_proto_nsend(&p->prm))
			return;
		sv_stream_wait(s, 0, end);
	}
}

/* Where our next bytes go. */
enum tx_medium { TX_TCP, TX_HELD, TX_QP };

static enum tx_medium tx_medium(const struct sv_stream *s)
{
	if (s->state == SV_CONN_DETACHED)
		return TX_TCP;
	if (s->state == SV_CONN_DETACHING)
		return TX_HELD; /* the bytes given back go first */
	if (!s->proto_ready || s->proto.tx_state == SV_TX_TCP)
		return TX_TCP;
	return s->tx_held ? TX_HELD : TX_QP;
}

long sv_stream_sendmsg(struct sv_stream *s, const struct msghdr *msg, int flags)
{
	const struct iovec *iov = msg->msg_iov;
	int iovcnt = (int)msg->msg_iovlen;
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	if (flags & MSG_OOB)
		return -EOPNOTSUPP;

	pthread_mutex_lock(&s->lock);
	s->app_calls++;
	if (sv_stream_tcp_only(s) && !s->tx_shut) {
		/* TCP for good: the kernel's own call. */
		pthread_mutex_unlock(&s->lock);
		ssize_t n = SV_REAL(sendmsg)(s->fd, msg, flags);
		if (n > 0)
			__atomic_fetch_add(&s->st.tcp_tx_bytes, (uint64_t)n, __ATOMIC_RELAXED);
		return n < 0 ? -errno : n;
	}
	size_t done = 0;
	long r = 0;
	bool own = false; /* an error of ours, not the kernel's (which signals itself) */
	bool on_qp = false; /* some of the bytes went to the QP */
	uint64_t timeout_at = 0; /* SO_SNDTIMEO: from the first wait on */
	uint64_t waited_at = 0;  /* the clock at the end of the last wait */
	bool polled = false;     /* the CQ was looked at since the last wait */
	while (done < total || total == 0) {
		struct iovec rest[64];
		int restcnt = sv_iov_advance(iov, iovcnt, done, rest);
		if (s->tx_shut) {
			r = -EPIPE;
			own = true;
			break;
		}
		/* The clock only if a timer needs it (SV_NOW_UNREAD): a
		 * write that goes out at once reads none. */
		uint64_t now = waited_at ? waited_at : SV_NOW_UNREAD;
		waited_at = 0;
		/* On RDMA in both directions with nothing pending, the CQ
		 * only when the core finds no credit or buffer (below): a
		 * write that goes at once skips the poll. What the CQ holds
		 * is handled by the next read or wait; a message that crossed
		 * ours (a BACK, say) is one the protocol expects in flight.
		 * A switch, a way back or a coalesced buffer (its timer, its
		 * credits) is moved on first, as before every write. */
		bool settled = s->state == SV_CONN_RDMA && !s->echo_owed &&
			       s->proto.pending_slot < 0 && !sv_proto_back_wanted(&s->proto);
		if (s->proto_ready && !s->error && !settled) {
			sv_stream_progress_before_send(s, now); /* timers: below */
			polled = true;
		}
		if (s->error) {
			r = sv_stream_app_error(s, true);
			own = true;
			break;
		}
		enum tx_medium m = tx_medium(s);
		if (m == TX_TCP) {
			struct msghdr mm = {.msg_iov = rest, .msg_iovlen = (size_t)restcnt};
			ssize_t n = SV_REAL(sendmsg)(s->fd, &mm, (flags & ~MSG_MORE) | MSG_DONTWAIT);
			if (n >= 0) {
				s->tcp_tx += (uint64_t)n;
				s->st.tcp_tx_bytes += (uint64_t)n;
				done += (size_t)n;
				if (total == 0)
					break;
				continue;
			}
			r = -errno;
			if (r != -EAGAIN)
				break;
		} else if (m == TX_QP) {
			struct sv_proto *p = &s->proto;
			p->prm.coalesce = !s->nodelay;
			p->cork = s->cork;
			r = sv_proto_send(p, rest, restcnt, flags, now);
			if (r > 0) {
				/* Zero-copy sends stay in flight while the rest
				 * of the write is posted (waiting for each batch
				 * would drain the pipe every window); the wait for
				 * them comes once, before the write returns. */
				done += (size_t)r;
				on_qp = true;
				r = 0;
				if (total == 0)
					break;
				continue;
			}
			if (r == -EAGAIN && !polled && s->proto_ready && !s->error) {
				/* The credits or slots may be in the CQ. */
				sv_stream_progress_before_send(s, now);
				polled = true;
				continue;
			}
			if (total == 0)
				break;
			if (r != -EAGAIN) {
				if (p->error) {
					/* The core found the connection broken first:
					 * one report, then EPIPE, as for the stream's. */
					if (!s->error)
						sv_stream_break(s, p->error);
					r = sv_stream_app_error(s, true);
				}
				own = true;
				break;
			}
		} else {
			r = -EAGAIN; /* held until the peer proves itself */
		}
		/* Nothing could go now. Only here does the fd's mode matter: a
		 * write that goes through at once costs no fcntl. */
		if (!sv_stream_blocking(s, flags))
			break;
		if (sv_stream_timed_out(s->sndtimeo_us, &timeout_at)) {
			r = -EAGAIN;
			break;
		}
		bool detaching = s->state == SV_CONN_DETACHING;
		/* A fresh reading: posting this pass's bytes took time. */
		uint64_t at = sv_now_us(), until = timeout_at;
		if (detaching && (!until || until > at + 10000))
			until = at + 10000;
		int w = sv_stream_app_wait(s, m == TX_TCP || detaching ? POLLOUT : 0, until, &at);
		waited_at = at;
		polled = false;
		if (w < 0) {
			r = w;
			break;
		}
	}
	/* The delayed ACK after the send: the data posted carried any ACK
	 * that was due, so a ping-pong's reply reads no clock for it. */
	if (s->proto_ready && !s->error && sv_proto_ack_armed(&s->proto))
		sv_proto_timers(&s->proto, SV_NOW_UNREAD);
	if (on_qp) {
		/* Zero copy: the application may reuse its buffer only once
		 * the data is out of it. */
		struct sv_proto *p = &s->proto;
		while (sv_proto_zcopy_busy(p) && !s->error) {
			sv_stream_progress(s);
			if (sv_proto_zcopy_busy(p))
				sv_stream_wait(s, 0, 0);
		}
		/* After exit began (stdio's last flush), the process may end
		 * any moment: the bytes must be out first. */
		if (!s->error && atomic_load_explicit(&sv_exiting, memory_order_relaxed))
			sv_stream_drain(s);
	}
	if (done) /* writers hold the lock: no atomic add needed */
		atomic_store_explicit(&s->writes,
				      atomic_load_explicit(&s->writes, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	pthread_mutex_unlock(&s->lock);
	if (done)
		return (long)done;
	if (own && r == -EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE); /* as the kernel does for a TCP socket */
	return r;
}

int sv_stream_shutdown(struct sv_stream *s, int how)
{
	int r = 0;
	pthread_mutex_lock(&s->lock);
	if (how == SHUT_WR || how == SHUT_RDWR) {
		struct sv_proto *p = &s->proto;
		if (s->proto_ready && p->tx_state == SV_TX_OPEN) {
			/* FIN after the data, over the QP. It never waits (as
			 * TCP's shutdown does not): with writes still waiting
			 * for credits, it follows them when credits come. A
			 * reader that waited here instead would deadlock an
			 * echo: the peer waits for it to read. */
			sv_stream_progress(s);
			r = sv_proto_shutdown_tx(p, SV_NOW_UNREAD);
		}
		s->tx_shut = true;
	}
	/* The kernel's socket follows, unless TCP may still have to carry
	 * bytes of ours: the echo of a switch, or bytes the peer gives back
	 * when the connection goes back to TCP. Its FIN then comes when they
	 * are out, or at close. */
	bool wr = how == SHUT_WR || how == SHUT_RDWR;
	if (wr && s->state != SV_CONN_DETACHED) {
		s->shut_deferred = true;
		sv_stream_kernel_shut(s); /* at once unless held back */
		if (how == SHUT_RDWR && SV_REAL(shutdown)(s->fd, SHUT_RD) < 0 && r == 0)
			r = -errno;
	} else if (SV_REAL(shutdown)(s->fd, how) < 0 && r == 0) {
		r = -errno;
	}
	sv_stream_wake(s);
	pthread_mutex_unlock(&s->lock);
	return r == -EAGAIN ? 0 : r;
}

int sv_stream_setsockopt(struct sv_stream *s, int level, int name, const void *val,
			 socklen_t len)
{
	/* The kernel's socket gets every option (and checks it); the ones
	 * that shape the protocol are mirrored. */
	if (SV_REAL(setsockopt)(s->fd, level, name, val, len) < 0)
		return -errno;
	if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
		pthread_mutex_lock(&s->lock);
		sv_stream_load_timeouts(s);
		pthread_mutex_unlock(&s->lock);
	}
	if (level == IPPROTO_TCP && (name == TCP_NODELAY || name == TCP_CORK) &&
	    len >= (socklen_t)sizeof(int)) {
		int on = *(const int *)val != 0;
		pthread_mutex_lock(&s->lock);
		if (name == TCP_NODELAY)
			s->nodelay = on;
		else
			s->cork = on;
		if (s->proto_ready && (name == TCP_NODELAY ? on : !on) &&
		    s->proto.tx_state == SV_TX_OPEN) {
			s->proto.cork = s->cork;
			s->proto.prm.coalesce = !s->nodelay;
			sv_proto_flush(&s->proto, on ? SV_FLUSH_NODELAY : SV_FLUSH_CLOSE, sv_now_us());
		}
		pthread_mutex_unlock(&s->lock);
	}
	return 0;
}
