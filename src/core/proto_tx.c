/* The protocol core's sending: DATA by copy or zero copy, Nagle-style
 * coalescing, the control messages, and send completions. */
#include "proto.h"
#include "proto_int.h"

#include "iov.h"

#include <errno.h>
#include <sys/socket.h>

/* ---- Messages and send buffers ------------------------------------------ */

/* Fill and post one message from send buffer `slot`: header + `len` payload
 * bytes already in place after it, plus an optional zero-copy iovec. */
int sv_pr_post(struct sv_proto *p, uint32_t slot, uint8_t type, uint64_t seq, uint32_t len,
	       const struct iovec *zc, int zccnt)
{
	struct sv_hdr h = {
		.type = type,
		/* The size of the buffers it reports: all of one size, as
		 * sv_pr_rx_grow_if_due grows only between reports. */
		.flags = p->rx_code,
		.credits = (uint16_t)p->unreported,
		.len = len,
		.seq = seq,
		.ack = p->rcv_nxt,
	};
	uint8_t *buf = p->xp.ops->send_buf(p->xp.ctx, slot);
	sv_hdr_encode(&h, buf);
	uint32_t inline_len = SV_HDR_SIZE + (zccnt ? 0 : len);
	int r = p->xp.ops->post_send(p->xp.ctx, slot, inline_len, zc, zccnt);
	if (r < 0) {
		/* The transport is broken; the slot is ours again. The
		 * coalescing buffer's stays pending: its bytes were taken from
		 * the application, and the abort keeps them for TCP. */
		if ((int32_t)slot != p->pending_slot)
			sv_pr_free_slot(p, slot);
		return sv_proto_abort(p, r);
	}
	/* The report went out: the peer may use those buffers now. */
	if (type == SV_MSG_DATA && p->unreported)
		p->st.acks_piggybacked++;
	p->peer_credits += p->unreported;
	p->unreported = 0;
	p->unreported_data = 0;
	p->unreported_small = 0;
	p->ack_deadline = 0;
	p->ack_lazy_us = 0;
	p->credits--;
	/* It went into the oldest of the peer's buffers. */
	if (--p->runs[p->run_head].n == 0 && p->run_count > 1) {
		p->run_head = (p->run_head + 1) % SV_RUNS;
		p->run_count--;
	}
	if (p->drain == SV_DRAIN_OLD && p->drain_left)
		p->drain_left--;
	if (p->rx_grow_wanted || p->rx_shrink_wanted)
		sv_pr_rx_grow_if_due(p);
	p->inflight += type == SV_MSG_DATA;
	p->slot_kind[slot] = (uint8_t)(zccnt ? SV_SLOT_ZCOPY
					     : type == SV_MSG_DATA ? SV_SLOT_DATA : SV_SLOT_CONTROL);
	p->zc_inflight += zccnt ? 1 : 0;
	if (type == SV_MSG_DATA) {
		struct sv_slot_data *d = &p->slot_data[slot];
		d->seq = seq;
		d->len = len;
		d->iovcnt = (uint32_t)zccnt;
		for (int i = 0; i < zccnt; i++)
			d->iov[i] = zc[i];
	}
	p->st.tx_msgs++;
	if (type == SV_MSG_TO_RDMA) {
		p->to_rdma_inflight = true;
		p->to_rdma_slot = slot;
	}
	if (type == SV_MSG_FIN)
		p->fin_slot = (int32_t)slot;
	if (type == SV_MSG_DATA) {
		p->st.tx_data_msgs++;
		p->st.tx_bytes += len;
		if (zccnt)
			p->st.tx_zcopy_bytes += len;
	}
	return 0;
}

int sv_pr_send_control(struct sv_proto *p, uint8_t type, uint64_t seq, uint32_t need)
{
	uint32_t slot;
	if (p->error)
		return p->error;
	if (p->credits < need || sv_pr_take_slot(p, &slot) < 0)
		return -EAGAIN;
	return sv_pr_post(p, slot, type, seq, 0, NULL, 0);
}

/* ---- Flushing the coalescing buffer --------------------------------------- */

int sv_pr_flush_pending(struct sv_proto *p, enum sv_flush_reason why)
{
	if (p->pending_slot < 0)
		return 0;
	if (p->credits <= p->prm.reserve) {
		p->st.credit_stalls++;
		return -EAGAIN;
	}
	uint32_t len = p->pending_len;
	uint32_t slot = (uint32_t)p->pending_slot;
	int r = sv_pr_post(p, slot, SV_MSG_DATA, p->snd_nxt, len, NULL, 0);
	if (r < 0)
		return r; /* still pending: kept by the abort */
	sv_pr_take_pending(p);
	p->snd_nxt += len;
	p->st.flushes[why]++;
	return 0;
}

int sv_pr_fin_if_wanted(struct sv_proto *p, struct sv_clock *clk)
{
	if (!p->fin_wanted || p->error)
		return 0;
	if (p->tx_state != SV_TX_OPEN) {
		/* Our sending left the QP another way (our BACK, the QP's end):
		 * TCP's FIN follows the bytes that go there (the stream's
		 * kernel shutdown). */
		p->fin_wanted = false;
		return 0;
	}
	int r = sv_proto_send_fin(p, clk);
	return r == -EAGAIN ? 0 : r;
}

int sv_pr_flush_if_idle(struct sv_proto *p)
{
	if (!sv_pr_tx_idle(p) || p->pending_slot < 0 || p->cork || p->pending_hold)
		return 0;
	int r = sv_pr_flush_pending(p, SV_FLUSH_IDLE);
	return r == -EAGAIN ? 0 : r;
}

int sv_proto_flush(struct sv_proto *p, enum sv_flush_reason why, struct sv_clock *clk)
{
	if (p->error)
		return p->error;
	int r = sv_pr_flush_pending(p, why);
	return r < 0 ? r : sv_pr_fin_if_wanted(p, clk);
}

int sv_pr_tx_release(struct sv_proto *p, struct sv_clock *clk)
{
	if (p->pending_slot >= 0 && sv_pr_can_send_data(p)) {
		bool full = p->pending_len >= p->pending_cap;
		bool free_to_go = !p->cork && !p->pending_hold &&
				  (p->inflight == 0 || !p->prm.coalesce);
		/* The timer matters only for a buffer that would stay: the
		 * clock is read for nothing else. */
		bool late = !full && !free_to_go && sv_clock_now(clk) >= p->pending_deadline;
		enum sv_flush_reason why = full ? SV_FLUSH_FULL
				       : late ? SV_FLUSH_TIMER
				       : !p->prm.coalesce ? SV_FLUSH_NODELAY
							  : SV_FLUSH_IDLE;
		if (full || late || free_to_go) {
			int r = sv_pr_flush_pending(p, why);
			if (r < 0 && r != -EAGAIN)
				return r;
		}
	}
	return sv_pr_fin_if_wanted(p, clk);
}

/* ---- Application sends ---------------------------------------------------- */

static int tx_check(const struct sv_proto *p)
{
	if (p->error)
		return p->error;
	switch (p->tx_state) {
	case SV_TX_OPEN:
		return 0;
	case SV_TX_TCP:
		return -EINVAL; /* the stream layer sends on TCP itself */
	case SV_TX_FIN:
		return -EPIPE;
	case SV_TX_RESET:
		/* Without an error (checked above), the QP ended normally
		 * after the peer's FIN: only sv_proto_peer_ended sets RESET
		 * without one. The peer closed and its end is gone, and TCP's
		 * writes to such a peer (CLOSE_WAIT, then its reset) fail with
		 * EPIPE. */
		return -EPIPE;
	case SV_TX_BACK:
		return -EINVAL; /* detached: the stream layer writes on TCP */
	}
	return -EINVAL;
}

/* Whole messages of as much as each fits (sv_pr_msg_cap), of the write's bytes
 * from `skip` on (`total` of them): copied into the send buffers, or with
 * zero copy left in the caller's memory (a message then ends early if its
 * slice of the write needs more than SV_ZCOPY_MAX_IOV entries). */
static long send_messages(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t skip,
			  size_t total, bool zcopy)
{
	size_t done = 0;
	while (done < total && sv_pr_can_send_data(p)) {
		struct iovec part[SV_ZCOPY_MAX_IOV];
		int k = 0;
		uint32_t slot;
		sv_pr_take_slot(p, &slot);
		/* Zero copy: the payload is the application's, only the
		 * peer's buffer limits it. */
		size_t cap = zcopy ? sv_pr_peer_cap(p) : sv_pr_msg_cap(p, slot);
		size_t n = total - done < cap ? total - done : cap;
		if (zcopy) {
			k = sv_iov_slice(iov, iovcnt, skip + done, n, part, SV_ZCOPY_MAX_IOV);
			n = sv_iov_total(part, k);
		}
		if (!zcopy)
			sv_iov_gather(sv_pr_tx_payload(p, slot), iov, iovcnt, skip + done, n);
		int r = sv_pr_post(p, slot, SV_MSG_DATA, p->snd_nxt, (uint32_t)n, zcopy ? part : NULL,
				   k);
		if (r < 0)
			return done ? (long)done : r;
		p->snd_nxt += n;
		done += n;
	}
	if (!done) {
		p->st.credit_stalls++;
		return -EAGAIN;
	}
	return (long)done;
}

/* The coalescing buffer is topped up before anything else, as TCP fills a
 * segment before it starts the next: a write that does not fit in what is
 * left of it, or one that goes as messages of its own, first takes that
 * room, and the full buffer (or, for a large write, the buffer with the
 * whole write in it) goes. Short of a credit it stays, and the write ends
 * with the bytes it took: poll() reports POLLOUT while the buffer has room
 * (sv_proto_writable), a promise that a write takes some bytes. *took is
 * what went into the buffer; the result is 0 to go on with the rest, or
 * -errno (-EAGAIN: no credit for the buffer) to end the write here. */
static int top_up(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t total,
		  bool small, size_t *took)
{
	*took = 0;
	if (p->pending_slot < 0 || (small && p->pending_len + total <= p->pending_cap))
		return 0;
	size_t room = p->pending_cap - p->pending_len;
	size_t n = total < room ? total : room;
	if (n) {
		uint8_t *buf = sv_pr_tx_payload(p, (uint32_t)p->pending_slot);
		sv_iov_gather(buf + p->pending_len, iov, iovcnt, 0, n);
		p->pending_len += (uint32_t)n;
		if (p->prm.coalesce)
			p->st.coalesced_writes++;
		else
			p->st.collected_writes++; /* NODELAY: only a closed window holds bytes */
		*took = n;
	}
	enum sv_flush_reason why = SV_FLUSH_FULL;
	if (p->pending_len < p->pending_cap)
		why = p->prm.coalesce ? SV_FLUSH_LARGE : SV_FLUSH_NODELAY;
	return sv_pr_flush_pending(p, why);
}

/* TCP_NODELAY: what waits goes first, then this write as its own message if
 * a credit is there (*sent: the result). Without one it is collected, as
 * TCP keeps writes in its send buffer while the peer's window is closed,
 * and goes when credits come (sv_pr_tx_release). */
static bool send_nodelay(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t skip,
			 size_t total, long *sent)
{
	if (p->pending_slot >= 0 && sv_pr_can_send_data(p)) {
		int r = sv_pr_flush_pending(p, SV_FLUSH_NODELAY);
		if (r < 0 && r != -EAGAIN) {
			*sent = r;
			return true;
		}
	}
	if (p->pending_slot >= 0 || !sv_pr_can_send_data(p))
		return false;
	*sent = send_messages(p, iov, iovcnt, skip, total, false);
	if (*sent > 0)
		p->st.flushes[SV_FLUSH_NODELAY]++;
	return true;
}

/* A small write joins the coalescing buffer (top_up made sure it fits). A
 * new buffer needs a free send buffer but no credit: the writer goes on
 * filling it while the window is closed, and it goes when credits come. */
static long coalesce(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t skip,
		     size_t total, int flags, struct sv_clock *clk)
{
	bool window_closed = !sv_pr_can_send_data(p);
	if (p->pending_slot < 0) {
		uint32_t slot;
		if (sv_pr_take_slot(p, &slot) < 0) {
			p->st.credit_stalls++;
			return -EAGAIN;
		}
		p->pending_slot = (int32_t)slot;
		p->pending_len = 0;
		/* What it may take is fixed now: the peer's next buffers are
		 * never smaller, but while we give its large ones back
		 * (proto_drain.c), when they may be the set-up's size. */
		p->pending_cap = sv_pr_wait_cap(p, sv_pr_msg_cap(p, slot));
		p->pending_deadline = 0; /* armed below if the buffer stays */
	} else if (p->prm.coalesce) {
		p->st.coalesced_writes++;
	}
	if (window_closed)
		p->st.collected_writes++;
	uint8_t *buf = sv_pr_tx_payload(p, (uint32_t)p->pending_slot);
	sv_iov_gather(buf + p->pending_len, iov, iovcnt, skip, total);
	p->pending_len += (uint32_t)total;
	p->pending_hold = (flags & MSG_MORE) != 0; /* the latest write says */

	int r = 0;
	if (p->pending_len >= p->pending_cap) /* TCP's MSS: a full buffer goes */
		r = sv_pr_flush_pending(p, SV_FLUSH_FULL);
	else if (!p->prm.coalesce && !(flags & MSG_MORE))
		r = sv_pr_flush_pending(p, SV_FLUSH_NODELAY);
	else if (sv_pr_tx_idle(p) && !p->cork && !(flags & MSG_MORE))
		r = sv_pr_flush_pending(p, SV_FLUSH_IDLE);
	/* The data is taken either way: a flush short of credit stays
	 * pending, and a failed one (the QP broke) left it pending for the
	 * abort, which keeps it for TCP. Reporting the failure here would have
	 * the caller send the write's bytes again; its next call hears it. */
	if (r < 0 && r != -EAGAIN)
		return (long)total;
	if (p->pending_slot >= 0 && !p->pending_deadline)
		p->pending_deadline = sv_clock_now(clk) + p->prm.coalesce_timeout_us;
	return (long)total;
}

/* The write's bytes from `skip` on, once nothing is pending in front of
 * them that they could have joined. */
static long send_rest(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t skip,
		      size_t total, bool small, int flags, struct sv_clock *clk)
{
	if (skip + total >= p->prm.zcopy_threshold)
		return send_messages(p, iov, iovcnt, skip, total, true);
	if (!small) {
		long n = send_messages(p, iov, iovcnt, skip, total, false);
		if (n > 0 && !p->prm.coalesce)
			p->st.flushes[SV_FLUSH_NODELAY]++;
		return n;
	}
	long sent;
	if (!p->prm.coalesce && send_nodelay(p, iov, iovcnt, skip, total, &sent))
		return sent;
	return coalesce(p, iov, iovcnt, skip, total, flags, clk);
}

long sv_proto_send(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   struct sv_clock *clk)
{
	int r = tx_check(p);
	if (r < 0)
		return r;
	size_t total = sv_iov_total(iov, iovcnt);
	if (total == 0)
		return 0;
	/* Large: at or above the coalescing size (or more than a message),
	 * sent at once; zero-copy from the registration threshold on, which
	 * may lie below the coalescing size: such a write is large too, or
	 * it would pass bytes that wait in the buffer. */
	bool small = total < p->prm.coalesce_size && total <= sv_pr_tx_cap(p) &&
		     total < p->prm.zcopy_threshold;
	size_t took;
	r = top_up(p, iov, iovcnt, total, small, &took);
	if (r < 0)
		return took ? (long)took : r;
	if (took == total)
		return (long)took;
	long n = send_rest(p, iov, iovcnt, took, total - took, small, flags, clk);
	if (n < 0)
		return took ? (long)took : n;
	return (long)(took + (size_t)n);
}

int sv_proto_on_send_done(struct sv_proto *p, uint32_t slot, struct sv_clock *clk)
{
	if (slot >= sv_proto_nsend(&p->prm))
		return -EINVAL;
	uint8_t kind = p->slot_kind[slot];
	p->slot_kind[slot] = SV_SLOT_CONTROL;
	/* After an abort the completion does not say the TO_RDMA arrived: it
	 * stays pending, and its echo is never written. */
	if (p->to_rdma_inflight && slot == p->to_rdma_slot && !p->error)
		p->to_rdma_inflight = false;
	if (p->fin_slot == (int32_t)slot) {
		p->fin_slot = -1;
		p->fin_done = !p->error;
	}
	if (kind != SV_SLOT_CONTROL) {
		p->inflight--;
		if (kind == SV_SLOT_ZCOPY)
			p->zc_inflight--;
	}
	sv_pr_free_slot(p, slot);
	if (p->error)
		return 0;
	/* Nagle: the last in-flight data completed, push what waited for it. */
	int fr = sv_pr_flush_if_idle(p);
	if (fr == 0)
		fr = sv_pr_fin_if_wanted(p, clk); /* a free send buffer */
	if (fr == 0 && p->drain != SV_DRAIN_NONE)
		fr = sv_pr_drain(p);
	if (fr < 0)
		return fr;
	if (p->tx_shrink_wanted)
		sv_pr_tx_shrink_if_due(p);
	/* A report that found no free send buffer may go now. */
	return sv_pr_ack_policy(p, clk);
}

/* ---- Control ---------------------------------------------------------------- */

int sv_proto_send_to_rdma(struct sv_proto *p, uint64_t tcp_end_seq, struct sv_clock *clk)
{
	(void)clk;
	if (p->error)
		return p->error;
	if (p->tx_state != SV_TX_TCP || tcp_end_seq < p->snd_nxt)
		return -EINVAL;
	int r = sv_pr_send_control(p, SV_MSG_TO_RDMA, tcp_end_seq, 2);
	if (r < 0)
		return r;
	p->snd_nxt = tcp_end_seq;
	p->tx_qp_from = tcp_end_seq;
	/* What TCP carried is TCP's to acknowledge: Nagle waits only for the
	 * peer's acknowledgment of bytes sent over the QP. */
	if (p->snd_una < tcp_end_seq)
		p->snd_una = tcp_end_seq;
	p->tx_state = SV_TX_OPEN;
	return 0;
}

/* End our sending over the QP: what was coalesced goes first, then the
 * control message at the end of the data; the direction is then in `next`. */
static int end_tx(struct sv_proto *p, uint8_t type, enum sv_tx_state next)
{
	int r = tx_check(p);
	if (r < 0)
		return r;
	r = sv_pr_flush_pending(p, SV_FLUSH_CLOSE);
	if (r < 0)
		return r;
	r = sv_pr_send_control(p, type, p->snd_nxt, 2);
	if (r < 0)
		return r;
	p->tx_state = next;
	return 0;
}

int sv_proto_send_to_tcp(struct sv_proto *p, struct sv_clock *clk)
{
	(void)clk;
	return end_tx(p, SV_MSG_TO_TCP, SV_TX_TCP);
}

int sv_proto_send_fin(struct sv_proto *p, struct sv_clock *clk)
{
	(void)clk;
	int r = end_tx(p, SV_MSG_FIN, SV_TX_FIN);
	if (r == 0)
		p->fin_wanted = false;
	return r;
}

int sv_proto_shutdown_tx(struct sv_proto *p, struct sv_clock *clk)
{
	int r = sv_proto_send_fin(p, clk);
	if (r != -EAGAIN)
		return r;
	p->fin_wanted = true;
	return 0;
}

int sv_proto_send_reset(struct sv_proto *p)
{
	if (p->tx_state == SV_TX_RESET || p->error)
		return 0;
	int r = sv_pr_send_control(p, SV_MSG_RESET, p->snd_nxt, 1);
	sv_proto_abort(p, -ECONNRESET);
	return r == -EAGAIN ? 0 : r;
}
