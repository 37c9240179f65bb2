/* The protocol core's receiving: checking and taking each message as it
 * completes, and the application's reads. The receive side of BACK and
 * RETURN is in proto_back.c. */
#include "proto.h"
#include "proto_int.h"

#include "copy.h"
#include "iov.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

int sv_pr_post_recv(struct sv_proto *p, uint32_t buf)
{
	/* Buffers that never grow are at buf_size in the start pool. */
	bool growable = p->start_max < p->payload_max;
	bool big = p->st.rx_grown && growable;
	int r = p->xp.ops->post_recv(p->xp.ctx, buf, big);
	if (r < 0 || !growable)
		return r;
	if (p->rx_big[buf] != big) {
		p->rx_big[buf] = big;
		if (big)
			p->rx_big_count++;
		else if (--p->rx_big_count == 0) {
			/* The last large buffer came back after the peer's
			 * DRAIN: none is posted or holds a message. */
			p->xp.ops->shrink(p->xp.ctx, true);
			p->st.rx_shrinks++;
		}
	}
	return 0;
}

/* A control message's buffer is free again at once. */
int sv_pr_repost_control(struct sv_proto *p, uint32_t buf)
{
	int r = sv_pr_post_recv(p, buf);
	if (r < 0)
		return sv_proto_abort(p, r);
	p->unreported++;
	return 0;
}

/* ---- Growing the receive buffers ------------------------------------------ */

/* Full DATA messages in a row after which the receive buffers grow: the
 * peer has more to send than they hold (bulk, or writes larger than them),
 * where a request and its answer end with a part-filled message. */
#define SV_GROW_AFTER 4

void sv_pr_rx_grow_if_due(struct sv_proto *p)
{
	if (p->unreported || p->error)
		return;
	if (p->rx_shrink_wanted) {
		/* After the peer's DRAIN: the set-up's size from now on. The
		 * large buffers still posted go as messages consume them
		 * (sv_pr_post_recv). */
		p->rx_shrink_wanted = false;
		bool grown = p->st.rx_grown;
		p->st.rx_grown = false;
		p->rx_code = 0;
		/* Grown but none posted at the new size yet: sv_pr_post_recv
		 * will never see a last large buffer come back, so the pool
		 * goes now. */
		if (grown && !p->rx_big_count && p->start_max < p->payload_max) {
			p->xp.ops->shrink(p->xp.ctx, true);
			p->st.rx_shrinks++;
		}
		return;
	}
	if (!p->rx_grow_wanted || p->st.rx_grown)
		return;
	p->rx_grow_wanted = false;
	int r = p->xp.ops->grow ? p->xp.ops->grow(p->xp.ctx, true) : -EOPNOTSUPP;
	if (r == 0) {
		p->st.rx_grown = true; /* every buffer posted from now on */
		p->st.rx_grows++;
		p->rx_code = sv_size_code(p->payload_max);
	}
	else
		p->st.grow_refused++;
}

/* A DATA message of `len` bytes in `buf`: a run of full ones asks for
 * larger buffers. */
static void rx_size_hint(struct sv_proto *p, uint32_t buf, uint32_t len)
{
	/* Not while large buffers from before a DRAIN are still posted: the
	 * transport has one pool of them. */
	if (p->st.rx_grown || p->rx_big_count || p->rx_shrink_wanted || !p->xp.ops->grow)
		return;
	if (len < sv_pr_rx_cap(p, buf)) {
		p->rx_full_run = 0;
		return;
	}
	if (++p->rx_full_run < SV_GROW_AFTER)
		return;
	p->rx_full_run = 0;
	p->rx_grow_wanted = true;
	sv_pr_rx_grow_if_due(p);
}

/* The peer reported `n` more of its buffers, of the size `code` says
 * (struct sv_hdr): they queue behind the ones we hold credits for. A size
 * smaller than the last one reported (unless our DRAIN asked for it), or
 * no size at all, is malformed. */
static int add_credits(struct sv_proto *p, uint32_t n, uint8_t code)
{
	uint32_t cap = p->peer_start_cap;
	if (code) {
		if (code < SV_SIZE_CODE_MIN || code > SV_SIZE_CODE_MAX)
			return sv_pr_malformed(p);
		cap = 1u << code;
	}
	if (!n)
		return 0;
	struct sv_credit_run *tail = &p->runs[(p->run_head + p->run_count - 1) % SV_RUNS];
	if (cap < tail->cap && sv_pr_peer_shrank(p, cap) < 0)
		return p->error;
	p->credits += n;
	if (cap == tail->cap) {
		tail->n += n;
	} else if (p->run_count == 1 && tail->n == 0) {
		*tail = (struct sv_credit_run){.cap = cap, .n = n};
	} else if (p->run_count == SV_RUNS) {
		/* Sizes grow from one run to the next, but once after each
		 * DRAIN: far fewer runs than SV_RUNS are ever held. */
		return sv_pr_malformed(p);
	} else {
		p->runs[(p->run_head + p->run_count) % SV_RUNS] = (struct sv_credit_run){cap, n};
		p->run_count++;
	}
	if (cap > p->peer_start_cap)
		sv_pr_idle_arm(p); /* grown buffers: given back when we go idle */
	/* The peer's buffers are larger than ours: ours may follow. */
	if (cap > p->start_max && !p->st.tx_grown && !p->tx_grow_tried && p->xp.ops->grow) {
		p->tx_grow_tried = true;
		if (p->xp.ops->grow(p->xp.ctx, false) == 0) {
			p->st.tx_grown = true;
			p->st.tx_grows++;
		} else {
			p->st.grow_refused++;
		}
	}
	return 0;
}

/* The buffer a receive call empties last is held back and reposted by the
 * next receive call, a timer pass, an UPDATE or a BACK: posting it is on
 * the way from a message's arrival to the application's reply, and the
 * next call comes while the reply travels. Its credit is reported one
 * message later; the window is one buffer smaller meanwhile, and the ACK
 * policy counts it as consumed from the start (docs/protocol.md, 5). */
int sv_pr_rx_release(struct sv_proto *p)
{
	if (p->rx_held < 0)
		return 0;
	uint32_t buf = (uint32_t)p->rx_held;
	p->rx_held = -1;
	if (p->error)
		return 0; /* a broken connection gets no buffers back */
	return sv_pr_repost_control(p, buf);
}

/* ---- Messages as they arrive ---------------------------------------------- */

/* The peer's bytes flow to the QP while it is the medium or a TO_RDMA has
 * announced it, until a TO_TCP or FIN ends them, and never after its BACK. */
static bool qp_part(const struct sv_proto *p)
{
	return ((p->rx_on_qp && !p->rx_switch_pending) || p->peer_to_rdma) && !p->peer_back;
}

/* Room for more unread messages than there are buffers (stashed ones). */
int sv_pr_rxq_grow(struct sv_proto *p)
{
	uint32_t ncap = p->rxq_cap * 2;
	struct sv_rx_slot *n = calloc(ncap, sizeof(*n));
	if (!n)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->rxq_count; i++)
		n[i] = *sv_pr_rxq_at(p, i);
	free(p->rxq);
	p->rxq = n;
	p->rxq_head = 0;
	p->rxq_cap = ncap;
	return 0;
}

void sv_pr_slot_done(struct sv_proto *p, struct sv_rx_slot *s)
{
	p->stashed -= s->len;
	p->stashed_msgs--;
	free(s->heap);
	s->heap = NULL;
}

/* An application that does not read keeps the peer's messages in our
 * receive buffers, and without their credits the peer cannot send: the
 * bytes a writer can put out before its reader reads would be the window's
 * buffers, a few KiB while they are small. So, as the kernel's receive
 * buffer does, a message that arrives when most data buffers hold unread
 * messages moves to memory of its own and its buffer goes back to the
 * peer, up to window x buf_size bytes (what the buffers held at their
 * largest): what a writer may send ahead of its reader does not depend on
 * the pinned memory. It costs one copy, and only while the reader lags.
 * Buffers that never grow hold that much anyway: they never stash. */
static int stash_if_lagging(struct sv_proto *p, struct sv_rx_slot *s)
{
	if (p->start_max == p->payload_max)
		return 0;
	uint32_t in_buffers = p->rxq_count - p->stashed_msgs;
	if (in_buffers < p->prm.window / 2 ||
	    p->stashed + s->len > (size_t)p->prm.window * p->payload_max)
		return 0;
	uint8_t *copy = malloc(s->len);
	if (!copy)
		return 0; /* it waits in its buffer */
	sv_copy(copy, sv_pr_rx_payload(p, s->buf), s->len);
	s->heap = copy;
	p->stashed += s->len;
	p->stashed_msgs++;
	sv_pr_consumed(p, s->len < p->prm.coalesce_size);
	return sv_pr_repost_control(p, s->buf);
}

static int on_data(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	/* Stream offsets never wrap: bytes past 2^64 (a TO_RDMA may announce
	 * any offset) are no stream's, and would wrap rcv_nxt below rcv_read. */
	if (!qp_part(p) || p->rx_fin || h->len == 0 || h->seq != p->rcv_nxt ||
	    h->len > UINT64_MAX - h->seq)
		return sv_pr_malformed(p);
	p->rcv_nxt += h->len;
	p->st.rx_data_msgs++;
	rx_size_hint(p, buf, h->len);
	p->st.rx_bytes += h->len;
	if (p->back_sent) {
		/* Sent before the peer saw our BACK: it goes back. Only the
		 * credits it held then can carry such DATA, one buffer of ours
		 * each; a peer that sends on regardless would fill our
		 * memory. */
		if (++p->rx_after_back > sv_pr_nrecv(p))
			return sv_pr_malformed(p);
		int r = sv_pr_ret_append(p, sv_pr_rx_payload(p, buf), h->len);
		if (r == 0)
			r = sv_pr_repost_control(p, buf);
		sv_pr_consumed(p, h->len < p->prm.coalesce_size);
		p->rcv_read += h->len;
		return r;
	}
	if (p->rxq_count == p->rxq_cap && sv_pr_rxq_grow(p) < 0)
		return sv_proto_abort(p, -ENOMEM);
	struct sv_rx_slot *s = sv_pr_rxq_at(p, p->rxq_count);
	*s = (struct sv_rx_slot){.buf = buf, .len = h->len};
	p->rxq_count++;
	return stash_if_lagging(p, s);
}

static int on_to_rdma(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	/* Only while the peer's bytes go to TCP, once per switch. */
	if (h->len != 0 || p->peer_to_rdma || p->rx_fin || qp_part(p) || h->seq < p->rcv_nxt)
		return sv_pr_malformed(p);
	p->peer_to_rdma = true;
	p->peer_to_rdma_seq = h->seq;
	p->rcv_nxt = h->seq;
	return sv_pr_repost_control(p, buf);
}

static int on_to_tcp(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	if (h->len != 0 || !qp_part(p) || p->rx_fin || p->rx_switch_pending ||
	    h->seq != p->rcv_nxt)
		return sv_pr_malformed(p);
	p->rx_switch_pending = true;
	p->rx_switch_seq = h->seq;
	if (p->rx_on_qp && !p->peer_to_rdma && p->rcv_read == h->seq) {
		p->rx_on_qp = false; /* nothing left before it: on TCP now */
		p->rx_switch_pending = false;
	}
	return sv_pr_repost_control(p, buf);
}

static int on_fin(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	if (h->len != 0 || !qp_part(p) || p->rx_fin || h->seq != p->rcv_nxt)
		return sv_pr_malformed(p);
	p->rx_fin = true;
	p->rx_fin_seq = h->seq;
	return sv_pr_repost_control(p, buf);
}

static int on_message(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	switch ((enum sv_msg_type)h->type) {
	case SV_MSG_DATA:
		return on_data(p, h, buf);
	case SV_MSG_UPDATE:
		if (h->len != 0)
			return sv_pr_malformed(p);
		return sv_pr_repost_control(p, buf);
	case SV_MSG_TO_RDMA:
		return on_to_rdma(p, h, buf);
	case SV_MSG_TO_TCP:
		return on_to_tcp(p, h, buf);
	case SV_MSG_FIN:
		return on_fin(p, h, buf);
	case SV_MSG_BACK:
		return sv_pr_on_back(p, h, buf);
	case SV_MSG_RETURN:
		return sv_pr_on_return(p, h, buf);
	case SV_MSG_RESET:
		p->peer_reset = true;
		p->reset_by_peer = true;
		return sv_proto_abort(p, -ECONNRESET);
	case SV_MSG_DRAIN:
		if (h->len != 0)
			return sv_pr_malformed(p);
		return sv_pr_on_drain(p, buf);
	}
	return sv_pr_malformed(p);
}

/* The header's accounting: credits, the acknowledgment. It sends nothing:
 * a send that fails aborts the core, and the message must be taken first
 * (its bytes are the peer's, completed there: the resume counts them). */
static int take_header(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf,
		       uint32_t byte_len, bool *acked)
{
	if (byte_len != SV_HDR_SIZE + (uint64_t)h->len || h->len > sv_pr_rx_cap(p, buf))
		return sv_pr_malformed(p);
	/* Our view of the peer's credits: it spent one on this message. */
	if (p->peer_credits == 0)
		return sv_pr_malformed(p); /* it sent without a credit */
	p->peer_credits--;
	if ((uint64_t)p->credits + h->credits > p->peer_nrecv)
		return sv_pr_malformed(p); /* more buffers than the peer has */
	if (h->ack > p->snd_nxt)
		return sv_pr_malformed(p); /* acknowledges bytes we never sent */
	int r = add_credits(p, h->credits, h->flags);
	if (r < 0)
		return r;
	p->st.rx_msgs++;
	*acked = h->ack > p->snd_una;
	if (*acked)
		p->snd_una = h->ack;
	return 0;
}

int sv_proto_on_recv(struct sv_proto *p, uint32_t buf, uint32_t byte_len, struct sv_clock *clk)
{
	if (p->error)
		return sv_pr_on_recv_late(p, buf, byte_len);
	if (buf >= sv_pr_nrecv(p) || byte_len < SV_HDR_SIZE)
		return sv_pr_malformed(p);
	struct sv_hdr h;
	sv_hdr_decode(p->xp.ops->recv_buf(p->xp.ctx, buf), &h);
	bool acked = false;
	int r = take_header(p, &h, buf, byte_len, &acked);
	if (r == 0)
		r = on_message(p, &h, buf);
	if (r == 0 && acked)
		r = sv_pr_flush_if_idle(p); /* Nagle: everything acknowledged */
	if (r < 0)
		return r;
	/* New credits may release data that waited for them, then DRAINs. */
	r = sv_pr_tx_release(p, clk);
	if (r == 0 && p->drain != SV_DRAIN_NONE)
		r = sv_pr_drain(p);
	if (r < 0)
		return r;
	return sv_pr_ack_policy(p, clk);
}

/* ---- The switch of the receive side ----------------------------------------- */

int sv_proto_rx_accept(struct sv_proto *p)
{
	if (p->error)
		return p->error;
	if (p->rx_on_qp || !p->peer_to_rdma)
		return -EINVAL;
	p->peer_to_rdma = false;
	p->rx_on_qp = true;
	p->rcv_read = p->peer_to_rdma_seq;
	if (p->rx_switch_pending && p->rcv_read == p->rx_switch_seq) {
		p->rx_on_qp = false; /* it announced a QP part and ended it empty */
		p->rx_switch_pending = false;
	}
	return 0;
}

void sv_proto_rx_refuse(struct sv_proto *p)
{
	p->peer_to_rdma = false;
}

/* ---- The application's reads ---------------------------------------------- */

/* Where the QP part of the receive stream ends. */
static uint64_t rx_limit(const struct sv_proto *p)
{
	uint64_t lim = UINT64_MAX;
	if (p->rx_switch_pending)
		lim = p->rx_switch_seq;
	if (p->rx_fin && p->rx_fin_seq < lim)
		lim = p->rx_fin_seq;
	return lim;
}

/* Bytes the QP delivered stay readable after an error when they are
 * whole: the peer's bytes before its FIN (after the FIN every one of them
 * is here: RC delivers in order), and, when the QP was lost, everything it
 * delivered (the stream reads TCP after it). An error is reported once
 * they are read. */
static bool rx_held_after_error(const struct sv_proto *p)
{
	if (p->rx_fin && p->rcv_read < p->rx_fin_seq)
		return true;
	return p->rx_lost && p->rx_on_qp && p->rcv_read < rx_limit(p);
}

uint64_t sv_proto_readable(const struct sv_proto *p)
{
	if (!sv_proto_rx_on_qp(p) || (p->error && !rx_held_after_error(p)))
		return 0;
	uint64_t end = rx_limit(p);
	if (end > p->rcv_nxt)
		end = p->rcv_nxt;
	return end - p->rcv_read;
}

/* Copy from one queued message into the iovec at (*vi, *voff). */
static size_t copy_out(const struct sv_proto *p, const struct sv_rx_slot *s,
		       const struct iovec *iov, int iovcnt, int *vi, size_t *voff)
{
	const uint8_t *src = sv_pr_slot_payload(p, s) + s->off;
	size_t avail = s->len - s->off, took = 0;
	while (took < avail && *vi < iovcnt) {
		size_t room = iov[*vi].iov_len - *voff;
		size_t n = avail - took < room ? avail - took : room;
		sv_copy((uint8_t *)iov[*vi].iov_base + *voff, src + took, n);
		took += n;
		*voff += n;
		if (*voff == iov[*vi].iov_len) {
			(*vi)++;
			*voff = 0;
		}
	}
	return took;
}

/* The queued messages into the iovec, at most `want` bytes. */
static long take_queued(struct sv_proto *p, const struct iovec *iov, int iovcnt, size_t want,
			bool peek)
{
	size_t done = 0, voff = 0;
	uint32_t idx = 0;
	int vi = 0;
	while (done < want && idx < p->rxq_count) {
		struct sv_rx_slot *s = sv_pr_rxq_at(p, idx);
		size_t took = copy_out(p, s, iov, iovcnt, &vi, &voff);
		done += took;
		if (peek) {
			if (took < s->len - s->off)
				break;
			idx++;
			continue;
		}
		s->off += (uint32_t)took;
		p->rcv_read += took;
		if (s->off < s->len)
			break;
		/* The buffer is consumed: give it back to the peer (not to a
		 * broken connection: only its last bytes are read). The last
		 * one of this call is held back (sv_pr_rx_release). */
		if (s->heap) {
			sv_pr_slot_done(p, s); /* its buffer went back when it was stashed */
		} else if (!p->error) {
			int r = sv_pr_rx_release(p);
			if (r < 0)
				return done ? (long)done : r; /* never lose bytes already copied */
			p->rx_held = (int32_t)s->buf;
			sv_pr_consumed(p, s->len < p->prm.coalesce_size);
		}
		sv_pr_rxq_pop(p);
	}
	return (long)done;
}

long sv_proto_recv(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   struct sv_clock *clk)
{
	if (p->error && !rx_held_after_error(p))
		return p->rx_lost && sv_proto_rx_eof(p) ? 0 : p->error; /* a lost QP after a FIN */
	/* SOVIA: a receive call pushes out what we hold back. */
	if (p->pending_slot >= 0 && !p->error) {
		int r = sv_pr_flush_pending(p, SV_FLUSH_RECV);
		if (r < 0 && r != -EAGAIN)
			return r;
	}
	int rr = sv_pr_rx_release(p); /* after the flush: that one is on a path */
	if (rr < 0)
		return rr;
	if (!sv_proto_rx_on_qp(p))
		return -EAGAIN; /* detached: the peer writes the rest on TCP */

	bool peek = flags & MSG_PEEK;
	size_t want = sv_iov_total(iov, iovcnt);
	uint64_t lim = rx_limit(p);
	if (lim - p->rcv_read < want)
		want = (size_t)(lim - p->rcv_read);
	long done = take_queued(p, iov, iovcnt, want, peek);
	if (done < 0)
		return done;
	if (!peek && p->rx_switch_pending && p->rcv_read == p->rx_switch_seq) {
		p->rx_on_qp = false; /* the rest of the stream comes from TCP */
		p->rx_switch_pending = false;
	}
	if (!peek) {
		int r = sv_pr_ack_policy(p, clk);
		if (r < 0 && !done)
			return r;
	}
	if (done)
		return done;
	if (sv_proto_rx_eof(p))
		return 0;
	if (!p->rx_on_qp)
		return -EAGAIN; /* switched to TCP */
	return sv_iov_total(iov, iovcnt) ? -EAGAIN : 0;
}
