/* The protocol core's way back (docs/protocol.md, section 10): BACK, the
 * RETURNs and the bytes owed to TCP. The receive side of BACK and RETURN
 * is in sv_proto_on_recv (proto.c). */
#include "proto.h"
#include "proto_int.h"

#include "bytebuf.h"
#include "le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Once every returned byte is in (our stream up to our BACK's seq), the
 * bytes that never went over the QP follow them on TCP. */
int sv_pr_owed_tail(struct sv_proto *p)
{
	if (!p->tail_len || !p->back_sent || !p->peer_back || p->owed_nxt != p->back_seq)
		return 0;
	if (sv_bytes_append(&p->owed, &p->owed_len, &p->owed_cap, p->tail, p->tail_len) < 0) {
		sv_pr_fail(p, -ENOMEM);
		return -ENOMEM;
	}
	free(p->tail);
	p->tail = NULL;
	p->tail_len = p->tail_cap = 0;
	return 0;
}

/* ---- Detaching ---------------------------------------------------------- */

int sv_proto_send_back(struct sv_proto *p, const void *prefix, size_t prefix_len,
		       uint64_t now_us)
{
	(void)now_us;
	if (p->error)
		return p->error;
	if (p->back_sent || (p->tx_state != SV_TX_OPEN && p->tx_state != SV_TX_FIN) ||
	    !p->rx_on_qp || p->peer_to_rdma || p->rx_switch_pending || prefix_len > p->rcv_read)
		return -EINVAL;
	int r = sv_pr_flush_pending(p, SV_FLUSH_CLOSE);
	if (r < 0 && r != -EAGAIN)
		return r;
	if (p->credits < 2 || p->nfree + (p->pending_slot >= 0) == 0)
		return -EAGAIN;
	if (p->pending_slot >= 0) {
		/* Writes collected without a data credit (both windows may be
		 * full): they never go over the QP, but follow the bytes
		 * given back on TCP (owed_tail). */
		const uint8_t *b = (const uint8_t *)p->xp.ops->send_buf(
					   p->xp.ctx, (uint32_t)p->pending_slot) +
				   SV_HDR_SIZE;
		if (sv_bytes_append(&p->tail, &p->tail_len, &p->tail_cap, b, p->pending_len) < 0) {
			sv_pr_fail(p, -ENOMEM);
			return -ENOMEM;
		}
		p->free_slots[p->nfree++] = (uint32_t)p->pending_slot;
		p->pending_slot = -1;
		p->pending_len = 0;
		p->pending_deadline = 0;
		p->pending_hold = false;
	}
	uint64_t x = p->rcv_read - prefix_len;
	/* What our application has not read moves out of the receive buffers,
	 * which go back to the peer at once (their credits ride on the BACK):
	 * with both windows full, the returns could not go otherwise. */
	if (prefix_len && sv_pr_ret_append(p, prefix, prefix_len) < 0)
		return p->error;
	r = sv_pr_rx_release(p);
	if (r < 0)
		return r;
	while (p->rxq_count) {
		struct sv_rx_slot *rs = &p->rxq[p->rxq_head];
		const uint8_t *src = (const uint8_t *)p->xp.ops->recv_buf(p->xp.ctx, rs->buf) +
				     SV_HDR_SIZE + rs->off;
		if (sv_pr_ret_append(p, src, rs->len - rs->off) < 0)
			return p->error;
		p->rcv_read += rs->len - rs->off;
		r = sv_pr_repost_control(p, rs->buf);
		if (r < 0)
			return r;
		sv_pr_consumed(p, rs->len < p->prm.coalesce_size);
		p->rxq_head = (p->rxq_head + 1) % sv_pr_nrecv(p);
		p->rxq_count--;
	}
	uint32_t slot = 0;
	sv_pr_take_slot(p, &slot); /* one is free: checked above */
	sv_put64((uint8_t *)p->xp.ops->send_buf(p->xp.ctx, slot) + SV_HDR_SIZE, x);
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

bool sv_proto_back_wanted(const struct sv_proto *p)
{
	return p->peer_back && !p->back_sent && !p->error;
}

int sv_proto_send_returns(struct sv_proto *p, uint64_t now_us)
{
	if (p->error)
		return p->error;
	if (!p->back_sent || !p->peer_back)
		return -EAGAIN;
	if (p->back_x + p->ret_len != p->peer_back_seq) {
		/* Everything the peer sent before its BACK arrived before it. */
		sv_pr_fail(p, -EPROTO);
		return -EPROTO;
	}
	while (p->ret_nxt < p->peer_back_seq) {
		if (!sv_pr_can_send_data(p)) {
			p->st.credit_stalls++;
			return -EAGAIN;
		}
		uint32_t slot = 0;
		sv_pr_take_slot(p, &slot);
		uint64_t want = p->peer_back_seq - p->ret_nxt;
		uint32_t n = want < p->tx_payload_max ? (uint32_t)want : p->tx_payload_max;
		memcpy((uint8_t *)p->xp.ops->send_buf(p->xp.ctx, slot) + SV_HDR_SIZE,
		       p->ret_buf + (p->ret_nxt - p->back_x), n);
		int r = sv_pr_post(p, slot, SV_MSG_RETURN, p->ret_nxt, n, NULL, 0);
		if (r < 0)
			return r;
		p->ret_nxt += n;
	}
	return sv_pr_ack_policy(p, now_us);
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
	       p->owed_nxt == p->back_seq && !p->tail_len &&
	       p->nfree + (p->pending_slot >= 0) == sv_proto_nsend(&p->prm);
}
