/* The protocol core's way back (docs/protocol.md, section 10): BACK, the
 * RETURNs and the bytes owed to TCP, both ways. */
#include "proto.h"
#include "proto_int.h"

#include "bytebuf.h"
#include "le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sv_pr_ret_append(struct sv_proto *p, const void *data, size_t len)
{
	int r = sv_bytes_append(&p->ret_buf, &p->ret_len, &p->ret_cap, data, len);
	return r < 0 ? sv_proto_abort(p, r) : 0;
}

/* Once every returned byte is in (our stream up to our BACK's seq), the
 * bytes that never went over the QP follow them on TCP. */
int sv_pr_owed_tail(struct sv_proto *p)
{
	if (!p->tail_len || !p->back_sent || !p->peer_back || p->owed_nxt != p->back_seq)
		return 0;
	if (sv_bytes_append(&p->owed, &p->owed_len, &p->owed_cap, p->tail, p->tail_len) < 0)
		return sv_proto_abort(p, -ENOMEM);
	free(p->tail);
	p->tail = NULL;
	p->tail_len = p->tail_cap = 0;
	return 0;
}

/* ---- Receiving BACK and RETURN ---------------------------------------------- */

/* What the peer gives back is what it holds unread: from the QP, no more
 * than its receive buffers (the credits we had) and as much again moved
 * out of them for a lagging reader (proto_rx.c, stash_if_lagging), each
 * at most the largest size a buffer grows to; from TCP, bytes before our
 * switch point that its reads ahead took, which the switch's bound
 * limits. A BACK claiming less consumed would have us write again, on
 * TCP, bytes it long had, and hold them meanwhile: never more than
 * SV_BACK_UNREAD_MAX, whatever buffers the peer claims (only a window of
 * hundreds of MiB-sized buffers, pinned, lags that far honestly). */
static bool back_x_plausible(const struct sv_proto *p, uint64_t x, uint64_t ack)
{
	uint64_t qp_from = x > p->tx_qp_from ? x : p->tx_qp_from;
	uint64_t window = (uint64_t)p->peer_nrecv << (SV_SIZE_CODE_MAX + 1);
	if (window > SV_BACK_UNREAD_MAX)
		window = SV_BACK_UNREAD_MAX;
	if (ack > qp_from && ack - qp_from > window)
		return false;
	return x >= p->tx_qp_from || p->tx_qp_from - x <= p->tcp_ahead_max;
}

int sv_pr_on_back(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	/* After the peer's data (and its FIN, if any), over the QP. */
	if (h->len != SV_BACK_PAYLOAD || p->peer_back || !p->rx_on_qp || p->peer_to_rdma ||
	    p->rx_switch_pending || h->seq != p->rcv_nxt)
		return sv_pr_malformed(p);
	if (p->rx_fin && h->seq != p->rx_fin_seq)
		return sv_pr_malformed(p);
	uint64_t x = sv_get64(sv_pr_rx_payload(p, buf));
	/* It cannot have consumed more of our bytes than it received. */
	if (x > h->ack || (p->back_sent && x > p->back_seq) || !back_x_plausible(p, x, h->ack))
		return sv_pr_malformed(p);
	p->peer_back = true;
	p->peer_back_seq = h->seq;
	p->peer_back_x = x;
	p->owed_nxt = x;
	int r = sv_pr_repost_control(p, buf);
	return r < 0 ? r : sv_pr_owed_tail(p);
}

int sv_pr_on_return(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf)
{
	/* Only after both BACKs, in order, within what we sent. */
	if (!p->back_sent || !p->peer_back || h->len == 0 || h->seq != p->owed_nxt ||
	    h->seq + h->len > p->back_seq)
		return sv_pr_malformed(p);
	if (sv_bytes_append(&p->owed, &p->owed_len, &p->owed_cap, sv_pr_rx_payload(p, buf),
			    h->len) < 0)
		return sv_proto_abort(p, -ENOMEM);
	p->owed_nxt += h->len;
	p->st.got_back += h->len;
	sv_pr_consumed(p, true); /* like consumed data: the ACK policy reports it */
	int r = sv_pr_repost_control(p, buf);
	return r < 0 ? r : sv_pr_owed_tail(p);
}

/* ---- Sending BACK and RETURN ---------------------------------------------------- */

/* Writes collected without a data credit (both windows may be full): they
 * never go over the QP, but follow the bytes given back on TCP. */
static int keep_pending_as_tail(struct sv_proto *p)
{
	if (p->pending_slot < 0)
		return 0;
	const uint8_t *b = sv_pr_tx_payload(p, (uint32_t)p->pending_slot);
	if (sv_bytes_append(&p->tail, &p->tail_len, &p->tail_cap, b, p->pending_len) < 0)
		return sv_proto_abort(p, -ENOMEM);
	sv_pr_free_slot(p, sv_pr_take_pending(p));
	return 0;
}

/* What our application has not read moves out of the receive buffers,
 * which go back to the peer at once (their credits ride on the BACK): with
 * both windows full, the returns could not go otherwise. */
static int give_back_unread(struct sv_proto *p, const void *prefix, size_t prefix_len)
{
	if (prefix_len && sv_pr_ret_append(p, prefix, prefix_len) < 0)
		return p->error;
	int r = sv_pr_rx_release(p);
	if (r < 0)
		return r;
	while (p->rxq_count) {
		struct sv_rx_slot *rs = sv_pr_rxq_at(p, 0);
		if (sv_pr_ret_append(p, sv_pr_slot_payload(p, rs) + rs->off, rs->len - rs->off) < 0)
			return p->error;
		p->rcv_read += rs->len - rs->off;
		if (rs->heap) {
			sv_pr_slot_done(p, rs); /* its buffer went back when it was stashed */
		} else {
			r = sv_pr_repost_control(p, rs->buf);
			if (r < 0)
				return r;
			sv_pr_consumed(p, rs->len < p->prm.coalesce_size);
		}
		sv_pr_rxq_pop(p);
	}
	return 0;
}

int sv_proto_send_back(struct sv_proto *p, const void *prefix, size_t prefix_len,
		       struct sv_clock *clk)
{
	(void)clk;
	if (p->error)
		return p->error;
	if (!sv_proto_back_ready(p) || prefix_len > p->rcv_read)
		return -EINVAL;
	int r = sv_pr_flush_pending(p, SV_FLUSH_CLOSE);
	if (r < 0 && r != -EAGAIN)
		return r;
	if (p->credits < 2 || p->nfree + (p->pending_slot >= 0) == 0)
		return -EAGAIN;
	r = keep_pending_as_tail(p);
	if (r < 0)
		return r;
	uint64_t x = p->rcv_read - prefix_len;
	r = give_back_unread(p, prefix, prefix_len);
	if (r < 0)
		return r;
	uint32_t slot = 0;
	sv_pr_take_slot(p, &slot); /* one is free: checked above */
	sv_put64(sv_pr_tx_payload(p, slot), x);
	uint64_t seq = p->snd_nxt;
	r = sv_pr_post(p, slot, SV_MSG_BACK, seq, SV_BACK_PAYLOAD, NULL, 0);
	if (r < 0)
		return r;
	p->back_sent = true;
	p->back_seq = seq;
	p->back_x = x;
	p->ret_nxt = x;
	p->tx_state = SV_TX_BACK;
	return sv_pr_owed_tail(p);
}

void sv_proto_back_points(const struct sv_proto *p, uint64_t *tx, uint64_t *rx)
{
	*tx = p->peer_back_x;
	*rx = p->back_x;
}

bool sv_proto_back_wanted(const struct sv_proto *p)
{
	return p->peer_back && !p->back_sent && !p->error;
}

int sv_proto_send_returns(struct sv_proto *p, struct sv_clock *clk)
{
	if (p->error)
		return p->error;
	if (!p->back_sent || !p->peer_back)
		return -EAGAIN;
	if (p->back_x + p->ret_len != p->peer_back_seq)
		return sv_proto_abort(p, -EPROTO); /* all it sent before its BACK came first */
	while (p->ret_nxt < p->peer_back_seq) {
		if (!sv_pr_can_send_data(p)) {
			p->st.credit_stalls++;
			return -EAGAIN;
		}
		uint32_t slot = 0;
		sv_pr_take_slot(p, &slot);
		uint64_t want = p->peer_back_seq - p->ret_nxt;
		uint32_t cap = sv_pr_msg_cap(p, slot);
		uint32_t n = want < cap ? (uint32_t)want : cap;
		memcpy(sv_pr_tx_payload(p, slot), p->ret_buf + (p->ret_nxt - p->back_x), n);
		int r = sv_pr_post(p, slot, SV_MSG_RETURN, p->ret_nxt, n, NULL, 0);
		if (r < 0)
			return r;
		p->ret_nxt += n;
		p->st.gave_back += n;
	}
	return sv_pr_ack_policy(p, clk);
}

void sv_proto_owed(const struct sv_proto *p, const void **buf, size_t *len)
{
	*buf = p->owed ? p->owed + p->owed_off : NULL;
	*len = p->owed_len - p->owed_off;
}

void sv_proto_owed_consume(struct sv_proto *p, size_t n)
{
	p->owed_off += n;
	if (p->owed_off == p->owed_len)
		p->owed_off = p->owed_len = 0;
}

bool sv_proto_back_done(const struct sv_proto *p)
{
	return p->back_sent && p->peer_back && p->ret_nxt == p->peer_back_seq &&
	       p->owed_nxt == p->back_seq && !p->tail_len && sv_proto_sends_done(p);
}
