/* The protocol core's receiving: checking and taking each message as it
 * completes, and the application's reads. The receive side of BACK and
 * RETURN is in proto_back.c. */
#include "proto.h"
#include "proto_int.h"

#include "copy.h"
#include "iov.h"

#include <errno.h>
#include <sys/socket.h>

/* A control message's buffer is free again at once. */
int sv_pr_repost_control(struct sv_proto *p, uint32_t buf)
{
	int r = p->xp.ops->post_recv(p->xp.ctx, buf);
	if (r < 0)
		return sv_proto_abort(p, r);
	p->unreported++;
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

static int on_data(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	if (!qp_part(p) || p->rx_fin || h->len == 0 || h->seq != p->rcv_nxt)
		return sv_pr_malformed(p);
	p->rcv_nxt += h->len;
	p->st.rx_data_msgs++;
	p->st.rx_bytes += h->len;
	if (p->back_sent) {
		/* Sent before the peer saw our BACK: it goes back. */
		int r = sv_pr_ret_append(p, sv_pr_rx_payload(p, buf), h->len);
		if (r == 0)
			r = sv_pr_repost_control(p, buf);
		sv_pr_consumed(p, h->len < p->prm.coalesce_size);
		p->rcv_read += h->len;
		return r;
	}
	struct sv_rx_slot *s = &p->rxq[(p->rxq_head + p->rxq_count) % sv_pr_nrecv(p)];
	s->buf = buf;
	s->off = 0;
	s->len = h->len;
	p->rxq_count++;
	return 0;
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
		return sv_proto_abort(p, -ECONNRESET);
	}
	return sv_pr_malformed(p);
}

/* The header's accounting: credits, the acknowledgment. */
static int take_header(struct sv_proto *p, const struct sv_hdr *h, uint32_t byte_len)
{
	if (h->flags != 0 || byte_len != SV_HDR_SIZE + (uint64_t)h->len || h->len > p->payload_max)
		return sv_pr_malformed(p);
	/* Our view of the peer's credits: it spent one on this message. */
	if (p->peer_credits == 0)
		return sv_pr_malformed(p); /* it sent without a credit */
	p->peer_credits--;
	if ((uint64_t)p->credits + h->credits > p->peer_nrecv)
		return sv_pr_malformed(p); /* more buffers than the peer has */
	if (h->ack > p->snd_nxt)
		return sv_pr_malformed(p); /* acknowledges bytes we never sent */
	p->credits += h->credits;
	p->st.rx_msgs++;
	if (h->ack > p->snd_una) {
		p->snd_una = h->ack;
		return sv_pr_flush_if_idle(p); /* Nagle: everything acknowledged */
	}
	return 0;
}

int sv_proto_on_recv(struct sv_proto *p, uint32_t buf, uint32_t byte_len, struct sv_clock *clk)
{
	if (p->error)
		return p->error;
	if (buf >= sv_pr_nrecv(p) || byte_len < SV_HDR_SIZE)
		return sv_pr_malformed(p);
	struct sv_hdr h;
	sv_hdr_decode(p->xp.ops->recv_buf(p->xp.ctx, buf), &h);
	int r = take_header(p, &h, byte_len);
	if (r == 0)
		r = on_message(p, &h, buf);
	if (r < 0)
		return r;
	/* New credits may release data that waited for them. */
	r = sv_pr_tx_release(p, clk);
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
	const uint8_t *src = sv_pr_rx_payload(p, s->buf) + s->off;
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
	uint32_t idx = p->rxq_head, left = p->rxq_count;
	int vi = 0;
	while (done < want && left > 0) {
		struct sv_rx_slot *s = &p->rxq[idx];
		size_t took = copy_out(p, s, iov, iovcnt, &vi, &voff);
		done += took;
		if (peek) {
			if (took < s->len - s->off)
				break;
			idx = (idx + 1) % sv_pr_nrecv(p);
			left--;
			continue;
		}
		s->off += (uint32_t)took;
		p->rcv_read += took;
		if (s->off < s->len)
			break;
		/* The buffer is consumed: give it back to the peer (not to a
		 * broken connection: only its last bytes are read). The last
		 * one of this call is held back (sv_pr_rx_release). */
		if (!p->error) {
			int r = sv_pr_rx_release(p);
			if (r < 0)
				return done ? (long)done : r; /* never lose bytes already copied */
			p->rx_held = (int32_t)s->buf;
			sv_pr_consumed(p, s->len < p->prm.coalesce_size);
		}
		p->rxq_head = (p->rxq_head + 1) % sv_pr_nrecv(p);
		p->rxq_count--;
		idx = p->rxq_head;
		left = p->rxq_count;
	}
	return (long)done;
}

long sv_proto_recv(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   struct sv_clock *clk)
{
	if (p->error && !rx_held_after_error(p))
		return p->error;
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
