/* The stream's send path (TCP until our TO_RDMA, the QP after it),
 * shutdown and the socket options that shape the protocol. */
#include "stream_int.h"

#include "guard.h"
#include "iov.h"
#include "log.h"
#include "real.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string.h>

/* One send call's progress. */
struct send_call {
	const struct iovec *iov;
	int iovcnt, flags;
	size_t total, done;
	long r;
	bool own;    /* r is an error of ours, not the kernel's (which signals itself) */
	bool on_qp;  /* some of the bytes went to the QP */
	bool polled; /* the CQ was looked at since the last wait */
	uint64_t timeout_at; /* SO_SNDTIMEO: from the first wait on */
	struct sv_clock clk;
};

/* Over TCP, never blocking. False when the call is over (c->r says why). */
static bool send_tcp(struct sv_stream *s, struct send_call *c, struct iovec *rest, int restcnt)
{
	struct msghdr mm = {.msg_iov = rest, .msg_iovlen = (size_t)restcnt};
	ssize_t n;
	if (s->fo.announce_due && restcnt < SV_IOV_MAX) {
		/* After the QP's normal end our record goes first, in the same
		 * segment: to a peer that closed, the write succeeds and the
		 * reset comes after, as TCP's first write after a close does. */
		struct iovec both[SV_IOV_MAX];
		both[0] = (struct iovec){s->fo.out, SV_RESUME_SIZE};
		memcpy(both + 1, rest, (size_t)restcnt * sizeof(*rest));
		mm.msg_iov = both;
		mm.msg_iovlen = (size_t)restcnt + 1;
		n = SV_REAL(sendmsg)(s->fd, &mm, (c->flags & ~MSG_MORE) | MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0 && n < SV_RESUME_SIZE) {
			sv_stream_fail(s, -ECONNRESET); /* cannot happen on a quiet socket */
			c->r = s->error;
			return false;
		}
		if (n >= SV_RESUME_SIZE) {
			s->fo.announce_due = false;
			s->fo.announced = true;
			s->fo.out_sent = SV_RESUME_SIZE;
			n -= SV_RESUME_SIZE;
		}
	} else {
		if (s->fo.announce_due)
			sv_stream_resume_announce(s);
		n = SV_REAL(sendmsg)(s->fd, &mm, (c->flags & ~MSG_MORE) | MSG_DONTWAIT);
	}
	if (n >= 0) {
		s->tcp_tx += (uint64_t)n;
		s->st.tcp_tx_bytes += (uint64_t)n;
		if (n > 0)
			sv_copies_moved(s);
		c->done += (size_t)n;
		c->r = 0;
		return c->total != 0;
	}
	c->r = -errno;
	return c->r == -EAGAIN;
}

/* Over the QP, through the core. False when the call is over. */
static bool send_qp(struct sv_stream *s, struct send_call *c, struct iovec *rest, int restcnt)
{
	struct sv_proto *p = s->proto;
	c->r = sv_proto_send(p, rest, restcnt, c->flags, &c->clk);
	if (c->r > 0) {
		/* Zero-copy sends stay in flight while the rest of the write is
		 * posted (waiting for each batch would drain the pipe every
		 * window); the wait for them comes once, before the write
		 * returns. */
		c->done += (size_t)c->r;
		s->st.qp_taken += (uint64_t)c->r;
		c->on_qp = true;
		if (!s->st.to_rdma_us)
			sv_stream_first_on_qp(s, &c->clk);
		c->r = 0;
		return c->total != 0;
	}
	if (c->r == -EAGAIN && !c->polled && !s->error) {
		/* The credits or send buffers may be in the CQ. */
		sv_stream_progress(s, &c->clk, SV_PROGRESS_SEND);
		c->polled = true;
		c->r = 1; /* look again before waiting */
		return true;
	}
	if (c->total == 0)
		return false;
	if (c->r != -EAGAIN) {
		if (sv_proto_error(p)) {
			/* The core found the connection broken first: one report,
			 * then EPIPE, as for the stream's own errors. */
			if (!s->error)
				sv_stream_break(s, sv_proto_error(p));
			if (sv_stream_resuming(s)) {
				c->r = 1; /* the rest goes on TCP once resumed */
				return true;
			}
			c->r = sv_stream_app_error(s, true);
		}
		c->own = true;
		return false;
	}
	return true;
}

/* One pass: move what can move now. False when the call is over; c->r 1:
 * look again at once, else wait for room. */
static bool send_pass(struct sv_stream *s, struct send_call *c, enum sv_medium *m)
{
	struct iovec rest[SV_IOV_MAX];
	int restcnt = sv_iov_advance(c->iov, c->iovcnt, c->done, rest);
	if (s->cl.tx_shut) {
		c->r = -EPIPE;
		c->own = true;
		return false;
	}
	/* On RDMA in both directions with nothing pending, the CQ only when
	 * the core finds no credit or buffer: a write that goes at once skips
	 * the poll. What the CQ holds is handled by the next read or wait; a
	 * message that crossed ours (a BACK, say) is one the protocol expects
	 * in flight. A switch, a way back or a coalesced buffer (its timer,
	 * its credits) is moved on first, as before every write. */
	bool settled = s->state == SV_CONN_RDMA && !s->sw.echo_owed &&
		       !sv_proto_tx_pending(s->proto) && !sv_proto_back_wanted(s->proto);
	if (s->proto && !s->error && !settled) {
		sv_stream_progress(s, &c->clk, SV_PROGRESS_SEND);
		c->polled = true;
	}
	if (s->error) {
		c->r = sv_stream_app_error(s, true);
		c->own = true;
		return false;
	}
	sv_stream_hold_due(s, &c->clk);
	*m = sv_stream_tx_medium(s);
	switch (*m) {
	case SV_MEDIUM_KERNEL:
	case SV_MEDIUM_TCP:
		return send_tcp(s, c, rest, restcnt);
	case SV_MEDIUM_QP:
		return send_qp(s, c, rest, restcnt);
	case SV_MEDIUM_HELD:
		c->r = -EAGAIN; /* until the peer proves itself, or the bytes given back are out */
		if (sv_stream_holding_first(s))
			s->hold.refused = true;
		return true;
	}
	return false;
}

/* Nothing could go now: wait for room, unless the call must not. */
static bool send_wait(struct sv_stream *s, struct send_call *c, enum sv_medium m)
{
	/* Only here does the fd's mode matter: a write that goes through at
	 * once costs no fcntl. */
	if (!sv_stream_blocking(s, c->flags))
		return false;
	if (sv_stream_timed_out(s->opt.sndtimeo_us, &c->clk, &c->timeout_at)) {
		c->r = -EAGAIN;
		return false;
	}
	bool detaching = s->state == SV_CONN_DETACHING;
	/* A fresh reading: posting this pass's bytes took time. */
	uint64_t at = sv_clock_update(&c->clk), until = c->timeout_at;
	if (detaching && (!until || until > at + 10000))
		until = at + 10000;
	if (sv_stream_holding_first(s) && (!until || until > s->hold.until))
		until = s->hold.until; /* then it goes on TCP */
	bool tcp = m == SV_MEDIUM_TCP || m == SV_MEDIUM_KERNEL || detaching;
	int w = sv_stream_wait(s, &c->clk, tcp ? POLLOUT : 0, until, SV_WAIT_APP);
	c->polled = false;
	if (w < 0) {
		c->r = w;
		return false;
	}
	return true;
}

/* Before the write returns: its zero-copy memory is out, and at exit its
 * bytes are delivered. */
static void send_finish(struct sv_stream *s, struct send_call *c)
{
	struct sv_proto *p = s->proto;
	/* The delayed ACK after the send: the data posted carried any ACK
	 * that was due, so a ping-pong's reply reads no clock for it. */
	if (p && !s->error && sv_proto_ack_armed(p))
		sv_proto_timers(p, &c->clk);
	if (!c->on_qp)
		return;
	/* Bytes coalesced: an epoll set that judges only the streams that
	 * changed must look at this one before it sleeps, and push them out
	 * (sv_stream_poll_waits). */
	if (!s->error && sv_proto_tx_pending(p))
		sv_hub_notify(&s->wt.node);
	/* Zero copy: the application may reuse its buffer only once the data
	 * is out of it. */
	while (sv_proto_zcopy_busy(p) && !s->error) {
		sv_stream_progress(s, &c->clk, 0);
		if (sv_proto_zcopy_busy(p))
			sv_stream_wait(s, &c->clk, 0, 0, 0);
	}
	/* After exit began (stdio's last flush), the process may end any
	 * moment: the bytes must be out first. */
	if (!s->error && atomic_load_explicit(&sv_stream_exit_begun, memory_order_relaxed))
		sv_stream_drain(s);
}

/* A write that moved `done` bytes (finished as any write's), then woke on
 * plain TCP with a successor to come or made: the rest goes as a call of
 * its own. After a partial write a failure of the rest is the next
 * call's, as with the kernel: no SIGPIPE now. */
static long send_rest(struct sv_stream *s, const struct msghdr *msg, int flags, size_t done)
{
	if (!done)
		return sv_stream_sendmsg(s, msg, flags);
	struct iovec rest[SV_IOV_MAX];
	struct msghdr m = *msg;
	m.msg_iov = rest;
	m.msg_iovlen = (size_t)sv_iov_advance(msg->msg_iov, (int)msg->msg_iovlen, done, rest);
	long r = sv_stream_sendmsg(s, &m, flags | MSG_NOSIGNAL);
	return (long)done + (r > 0 ? r : 0);
}

long sv_stream_sendmsg(struct sv_stream *s, const struct msghdr *msg, int flags)
{
	sv_stream_app_uses(s);
	if (flags & MSG_OOB)
		return -EOPNOTSUPP;
	struct send_call c = {
		.iov = msg->msg_iov,
		.iovcnt = (int)msg->msg_iovlen,
		.flags = flags,
		.total = sv_iov_total(msg->msg_iov, (int)msg->msg_iovlen),
		.clk = SV_CLOCK_INIT,
	};
	sv_lock(&s->lock);
	s->wt.app_calls++;
	if (sv_stream_tx_medium(s) == SV_MEDIUM_KERNEL && !s->cl.tx_shut) {
		sv_stream_note_kernel_only(s);
		struct sv_stream *succ = sv_kcalls_enter(&s->kc);
		sv_unlock(&s->lock);
		if (succ) {
			long r = sv_stream_sendmsg(succ, msg, flags);
			sv_stream_put(succ);
			return r;
		}
		int inside = sv_guard_suspend();
		ssize_t n = SV_REAL(sendmsg)(s->fd, msg, flags);
		sv_guard_resume(inside);
		int err = errno;
		sv_kcalls_leave(&s->kc);
		errno = err;
		if (n > 0) {
			__atomic_fetch_add(&s->st.tcp_tx_bytes, (uint64_t)n, __ATOMIC_RELAXED);
			sv_copies_moved(s);
		}
		if (n < 0 && errno == EAGAIN)
			atomic_fetch_add_explicit(&s->wt.tx_eagain, 1, memory_order_relaxed);
		return n < 0 ? -errno : n;
	}
	enum sv_medium m = SV_MEDIUM_TCP;
	bool rest = false;
	while (c.done < c.total || c.total == 0) {
		if (!send_pass(s, &c, &m))
			break;
		if (c.r == 1 || c.r == 0)
			continue; /* moved some, or look again */
		if (!send_wait(s, &c, m))
			break;
		if (sv_copies_superseded(s) &&
		    sv_stream_tx_medium(s) == SV_MEDIUM_KERNEL && !s->cl.tx_shut) {
			/* Back on TCP while we waited, and it may get a
			 * successor or has one: the rest is written as the
			 * kernel's calls are, counted or passed on
			 * (src/share/redo.c). */
			rest = true;
			break;
		}
	}
	send_finish(s, &c);
	if (c.done) /* writers hold the lock: no atomic add needed */
		atomic_store_explicit(&s->wt.writes,
				      atomic_load_explicit(&s->wt.writes, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	sv_unlock(&s->lock);
	if (rest)
		return send_rest(s, msg, flags, c.done);
	if (c.done)
		return (long)c.done;
	if (c.r == -EAGAIN)
		atomic_fetch_add_explicit(&s->wt.tx_eagain, 1, memory_order_relaxed);
	if (c.own && c.r == -EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE); /* as the kernel does for a TCP socket */
	return c.r;
}

/* While the QP may still be lost, TCP may still carry the peer's resume
 * record and bytes (stream_resume.c). */
static bool may_need_tcp_reads(const struct sv_stream *s)
{
	return s->state == SV_CONN_RDMA || s->state == SV_CONN_SWITCHING ||
	       s->state == SV_CONN_RESUMING;
}

int sv_stream_shutdown(struct sv_stream *s, int how)
{
	sv_stream_app_uses(s);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	int r = 0;
	bool wr = how == SHUT_WR || how == SHUT_RDWR;
	sv_lock(&s->lock);
	if (wr && s->proto && sv_proto_tx_state(s->proto) == SV_TX_OPEN) {
		/* FIN after the data, over the QP. It never waits (as TCP's
		 * shutdown does not): with writes still waiting for credits, it
		 * follows them when credits come. A reader that waited here
		 * instead would deadlock an echo: the peer waits for it to read. */
		struct sv_clock clk = SV_CLOCK_INIT;
		sv_stream_progress(s, &clk, 0);
		/* The QP may have been lost just now: TCP's FIN follows the
		 * resumed bytes then (sv_stream_kernel_shut). */
		if (sv_proto_tx_state(s->proto) == SV_TX_OPEN)
			r = sv_proto_shutdown_tx(s->proto, &clk);
		if (r < 0 && r != -EAGAIN && sv_proto_error(s->proto) && !s->error) {
			sv_stream_break(s, r); /* the FIN's post found the QP lost */
			if (sv_stream_resuming(s))
				r = 0;
		}
	}
	if (wr)
		s->cl.tx_shut = true;
	/* The kernel's socket follows, unless TCP may still have to carry
	 * bytes of ours: the echo of a switch, or bytes the peer gives back
	 * when the connection goes back to TCP. Its FIN then comes when they
	 * are out, or at close. */
	if (wr && s->state != SV_CONN_DETACHED) {
		s->cl.shut_deferred = true;
		sv_stream_kernel_shut(s); /* at once unless held back */
		if (how == SHUT_RDWR && !may_need_tcp_reads(s) &&
		    SV_REAL(shutdown)(s->fd, SHUT_RD) < 0 && r == 0)
			r = -errno;
	} else if (how == SHUT_RD && may_need_tcp_reads(s)) {
		/* Kept from the kernel: after a lost QP its record comes on
		 * TCP, and a kernel that shut reading would say EOF. */
	} else if (SV_REAL(shutdown)(s->fd, how) < 0 && r == 0) {
		r = -errno;
	}
	sv_stream_wake(s);
	sv_unlock(&s->lock);
	return r == -EAGAIN ? 0 : r;
}

int sv_stream_setsockopt(struct sv_stream *s, int level, int name, const void *val,
			 socklen_t len)
{
	/* The kernel's socket gets every option (and checks it); the ones
	 * that shape the protocol are mirrored. */
	if (SV_REAL(setsockopt)(s->fd, level, name, val, len) < 0)
		return -errno;
	bool timeo = level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO);
	bool tcp = level == IPPROTO_TCP && (name == TCP_NODELAY || name == TCP_CORK) &&
		   len >= (socklen_t)sizeof(int);
	if (!timeo && !tcp)
		return 0;
	sv_lock(&s->lock);
	if (timeo)
		sv_stream_load_timeouts(s);
	if (tcp) {
		bool on = *(const int *)val != 0;
		struct sv_clock clk = SV_CLOCK_INIT;
		if (name == TCP_NODELAY)
			s->opt.nodelay = on;
		else
			s->opt.cork = on;
		/* Turning NODELAY on or the cork off pushes out what waited. */
		if (s->proto && name == TCP_NODELAY)
			sv_proto_set_nodelay(s->proto, on, &clk);
		else if (s->proto)
			sv_proto_set_cork(s->proto, on, &clk);
	}
	sv_unlock(&s->lock);
	return 0;
}
