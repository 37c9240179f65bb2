/* The hostile peer's queue pair: docs/protocol.md's messages (section 2)
 * spoken by hand on a librdmacm QP of its own. It keeps the rules
 * libsovia's receiver checks on every message (credits, the buffer sizes
 * the credits report, the ack), so that an attack reaches the code it
 * aims at instead of being refused as malformed at the door; what it
 * bends is left to its caller (which type, which seq, whether a buffer is
 * ever posted again). */
#include "hostile.h"

#include "le.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>

/* Send work requests carry this bit in their wr_id: an error completion
 * has no opcode to tell them from receives. */
#define SEND_TAG (1ull << 40)
/* Runs of credits of one buffer size: the sizes a libsovia receiver
 * reports only grow, so a handful is plenty. */
#define HQ_RUNS 32

struct hq_run {
	uint32_t cap, n; /* payload bytes per buffer, credits of that size */
};

struct hq {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *pool;
	size_t pool_len;
	struct hq_cfg cfg;
	hq_msg_fn fn;
	void *ctx;
	uint32_t *free_slots, nfree;
	struct hq_run runs[HQ_RUNS];
	uint32_t run_head, run_count, credits, peer_start_cap;
	uint32_t unreported; /* buffers reposted since our last report */
	uint64_t ack;        /* the peer's stream: the next byte the QP would bring */
	uint64_t posted, done, rx_msgs;
	int failed;
};

static uint8_t *rbuf(struct hq *q, uint32_t i)
{
	return q->pool + (size_t)i * q->cfg.rbuf;
}

static uint8_t *sbuf(struct hq *q, uint32_t i)
{
	return q->pool + (size_t)q->cfg.nrecv * q->cfg.rbuf + (size_t)i * q->cfg.sbuf;
}

static int post_recv(struct hq *q, uint32_t i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)rbuf(q, i), .length = q->cfg.rbuf, .lkey = q->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(q->id->qp, &wr, &bad) ? -1 : 0;
}

/* The verbs objects; 0 or -1. */
static int make_verbs(struct hq *q)
{
	struct ibv_context *ctx = q->id->verbs;
	size_t len = (q->pool_len + 4095) & ~(size_t)4095;
	q->pool = aligned_alloc(4096, len);
	q->pd = ibv_alloc_pd(ctx);
	q->cc = ibv_create_comp_channel(ctx);
	if (!q->pool || !q->pd || !q->cc)
		return -1;
	q->cq = ibv_create_cq(ctx, (int)(q->cfg.nrecv + q->cfg.nsend + 1), NULL, q->cc, 0);
	q->mr = ibv_reg_mr(q->pd, q->pool, q->pool_len, IBV_ACCESS_LOCAL_WRITE);
	if (!q->cq || !q->mr)
		return -1;
	/* Its events are taken when poll says so, never waited for. */
	fcntl(q->cc->fd, F_SETFL, fcntl(q->cc->fd, F_GETFL) | O_NONBLOCK);
	struct ibv_qp_init_attr a = {
		.send_cq = q->cq,
		.recv_cq = q->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = q->cfg.nsend, .max_recv_wr = q->cfg.nrecv,
			.max_send_sge = 1, .max_recv_sge = 1},
	};
	return rdma_create_qp(q->id, q->pd, &a) < 0 ? -1 : 0;
}

struct hq *hq_new(struct rdma_cm_id *id, const struct hq_cfg *cfg, hq_msg_fn fn, void *ctx)
{
	struct hq *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->id = id;
	q->cfg = *cfg;
	q->fn = fn;
	q->ctx = ctx;
	q->pool_len = (size_t)cfg->nrecv * cfg->rbuf + (size_t)cfg->nsend * cfg->sbuf;
	q->free_slots = calloc(cfg->nsend, sizeof(*q->free_slots));
	if (!q->free_slots || make_verbs(q) < 0) {
		say("hostile: cannot make a queue pair: %s", strerror(errno));
		hq_free(q);
		return NULL;
	}
	for (uint32_t i = 0; i < cfg->nsend; i++)
		q->free_slots[q->nfree++] = i;
	for (uint32_t i = 0; i < cfg->post && i < cfg->nrecv; i++)
		if (post_recv(q, i) < 0) {
			say("hostile: ibv_post_recv failed");
			hq_free(q);
			return NULL;
		}
	return q;
}

void hq_free(struct hq *q)
{
	if (!q)
		return;
	if (q->id && q->id->qp)
		rdma_destroy_qp(q->id);
	if (q->mr)
		ibv_dereg_mr(q->mr);
	if (q->cq)
		ibv_destroy_cq(q->cq);
	if (q->cc)
		ibv_destroy_comp_channel(q->cc);
	if (q->pd)
		ibv_dealloc_pd(q->pd);
	free(q->pool);
	free(q->free_slots);
	free(q);
}

void hq_set_peer(struct hq *q, uint32_t nrecv, uint32_t buf_size)
{
	q->peer_start_cap = buf_size > SV_HDR_SIZE ? buf_size - SV_HDR_SIZE : 0;
	q->runs[0] = (struct hq_run){q->peer_start_cap, nrecv};
	q->run_head = 0;
	q->run_count = 1;
	q->credits = nrecv;
}

/* The peer reported n more buffers of the size its flags give. */
static void add_credits(struct hq *q, uint32_t n, uint8_t code)
{
	if (!n || !q->run_count)
		return;
	uint32_t cap = code >= SV_SIZE_CODE_MIN && code <= SV_SIZE_CODE_MAX ? 1u << code
									      : q->peer_start_cap;
	struct hq_run *tail = &q->runs[(q->run_head + q->run_count - 1) % HQ_RUNS];
	q->credits += n;
	if (tail->cap == cap || q->run_count == HQ_RUNS)
		tail->n += n; /* a later size is never smaller: the tail's fits it */
	else if (q->run_count == 1 && tail->n == 0)
		*tail = (struct hq_run){cap, n};
	else
		q->runs[(q->run_head + q->run_count++) % HQ_RUNS] = (struct hq_run){cap, n};
}

static void take_credit(struct hq *q)
{
	struct hq_run *r = &q->runs[q->run_head];
	q->credits--;
	if (--r->n == 0 && q->run_count > 1) {
		q->run_head = (q->run_head + 1) % HQ_RUNS;
		q->run_count--;
	}
}

/* Credits a message of this type needs, as libsovia's sender keeps them
 * (protocol.md, 5): the peer then always has a buffer for it. */
static uint32_t credits_needed(uint8_t type)
{
	switch (type) {
	case SV_MSG_DATA:
	case SV_MSG_RETURN:
		return SV_RESERVE + 1;
	case SV_MSG_TO_RDMA:
	case SV_MSG_TO_TCP:
	case SV_MSG_FIN:
	case SV_MSG_BACK:
		return 2;
	default:
		return 1;
	}
}

int hq_send(struct hq *q, uint8_t type, uint64_t seq, const void *payload, uint32_t len)
{
	if (q->credits < credits_needed(type) || !q->nfree)
		return -EAGAIN;
	if (len > q->runs[q->run_head].cap || len > q->cfg.sbuf - SV_HDR_SIZE)
		return -EMSGSIZE;
	uint32_t slot = q->free_slots[--q->nfree];
	uint8_t *b = sbuf(q, slot);
	struct sv_hdr h = {.type = type, .credits = (uint16_t)q->unreported, .len = len,
			   .seq = seq, .ack = q->ack};
	sv_hdr_encode(&h, b);
	if (len)
		memcpy(b + SV_HDR_SIZE, payload, len);
	struct ibv_sge sge = {
		.addr = (uintptr_t)b, .length = SV_HDR_SIZE + len, .lkey = q->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = SEND_TAG | slot, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	int r = ibv_post_send(q->id->qp, &wr, &bad);
	if (r) {
		q->free_slots[q->nfree++] = slot;
		return -r;
	}
	q->unreported = 0;
	take_credit(q);
	q->posted++;
	return 0;
}

long hq_send_bytes(struct hq *q, uint8_t type, uint64_t seq, const void *buf, size_t len)
{
	if (q->credits < credits_needed(type) || !q->nfree)
		return -EAGAIN;
	size_t n = len;
	if (n > q->runs[q->run_head].cap)
		n = q->runs[q->run_head].cap;
	if (n > q->cfg.sbuf - SV_HDR_SIZE)
		n = q->cfg.sbuf - SV_HDR_SIZE;
	int r = hq_send(q, type, seq, buf, (uint32_t)n);
	return r < 0 ? r : (long)n;
}

void hq_update(struct hq *q)
{
	if (q->unreported >= 2)
		(void)hq_send(q, SV_MSG_UPDATE, 0, NULL, 0);
}

static void take(struct hq *q, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS && !q->failed)
		q->failed = wc->status;
	if (wc->wr_id & SEND_TAG) {
		q->free_slots[q->nfree++] = (uint32_t)(wc->wr_id & ~SEND_TAG);
		q->done++;
		return;
	}
	if (wc->status != IBV_WC_SUCCESS || wc->byte_len < SV_HDR_SIZE)
		return;
	uint32_t buf = (uint32_t)wc->wr_id;
	struct sv_hdr h;
	sv_hdr_decode(rbuf(q, buf), &h);
	if (h.len > wc->byte_len - SV_HDR_SIZE)
		h.len = wc->byte_len - SV_HDR_SIZE;
	q->rx_msgs++;
	add_credits(q, h.credits, h.flags);
	if (h.type == SV_MSG_DATA)
		q->ack = h.seq + h.len;
	else if (h.type == SV_MSG_TO_RDMA)
		q->ack = h.seq;
	q->fn(q->ctx, &h, rbuf(q, buf) + SV_HDR_SIZE);
	if (q->cfg.repost && post_recv(q, buf) == 0)
		q->unreported++;
}

int hq_poll(struct hq *q)
{
	struct ibv_wc wc[16];
	int total = 0, n;
	while ((n = ibv_poll_cq(q->cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++)
			take(q, &wc[i]);
		total += n;
	}
	return total;
}

void hq_sleep(struct hq *q, struct pollfd *fds, int nfds, int ms)
{
	struct pollfd all[9];
	if (nfds > 8)
		nfds = 8;
	for (int i = 0; i < nfds; i++)
		fds[i].revents = 0;
	ibv_req_notify_cq(q->cq, 0);
	if (hq_poll(q) > 0)
		return; /* came before the arming: the event would never fire */
	memcpy(all, fds, (size_t)nfds * sizeof(*fds));
	all[nfds] = (struct pollfd){.fd = q->cc->fd, .events = POLLIN};
	if (poll(all, (nfds_t)nfds + 1, ms) <= 0)
		return;
	for (int i = 0; i < nfds; i++)
		fds[i].revents = all[i].revents;
	struct ibv_cq *cq;
	void *cctx;
	if ((all[nfds].revents & POLLIN) && ibv_get_cq_event(q->cc, &cq, &cctx) == 0)
		ibv_ack_cq_events(cq, 1);
}

bool hq_sends_done(const struct hq *q)
{
	return q->done == q->posted;
}

int hq_failed(const struct hq *q)
{
	return q->failed;
}

uint64_t hq_ack(const struct hq *q)
{
	return q->ack;
}

uint32_t hq_credits(const struct hq *q)
{
	return q->credits;
}

uint64_t hq_rx_msgs(const struct hq *q)
{
	return q->rx_msgs;
}

uint32_t hq_qp_num(const struct hq *q)
{
	return q->id && q->id->qp ? q->id->qp->qp_num : 0;
}
