/* The SOVIA protocol core: its life, the wire codec, failure and the end,
 * and what the stream layer may ask of it. Sending is in proto_tx.c,
 * receiving in proto_rx.c, the ACK policy and timers in proto_ack.c, the
 * way back in proto_back.c. See proto.h for the contract and
 * docs/protocol.md for the wire format. */
#include "proto.h"
#include "proto_int.h"

#include "config.h"
#include "le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- Wire format ------------------------------------------------------ */

/* ---- Life ---------------------------------------------------------------- */

int sv_proto_init(struct sv_proto *p, const struct sv_proto_params *prm,
		  const struct sv_xport *xp)
{
	memset(p, 0, sizeof(*p));
	if (prm->buf_size <= SV_HDR_SIZE || prm->window < 2 || prm->reserve < 3 ||
	    prm->ack_delay < 1 || prm->coalesce_size < 1 ||
	    prm->coalesce_size > prm->buf_size - SV_HDR_SIZE || sv_proto_nrecv(prm) > 65535)
		return -EINVAL;
	p->prm = *prm;
	p->xp = *xp;
	p->payload_max = prm->buf_size - SV_HDR_SIZE;
	p->start_max = sv_proto_start_size(prm) - SV_HDR_SIZE;
	p->pending_slot = -1;
	p->fin_slot = -1;
	p->rx_held = -1;
	uint32_t ns = sv_proto_nsend(prm), nr = sv_proto_nrecv(prm);
	p->free_slots = calloc(ns, sizeof(*p->free_slots));
	p->slot_kind = calloc(ns, sizeof(*p->slot_kind));
	p->slot_big = calloc(ns, sizeof(*p->slot_big));
	p->slot_data = calloc(ns, sizeof(*p->slot_data));
	p->rxq = calloc(nr, sizeof(*p->rxq));
	p->rxq_cap = nr;
	p->rx_big = calloc(nr, sizeof(*p->rx_big));
	if (!p->free_slots || !p->slot_kind || !p->slot_big || !p->slot_data || !p->rxq ||
	    !p->rx_big) {
		sv_proto_destroy(p);
		return -ENOMEM;
	}
	/* Buffers that never grow are at buf_size from the start. */
	bool fixed = p->start_max == p->payload_max;
	for (uint32_t i = 0; i < ns; i++) {
		p->free_slots[p->nfree++] = ns - 1 - i;
		p->slot_big[i] = fixed;
	}
	p->st.rx_grown = p->st.tx_grown = fixed;
	for (uint32_t i = 0; i < nr; i++) {
		int r = sv_pr_post_recv(p, i);
		if (r < 0) {
			sv_proto_destroy(p);
			return r;
		}
	}
	p->credits = nr;
	p->runs[0] = (struct sv_credit_run){.cap = p->start_max, .n = nr};
	p->peer_start_cap = p->start_max;
	p->run_head = 0;
	p->run_count = 1;
	p->peer_nrecv = nr; /* until sv_proto_set_peer says otherwise */
	p->tcp_ahead_max = SV_TCP_AHEAD_DEFAULT;
	p->peer_credits = nr;
	p->tx_state = SV_TX_TCP;
	p->rx_on_qp = false;
	return 0;
}

void sv_proto_destroy(struct sv_proto *p)
{
	free(p->free_slots);
	free(p->slot_kind);
	free(p->slot_big);
	free(p->slot_data);
	free(p->kept);
	if (p->rxq)
		for (uint32_t i = 0; i < p->rxq_count; i++)
			free(sv_pr_rxq_at(p, i)->heap);
	free(p->rxq);
	free(p->rx_big);
	free(p->ret_buf);
	free(p->owed);
	free(p->tail);
	p->free_slots = NULL;
	p->slot_kind = NULL;
	p->slot_big = NULL;
	p->slot_data = NULL;
	p->kept = NULL;
	p->rxq = NULL;
	p->rx_big = NULL;
	p->ret_buf = NULL;
	p->owed = NULL;
	p->tail = NULL;
}

int sv_proto_new(struct sv_proto **out, const struct sv_proto_params *prm,
		 const struct sv_xport *xp)
{
	*out = NULL;
	struct sv_proto *p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	int r = sv_proto_init(p, prm, xp);
	if (r < 0) {
		free(p);
		return r;
	}
	*out = p;
	return 0;
}

void sv_proto_free(struct sv_proto *p)
{
	if (!p)
		return;
	sv_proto_destroy(p);
	free(p);
}

void sv_proto_set_tcp_ahead(struct sv_proto *p, uint64_t bytes)
{
	p->tcp_ahead_max = bytes;
}

int sv_proto_set_peer(struct sv_proto *p, uint32_t peer_nrecv, uint32_t peer_buf_size)
{
	if (peer_nrecv <= p->prm.reserve || peer_nrecv > SV_WINDOW_MAX + SV_RESERVE ||
	    peer_buf_size <= SV_HDR_SIZE)
		return -EINVAL;
	p->credits = peer_nrecv;
	p->peer_nrecv = peer_nrecv;
	p->runs[0] = (struct sv_credit_run){.cap = peer_buf_size - SV_HDR_SIZE, .n = peer_nrecv};
	p->peer_start_cap = peer_buf_size - SV_HDR_SIZE;
	p->run_head = 0;
	p->run_count = 1;
	return 0;
}

int sv_proto_set_nodelay(struct sv_proto *p, bool on, struct sv_clock *clk)
{
	p->prm.coalesce = !on;
	if (!on || p->tx_state != SV_TX_OPEN)
		return 0;
	return sv_proto_flush(p, SV_FLUSH_NODELAY, clk);
}

int sv_proto_set_cork(struct sv_proto *p, bool on, struct sv_clock *clk)
{
	p->cork = on;
	if (on || p->tx_state != SV_TX_OPEN)
		return 0;
	return sv_proto_flush(p, SV_FLUSH_CLOSE, clk);
}

const struct sv_proto_params *sv_proto_params(const struct sv_proto *p)
{
	return &p->prm;
}

void sv_proto_offsets(const struct sv_proto *p, uint64_t *snd_nxt, uint64_t *rcv_nxt,
		      uint64_t *rcv_read)
{
	*snd_nxt = p->snd_nxt;
	*rcv_nxt = p->rcv_nxt;
	*rcv_read = p->rcv_read;
}

const struct sv_proto_stats *sv_proto_stats(const struct sv_proto *p)
{
	return &p->st;
}

/* ---- Failure and the end ------------------------------------------------ */

int sv_proto_abort(struct sv_proto *p, int err)
{
	if (!p->error) {
		p->error = err < 0 ? err : -ECONNRESET;
		/* What is in flight now comes back flushed, if at all: its
		 * completion will not say whether it arrived. */
		p->tx_lost = p->inflight > 0;
		p->tx_state_at_break = p->tx_state;
		sv_pr_keep_unsent(p);
	}
	/* A sending direction on TCP (no TO_RDMA yet, or back after a TO_TCP)
	 * is not the QP's: its bytes go on over TCP whatever became of the
	 * QP, and the stream layer decides what the break means for it. */
	if (p->tx_state != SV_TX_TCP)
		p->tx_state = SV_TX_RESET;
	return p->error;
}

int sv_proto_error(const struct sv_proto *p)
{
	return p->error;
}

int sv_pr_malformed(struct sv_proto *p)
{
	p->peer_reset = true; /* a peer that breaks the rules gets a reset, not a resume */
	sv_proto_abort(p, -ECONNRESET);
	return -ECONNRESET;
}

/* The peer is done with the QP: its FIN has arrived over it, and no DATA
 * of ours is still in flight (completions come in order, so all of it
 * arrived). Our sending has ended (FIN posted, or moved back to TCP) or is
 * still open: then the peer went first (closed, or exited and its QP with
 * it). Either way a disconnect is the normal end, and the flushed work
 * requests carry nothing anyone needs: an UPDATE, our FIN after the peer no
 * longer cared, receive buffers no message will fill. The data the peer
 * sent stays readable up to its EOF: this is no reset.
 *
 * Our FIN may still be in flight: both ends closed at once, and the peer,
 * done first, disconnected. Only the FIN is in question then, never a
 * byte: a peer that closed needs none, and one whose QP failed while it
 * still read resumes over TCP and is answered there (fin_unsure). */
static bool nothing_lost(const struct sv_proto *p)
{
	return p->rx_fin && p->inflight == 0 &&
	       (p->tx_state == SV_TX_FIN || p->tx_state == SV_TX_TCP ||
		p->tx_state == SV_TX_OPEN);
}

bool sv_proto_peer_ended(struct sv_proto *p)
{
	if (p->error)
		return false;
	/* The first flush of the end closes an open direction, after which
	 * nothing_lost no longer holds (RESET): the flag carries the verdict
	 * to the rest of the flushed work requests, which come in any number
	 * and order after it. */
	if (!p->qp_ended && !nothing_lost(p))
		return false;
	if (!p->qp_ended)
		p->fin_unsure = p->tx_state == SV_TX_FIN && !p->fin_done;
	p->qp_ended = true;
	if (p->tx_state == SV_TX_OPEN)
		p->tx_state = SV_TX_RESET; /* no QP to send on: EPIPE (tx_check) */
	return true;
}

bool sv_proto_fin_unsure(const struct sv_proto *p)
{
	return p->qp_ended && p->fin_unsure;
}

bool sv_proto_flush_is_end(struct sv_proto *p)
{
	return p->error || sv_proto_peer_ended(p);
}

void sv_proto_rx_lost_qp(struct sv_proto *p)
{
	p->rx_lost = true;
	if (!p->rx_on_qp || p->rx_switch_pending || p->rx_fin)
		return;
	/* What arrived is read first, then TCP: as if a TO_TCP had come
	 * after the last message. */
	p->rx_switch_pending = true;
	p->rx_switch_seq = p->rcv_nxt;
	if (p->rcv_read == p->rcv_nxt) {
		p->rx_on_qp = false;
		p->rx_switch_pending = false;
	}
}

int sv_proto_tx_lost_qp(struct sv_proto *p, const void **buf, size_t *len)
{
	*buf = NULL;
	*len = 0;
	/* RESET: the core was aborted when the QP failed under it, with our
	 * sending on the QP. */
	if (p->tx_state != SV_TX_OPEN && p->tx_state != SV_TX_RESET && p->tx_state != SV_TX_FIN)
		return -EINVAL;
	if (p->tx_lost || !sv_proto_sends_done(p))
		return -EIO; /* messages in flight may be lost */
	/* A peer that reset refuses what arrived: our bytes over the QP
	 * (DATA past our switch point) are not known to be its. */
	if (p->reset_by_peer && p->snd_nxt != p->tx_qp_from)
		return -EIO;
	if (p->tx_state == SV_TX_FIN)
		return 0; /* everything arrived, the FIN too: nothing moves */
	if (p->pending_slot >= 0) {
		/* Coalesced, never sent: the caller writes it on TCP. The
		 * buffer stays as it is until the core sends again, which it
		 * does not over a lost QP. */
		*buf = sv_pr_tx_payload(p, (uint32_t)p->pending_slot);
		*len = p->pending_len;
		sv_pr_free_slot(p, sv_pr_take_pending(p));
	}
	p->tx_state = SV_TX_TCP;
	return 0;
}

int sv_proto_tx_retract(struct sv_proto *p)
{
	if (p->tx_state == SV_TX_TCP)
		return 0;
	if (p->tx_state == SV_TX_BACK || p->snd_nxt != p->tx_qp_from || p->pending_slot >= 0)
		return -EINVAL;
	p->tx_state = SV_TX_TCP;
	p->fin_wanted = false;
	return 0;
}

/* ---- What the stream layer may ask ---------------------------------------- */

enum sv_tx_state sv_proto_tx_state(const struct sv_proto *p)
{
	return p->tx_state;
}

bool sv_proto_tx_pending(const struct sv_proto *p)
{
	return p->pending_slot >= 0;
}

bool sv_proto_sends_done(const struct sv_proto *p)
{
	return p->nfree + (p->pending_slot >= 0) == sv_proto_nsend(&p->prm);
}

bool sv_proto_writable(const struct sv_proto *p)
{
	return sv_pr_can_send_data(p) ||
	       (p->pending_slot >= 0 && p->pending_len < p->pending_cap);
}

bool sv_proto_zcopy_busy(const struct sv_proto *p)
{
	/* After the break the bytes are kept (sv_pr_keep_unsent): the
	 * application's memory is no longer needed, flushed or not. */
	return p->zc_inflight > 0 && !(p->error && p->kept_ok);
}

bool sv_proto_to_rdma_pending(const struct sv_proto *p)
{
	return p->to_rdma_inflight;
}

bool sv_proto_rx_on_qp(const struct sv_proto *p)
{
	return p->rx_on_qp && !p->back_sent;
}

bool sv_proto_rx_fin(const struct sv_proto *p)
{
	return p->rx_fin;
}

bool sv_proto_rx_eof(const struct sv_proto *p)
{
	return p->rx_fin && p->rcv_read == p->rx_fin_seq;
}

bool sv_proto_peer_switch(const struct sv_proto *p, uint64_t *seq)
{
	if (seq)
		*seq = p->peer_to_rdma_seq;
	return p->peer_to_rdma;
}

bool sv_proto_qp_used(const struct sv_proto *p)
{
	return p->tx_state != SV_TX_TCP || p->rx_on_qp || p->peer_to_rdma;
}

bool sv_proto_back_ready(const struct sv_proto *p)
{
	return !p->error && !p->back_sent && p->rx_on_qp && !p->peer_to_rdma &&
	       !p->rx_switch_pending && (p->tx_state == SV_TX_OPEN || p->tx_state == SV_TX_FIN);
}

bool sv_proto_back_sent(const struct sv_proto *p)
{
	return p->back_sent;
}

void sv_config_proto_params(const struct sv_config *cfg, struct sv_proto_params *prm)
{
	*prm = (struct sv_proto_params){
		.window = cfg->window,
		.reserve = SV_RESERVE,
		/* SOVIA_BUF_SIZE counts payload: a write of a power of two
		 * (what applications write) fills whole messages, where a
		 * buffer of a power of two with the header in it left a
		 * 24..192-byte tail message per write, each costing a credit
		 * and a doorbell (docs/benchmarks.md). */
		.buf_size = cfg->buf_size + SV_HDR_SIZE,
		.start_size = cfg->buf_start + SV_HDR_SIZE,
		.ack_delay = cfg->ack_delay,
		.ack_timeout_us = cfg->ack_timeout_us,
		.coalesce = cfg->coalesce,
		.coalesce_size = cfg->coalesce_size,
		.coalesce_timeout_us = cfg->coalesce_timeout_us,
		.zcopy_threshold = cfg->reg_threshold,
		.idle_us = (uint64_t)cfg->buf_idle_ms * 1000,
	};
	/* coalesce_size fits the payload: sv_config_load keeps it at most
	 * SOVIA_BUF_SIZE, and sv_config_defaults' values do. */
}
