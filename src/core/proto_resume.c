/* Resuming over TCP after the QP is lost (docs/protocol.md, section 11):
 * the core's half. At the break it keeps a copy of every byte whose
 * arrival is not known (DATA in flight, coalesced bytes); the stream
 * exchanges the resume records on TCP and hands the peer's count here,
 * and our sending goes on over TCP from exactly that byte. */
#include "proto.h"
#include "proto_int.h"

#include "iov.h"

#include <stdlib.h>
#include <string.h>

/* A completed send is in the peer's memory and its completion queue (RC):
 * the peer counts it when it drains its CQ, so only the messages still in
 * flight can be missing there. They are a suffix of the stream (sends
 * complete in order), followed by the coalesced bytes that never went. */
void sv_pr_keep_unsent(struct sv_proto *p)
{
	p->kept_ok = false;
	if (p->tx_state != SV_TX_OPEN && p->tx_state != SV_TX_FIN)
		return;
	uint32_t ns = sv_proto_nsend(&p->prm);
	uint64_t from = p->snd_nxt, covered = 0;
	for (uint32_t i = 0; i < ns; i++) {
		if (p->slot_kind[i] == SV_SLOT_CONTROL)
			continue;
		if (p->slot_data[i].seq < from)
			from = p->slot_data[i].seq;
		covered += p->slot_data[i].len;
	}
	if (covered != p->snd_nxt - from)
		return; /* not one run up to snd_nxt: cannot happen with in-order completions */
	size_t pend = p->pending_slot >= 0 ? p->pending_len : 0;
	size_t len = (size_t)covered + pend;
	uint8_t *k = len ? malloc(len) : NULL;
	if (len && !k)
		return;
	for (uint32_t i = 0; i < ns; i++) {
		if (p->slot_kind[i] == SV_SLOT_CONTROL)
			continue;
		const struct sv_slot_data *d = &p->slot_data[i];
		uint8_t *dst = k + (d->seq - from);
		if (d->iovcnt)
			sv_iov_gather(dst, d->iov, (int)d->iovcnt, 0, d->len);
		else
			memcpy(dst, sv_pr_tx_payload(p, i), d->len);
	}
	if (pend)
		memcpy(k + covered, sv_pr_tx_payload(p, (uint32_t)p->pending_slot), pend);
	free(p->kept);
	p->kept = k;
	p->kept_len = len;
	p->kept_from = from;
	p->kept_ok = true;
}

int sv_pr_on_recv_late(struct sv_proto *p, uint32_t buf, uint32_t byte_len)
{
	if (p->rx_lost || p->peer_reset || buf >= sv_pr_nrecv(p) || byte_len < SV_HDR_SIZE)
		return p->error;
	struct sv_hdr h;
	sv_hdr_decode(p->xp.ops->recv_buf(p->xp.ctx, buf), &h);
	bool in_part = p->rx_on_qp && !p->rx_switch_pending && !p->rx_fin && !p->peer_back;
	if (!in_part || h.seq != p->rcv_nxt || byte_len != SV_HDR_SIZE + (uint64_t)h.len ||
	    h.len > sv_pr_rx_cap(p, buf) || h.len > UINT64_MAX - h.seq)
		return p->error; /* as on_data: offsets never wrap */
	if (h.type == SV_MSG_FIN && h.len == 0) {
		p->rx_fin = true;
		p->rx_fin_seq = h.seq;
	} else if (h.type == SV_MSG_DATA && h.len > 0) {
		/* Stashed messages (copied out of their buffers) hold entries
		 * too: it may be full. The bytes completed at the peer, which
		 * keeps no copy: drop them and they are lost. */
		if (p->rxq_count == p->rxq_cap && sv_pr_rxq_grow(p) < 0)
			return p->error; /* the resume fails: the peer lacks them */
		*sv_pr_rxq_at(p, p->rxq_count) = (struct sv_rx_slot){.buf = buf, .len = h.len};
		p->rxq_count++;
		p->rcv_nxt += h.len;
		p->st.rx_data_msgs++;
		p->st.rx_bytes += h.len;
	}
	return p->error;
}

bool sv_proto_resumable(const struct sv_proto *p)
{
	if (p->peer_reset || p->back_sent || p->peer_back)
		return false;
	enum sv_tx_state t = p->error ? p->tx_state_at_break : p->tx_state;
	return t == SV_TX_OPEN || t == SV_TX_FIN;
}

void sv_proto_kept(const struct sv_proto *p, uint64_t *from, uint64_t *end)
{
	*from = p->kept_from;
	*end = p->kept_from + p->kept_len;
}

int sv_proto_resume_tx(struct sv_proto *p, uint64_t peer_rcv, bool *fin)
{
	*fin = p->tx_state_at_break == SV_TX_FIN;
	if (!p->error || !p->kept_ok)
		return -EIO;
	if (peer_rcv < p->kept_from || peer_rcv > p->kept_from + p->kept_len)
		return -EPROTO; /* bytes the peer lacks that we no longer have, or never sent */
	size_t skip = (size_t)(peer_rcv - p->kept_from), n = p->kept_len - skip;
	p->owed_off = p->owed_len = 0;
	if (n) {
		uint8_t *o = malloc(n);
		if (!o)
			return -ENOMEM;
		memcpy(o, p->kept + skip, n);
		free(p->owed);
		p->owed = o;
		p->owed_cap = p->owed_len = n;
	}
	p->st.resent = n;
	if (p->pending_slot >= 0) /* its bytes are in kept */
		sv_pr_free_slot(p, sv_pr_take_pending(p));
	free(p->kept);
	p->kept = NULL;
	p->kept_len = 0;
	p->tx_state = *fin ? SV_TX_FIN : SV_TX_TCP;
	return 0;
}

void sv_proto_resume_drop(struct sv_proto *p)
{
	free(p->kept);
	p->kept = NULL;
	p->kept_len = 0;
	p->kept_ok = false;
	if (p->pending_slot >= 0)
		sv_pr_free_slot(p, sv_pr_take_pending(p));
	if (p->tx_state == SV_TX_RESET)
		p->tx_state = SV_TX_TCP;
}
