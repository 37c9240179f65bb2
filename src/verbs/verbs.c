/* The RDMA verbs transport: see verbs.h for the contract.
 *
 * Work request ids carry what completed: the upper 32 bits say receive or
 * send, the lower 32 bits the receive buffer index or the send slot. The
 * direction has to be in the id: a failed completion's opcode is undefined
 * (only wr_id, status, qp_num and vendor_err are valid then).
 *
 * Every send is signalled: the core frees a send slot on its completion.
 * (Selective signalling, one signalled send in k, would save CQ traffic
 * but needs the slots of the unsignalled sends released together with the
 * next signalled one: a later optimisation.) */
#include "real.h"
#include "verbs.h"
#include "verbs_int.h"
#include "verbs_db.h"

#include "hub.h"
#include "lock.h"
#include "log.h"
#include "ownfd.h"
#include "pinned.h"
#include "qp.h"
#include "regcache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

enum {
	SV_WR_RECV = 1,
	SV_WR_SEND = 2,
};

#define SV_WR_ID(kind, idx) (((uint64_t)(kind) << 32) | (uint64_t)(idx))
#define SV_POLL_BATCH 16

/* Inline sizes to ask for, largest first; 0 (no inline data) always works. */
static const uint32_t inline_sizes[] = {256, 64, 0};

/* What one send slot holds until its completion: its zero-copy
 * registrations, and the stream bytes it carries (DATA's payload). */
struct sv_zc {
	struct sv_regcache_ent *ent[SV_XPORT_MAX_SGE];
	uint32_t n;
	uint32_t data;
};

/* Registered memory: a mapping of its own and its registration. */
struct pool {
	uint8_t *mem;
	size_t bytes; /* mapped (whole pages) */
	struct ibv_mr *mr;
};

struct sv_verbs {
	struct sv_qp q; /* first: the stream's view (qp.h) */
	struct rdma_cm_id *id;
	struct ibv_pd *pd; /* shared: see sv_verbs_pd_get */
	struct sv_regcache *rc; /* the PD's, shared too */
	struct ibv_cq *cq; /* reports to the device's channel (verbs_pd.c) */
	struct ibv_qp *qp;
	/* Every buffer starts in `small` (nrecv receive buffers, then nsend
	 * send buffers, of start_size bytes); after a growth, each of one
	 * direction is in its pool of buf_size buffers from its next use. */
	struct pool small, rbig, sbig;
	uint8_t *rbig_on, *sbig_on; /* per buffer: it is in rbig (sbig) now */
	size_t grown_pin;           /* taken from the budget for rbig and sbig */
	uint32_t nrecv, nsend, buf_size, start_size;
	uint32_t max_inline; /* what the QP got, 0 if none */
	struct sv_zc *zc;    /* per send slot */
	uint64_t data_in_flight; /* the zc[].data of the slots posted */
	/* A notification is requested and its event not taken yet: arming
	 * again would only cost a system call (a write for rxe), once per
	 * connection for every poll or epoll_wait that sleeps. Set under the
	 * stream's lock, cleared by the channel's drain under the hub's. */
	atomic_bool armed;
};

static const struct sv_qp_ops qp_ops;

/* ---- A spare kit --------------------------------------------------------------------- */

/* What a connection needs besides its QP (completion queue, registered
 * buffers): slow to make, 10 ms of a new connection's 20 under
 * emulation when it registered 3 MiB. The last
 * connection to go keeps its kit for the next one of the same shape (one,
 * so at most one connection's buffers stay pinned with nobody using them;
 * none when the locked-memory budget is limited, pinned.h). */
struct kit {
	struct ibv_context *ctx;
	struct ibv_pd *pd; /* with the reference its connection had */
	struct sv_regcache *rc;
	struct ibv_cq *cq;
	struct pool small; /* a connection's grown buffers are never kept */
	uint32_t nrecv, nsend, buf_size, start_size;
};

static struct sv_lock kit_lock = SV_LOCK_INIT(SV_RANK_TRANSPORT);
static struct kit spare;

/* Take the spare kit if it fits v's shape on ctx. */
static bool kit_take(struct sv_verbs *v, struct ibv_context *ctx)
{
	sv_lock(&kit_lock);
	bool ok = spare.cq && spare.ctx == ctx && spare.nrecv == v->nrecv &&
		  spare.nsend == v->nsend && spare.buf_size == v->buf_size &&
		  spare.start_size == v->start_size;
	if (ok) {
		v->pd = spare.pd;
		v->rc = spare.rc;
		v->cq = spare.cq;
		v->small = spare.small;
		spare = (struct kit){0};
	}
	sv_unlock(&kit_lock);
	return ok;
}

/* Keep v's kit (its QP destroyed) as the spare, if there is none. Its CQ
 * is emptied first (what it holds was the old QP's), and its events from
 * now on go nowhere (cq_context NULL). Under the hub's lock. */
static void kit_keep(struct sv_verbs *v)
{
	if (!v->cq || !v->small.mr || v->qp || sv_pinned_budget() != SIZE_MAX)
		return;
	sv_lock(&kit_lock);
	bool room = !spare.cq;
	sv_unlock(&kit_lock);
	if (!room)
		return;
	struct ibv_wc wc[SV_POLL_BATCH];
	while (ibv_poll_cq(v->cq, SV_POLL_BATCH, wc) > 0)
		;
	sv_lock(&kit_lock);
	if (!spare.cq) {
		spare = (struct kit){
			.ctx = v->cq->context, .pd = v->pd, .rc = v->rc, .cq = v->cq,
			.small = v->small, .nrecv = v->nrecv, .nsend = v->nsend,
			.buf_size = v->buf_size, .start_size = v->start_size,
		};
		v->cq->cq_context = NULL;
		v->pd = NULL;
		v->cq = NULL;
		v->small = (struct pool){0};
	}
	sv_unlock(&kit_lock);
}

void sv_verbs_kit_atfork_child(void)
{
	/* The parent's: useless here (verbs_pd.c). */
	sv_lock_reinit(&kit_lock);
	spare = (struct kit){0};
}

static void zc_release(struct sv_verbs *v, uint32_t slot)
{
	struct sv_zc *zc = &v->zc[slot];
	for (uint32_t i = 0; i < zc->n; i++) {
		sv_regcache_put(v->rc, zc->ent[i]);
		zc->ent[i] = NULL;
	}
	zc->n = 0;
}

/* ---- The transport ops ------------------------------------------------- */

static void *xp_recv_buf(void *ctx, uint32_t i)
{
	struct sv_verbs *v = ctx;
	if (v->rbig_on[i])
		return v->rbig.mem + (size_t)i * v->buf_size;
	return v->small.mem + (size_t)i * v->start_size;
}

static void *xp_send_buf(void *ctx, uint32_t i)
{
	struct sv_verbs *v = ctx;
	if (v->sbig_on[i])
		return v->sbig.mem + (size_t)i * v->buf_size;
	return v->small.mem + (size_t)(v->nrecv + i) * v->start_size;
}

static int xp_post_recv(void *ctx, uint32_t i, bool big)
{
	struct sv_verbs *v = ctx;
	if (i >= v->nrecv || (big && !v->rbig.mr))
		return -EINVAL;
	v->rbig_on[i] = big;
	struct ibv_sge sge = {
		.addr = (uintptr_t)xp_recv_buf(v, i),
		.length = big ? v->buf_size : v->start_size,
		.lkey = big ? v->rbig.mr->lkey : v->small.mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = SV_WR_ID(SV_WR_RECV, i),
		.sg_list = &sge,
		.num_sge = 1,
	};
	struct ibv_recv_wr *bad;
	int r = ibv_post_recv(v->qp, &wr, &bad);
	if (r) {
		r = neg_err(r);
		sv_dbg("verbs: ibv_post_recv (buffer %u): %s", i, strerror(-r));
		return r;
	}
	return 0;
}

static int xp_post_send(void *ctx, uint32_t slot, uint32_t len, const struct iovec *iov,
			int iovcnt)
{
	struct sv_verbs *v = ctx;
	if (slot >= v->nsend || len > (v->sbig_on[slot] ? v->buf_size : v->start_size) ||
	    iovcnt < 0 || iovcnt > SV_XPORT_MAX_SGE || (iovcnt > 0 && !iov))
		return -EINVAL;
	struct sv_zc *zc = &v->zc[slot];
	if (zc->n) {
		sv_err("verbs: send slot %u posted again before its completion", slot);
		return -EINVAL;
	}

	struct ibv_sge sge[1 + SV_XPORT_MAX_SGE];
	int nsge = 0, r;
	uint64_t total = len;
	sge[nsge++] = (struct ibv_sge){
		.addr = (uintptr_t)xp_send_buf(v, slot),
		.length = len,
		.lkey = v->sbig_on[slot] ? v->sbig.mr->lkey : v->small.mr->lkey,
	};
	for (int i = 0; i < iovcnt; i++) {
		size_t l = iov[i].iov_len;
		if (l == 0)
			continue;
		total += l;
		if (total > SV_HDR_SIZE + (1u << SV_SIZE_CODE_MAX)) {
			r = -EMSGSIZE; /* no peer's receive buffer could hold it */
			goto release_zc;
		}
		struct sv_regcache_ent *ent;
		r = sv_regcache_get(v->rc, iov[i].iov_base, l, &ent);
		if (r < 0)
			goto release_zc;
		zc->ent[zc->n++] = ent;
		sge[nsge++] = (struct ibv_sge){
			.addr = (uintptr_t)iov[i].iov_base,
			.length = (uint32_t)l,
			.lkey = sv_regcache_lkey(ent),
		};
	}

	unsigned int flags = IBV_SEND_SIGNALED;
	if (zc->n == 0 && len <= v->max_inline)
		flags |= IBV_SEND_INLINE;
	struct ibv_send_wr wr = {
		.wr_id = SV_WR_ID(SV_WR_SEND, slot),
		.sg_list = sge,
		.num_sge = nsge,
		.opcode = IBV_WR_SEND,
		.send_flags = flags,
	};
	struct ibv_send_wr *bad;
	r = ibv_post_send(v->qp, &wr, &bad);
	if (r == EACCES || r == -EACCES) /* a credential change: verbs_db.c */
		r = sv_verbs_ring_rxe(v->qp) == 0 ? 0 : EACCES;
	if (r) {
		r = neg_err(r);
		sv_dbg("verbs: ibv_post_send (slot %u, %d sge): %s", slot, nsge, strerror(-r));
		goto release_zc;
	}
	struct sv_hdr h;
	sv_hdr_decode(xp_send_buf(v, slot), &h);
	zc->data = h.type == SV_MSG_DATA ? h.len : 0;
	v->data_in_flight += zc->data;
	return 0;

release_zc:
	zc_release(v, slot);
	return r;
}

static int alloc_pool(struct pool *pl, struct sv_verbs *v, size_t bytes);

/* One direction's buffers at buf_size, within the budget's room for
 * growth (pinned.h). */
static int xp_grow(void *ctx, bool recv)
{
	struct sv_verbs *v = ctx;
	struct pool *pl = recv ? &v->rbig : &v->sbig;
	if (pl->mr)
		return 0;
	size_t bytes = sv_pinned_pages((size_t)(recv ? v->nrecv : v->nsend) * v->buf_size);
	int r = sv_pinned_take_growth(bytes);
	if (r < 0) {
		sv_dbg("verbs: no locked memory for %s buffers of %u bytes: they stay at %u",
		       recv ? "receive" : "send", v->buf_size, v->start_size);
		return r;
	}
	r = alloc_pool(pl, v, bytes);
	if (r < 0) {
		sv_pinned_give(bytes);
		return r;
	}
	v->grown_pin += bytes;
	sv_dbg("verbs: QP %u: %s buffers grow to %u bytes", v->qp ? v->qp->qp_num : 0,
	       recv ? "receive" : "send", v->buf_size);
	return 0;
}

static void xp_send_big(void *ctx, uint32_t slot)
{
	struct sv_verbs *v = ctx;
	if (slot < v->nsend && v->sbig.mr)
		v->sbig_on[slot] = 1;
}

static void free_pool(struct pool *pl, const char *what);

/* One direction's buf_size buffers are out of use (proto.h): unregistered,
 * unmapped, and their locked memory back in the budget. */
static void xp_shrink(void *ctx, bool recv)
{
	struct sv_verbs *v = ctx;
	struct pool *pl = recv ? &v->rbig : &v->sbig;
	if (!pl->mr)
		return;
	size_t bytes = pl->bytes;
	memset(recv ? v->rbig_on : v->sbig_on, 0, recv ? v->nrecv : v->nsend);
	free_pool(pl, recv ? "grown receive buffers" : "grown send buffers");
	v->grown_pin -= bytes;
	sv_pinned_give(bytes);
	sv_dbg("verbs: QP %u: %s buffers back to %u bytes", v->qp ? v->qp->qp_num : 0,
	       recv ? "receive" : "send", v->start_size);
}

static const struct sv_xport_ops verbs_ops = {
	.recv_buf = xp_recv_buf,
	.send_buf = xp_send_buf,
	.post_recv = xp_post_recv,
	.post_send = xp_post_send,
	.grow = xp_grow,
	.send_big = xp_send_big,
	.shrink = xp_shrink,
};

void sv_verbs_regcache_stats(struct sv_verbs *v, struct sv_regcache_stats *st)
{
	sv_regcache_get_stats(v->rc, st);
}

struct sv_xport sv_verbs_xport(struct sv_verbs *v)
{
	return (struct sv_xport){.ops = &verbs_ops, .ctx = v};
}

/* ---- Create, destroy --------------------------------------------------- */

static int check_device(struct ibv_context *ctx, uint32_t nrecv, uint32_t nsend)
{
	struct ibv_device_attr a;
	int r = ibv_query_device(ctx, &a);
	if (r) {
		r = neg_err(r);
		sv_err("verbs: ibv_query_device: %s", strerror(-r));
		return r;
	}
	const char *name = ibv_get_device_name(ctx->device);
	if ((uint64_t)a.max_qp_wr < nsend || (uint64_t)a.max_qp_wr < nrecv ||
	    (uint64_t)a.max_cqe < (uint64_t)nrecv + nsend || a.max_sge < 1 + SV_XPORT_MAX_SGE) {
		sv_err("verbs: %s is too small: %u receive and %u send buffers need max_qp_wr "
		       ">= %u (has %d), max_cqe >= %u (has %d), max_sge >= %d (has %d)",
		       name, nrecv, nsend, nsend, a.max_qp_wr, nrecv + nsend, a.max_cqe,
		       1 + SV_XPORT_MAX_SGE, a.max_sge);
		return -EOPNOTSUPP;
	}
	return 0;
}

static int alloc_pool(struct pool *pl, struct sv_verbs *v, size_t bytes)
{
	/* A mapping of its own, not malloc's: unmapped, it goes back to the
	 * system at once. Freed large chunks make glibc raise its mmap
	 * threshold, and later pools then came from the heap, which grew
	 * with connections that come and go (bed.churn: 0.5 KiB of RSS per
	 * connection). Registering faults the pages in. */
	bytes = sv_pinned_pages(bytes);
	void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return last_err();
	pl->mem = mem;
	pl->bytes = bytes;
	pl->mr = ibv_reg_mr(v->pd, mem, bytes, IBV_ACCESS_LOCAL_WRITE);
	/* Out of lockable memory: the cache may give some back. */
	if (!pl->mr && (errno == ENOMEM || errno == EAGAIN) && sv_regcache_flush(v->rc) > 0)
		pl->mr = ibv_reg_mr(v->pd, mem, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!pl->mr) {
		int r = last_err();
		sv_err("verbs: ibv_reg_mr of a %zu-byte buffer pool: %s%s", bytes, strerror(-r),
		       r == -ENOMEM || r == -EPERM ? " (RLIMIT_MEMLOCK too low?)" : "");
		munmap(mem, bytes);
		*pl = (struct pool){0};
		return r;
	}
	return 0;
}

static void free_pool(struct pool *pl, const char *what)
{
	int r;
	if (pl->mr && (r = ibv_dereg_mr(pl->mr)))
		sv_warn("verbs: ibv_dereg_mr (%s): %s", what, strerror(-neg_err(r)));
	if (pl->mem)
		munmap(pl->mem, pl->bytes);
	*pl = (struct pool){0};
}

/* The RC QP, with as much inline data as the device takes. */
static int create_qp(struct sv_verbs *v)
{
	int r = -EINVAL;
	for (size_t i = 0; i < sizeof(inline_sizes) / sizeof(inline_sizes[0]); i++) {
		struct ibv_qp_init_attr a = {
			.qp_context = v,
			.send_cq = v->cq,
			.recv_cq = v->cq,
			.cap =
				{
					.max_send_wr = v->nsend,
					.max_recv_wr = v->nrecv,
					.max_send_sge = 1 + SV_XPORT_MAX_SGE,
					.max_recv_sge = 1,
					.max_inline_data = inline_sizes[i],
				},
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 0, /* every send asks for IBV_SEND_SIGNALED itself */
		};
		v->qp = ibv_create_qp(v->pd, &a);
		if (v->qp) {
			v->max_inline = a.cap.max_inline_data;
			sv_dbg("verbs: RC QP %u: %u send/%u recv WRs, %u send SGEs, %u inline bytes",
			       v->qp->qp_num, a.cap.max_send_wr, a.cap.max_recv_wr,
			       a.cap.max_send_sge, a.cap.max_inline_data);
			return 0;
		}
		r = last_err();
		sv_dbg("verbs: ibv_create_qp with %u inline bytes: %s", inline_sizes[i],
		       strerror(-r));
	}
	sv_err("verbs: ibv_create_qp: %s", strerror(-r));
	return r;
}

/* Move the QP to `state` with the attributes rdma_cm gives for it. */
static int qp_to(struct sv_verbs *v, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = {.qp_state = state};
	int mask = 0;
	if (rdma_init_qp_attr(v->id, &a, &mask) < 0) {
		int r = last_err();
		sv_dbg("verbs: rdma_init_qp_attr for QP state %d: %s", (int)state, strerror(-r));
		return r;
	}
	/* No RDMA READ or atomics on this QP: none outstanding either way. */
	if (state == IBV_QPS_RTR)
		a.max_dest_rd_atomic = 0;
	if (state == IBV_QPS_RTS) {
		a.max_rd_atomic = 0;
		/* The passive side's counts and timeout are what the peer's
		 * request asked: a peer asking 7 RNR retries (for ever) and
		 * posting no buffers would hold our sends until it left. */
		if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > SV_RNR_RETRY)
			a.rnr_retry = SV_RNR_RETRY;
		if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > SV_TRANSPORT_RETRY)
			a.retry_cnt = SV_TRANSPORT_RETRY;
		if ((mask & IBV_QP_TIMEOUT) &&
		    (a.timeout == 0 || a.timeout > SV_ACK_TIMEOUT_MAX))
			a.timeout = SV_ACK_TIMEOUT_MAX;
	}
	int r = ibv_modify_qp(v->qp, &a, mask);
	if (r) {
		r = neg_err(r);
		sv_dbg("verbs: QP %u to state %d: %s", v->qp->qp_num, (int)state, strerror(-r));
		return r;
	}
	return 0;
}

int sv_verbs_connected(struct sv_verbs *v)
{
	int r = qp_to(v, IBV_QPS_RTR);
	return r ? r : qp_to(v, IBV_QPS_RTS);
}

uint32_t sv_verbs_qp_num(const struct sv_verbs *v)
{
	return v->qp->qp_num;
}

void sv_verbs_qp_error(struct sv_verbs *v)
{
	if (!v || !v->qp)
		return;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	ibv_modify_qp(v->qp, &a, IBV_QP_STATE); /* flushes what is posted */
}

int sv_verbs_create(struct sv_verbs **out, struct rdma_cm_id *id, const struct sv_proto_params *prm)
{
	*out = NULL;
	if (!id || !id->verbs || id->qp || prm->buf_size <= SV_HDR_SIZE || prm->window < 1)
		return -EINVAL;
	int r = 0;
	struct ibv_comp_channel *chan;
	struct ibv_context *ctx = sv_verbs_own_ctx(id->verbs->device, &chan, &r);
	if (!ctx)
		return r;
	uint32_t nr = sv_proto_nrecv(prm), ns = sv_proto_nsend(prm);
	r = check_device(ctx, nr, ns);
	if (r)
		return r;

	struct sv_verbs *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->q.ops = &qp_ops;
	v->id = id;
	v->nrecv = nr;
	v->nsend = ns;
	v->buf_size = prm->buf_size;
	v->start_size = sv_proto_start_size(prm);
	/* From here on sv_verbs_destroy undoes whatever part was built. */
	v->zc = calloc(ns, sizeof(*v->zc));
	v->rbig_on = calloc(nr, 1);
	v->sbig_on = calloc(ns, 1);
	if (!v->zc || !v->rbig_on || !v->sbig_on) {
		r = -ENOMEM;
		goto destroy_partial;
	}
	if (kit_take(v, ctx)) {
		sv_hub_lock(); /* its channel's events find v from here on */
		v->cq->cq_context = v;
		sv_hub_unlock();
		goto make_qp;
	}
	r = sv_verbs_pd_get(ctx, &v->pd, &v->rc);
	if (r)
		goto destroy_partial;
	/* Every WR is signalled, and a slot or buffer is reused only after its
	 * completion was polled: nrecv + nsend entries never overflow. */
	v->cq = ibv_create_cq(ctx, (int)(nr + ns), v, chan, 0);
	if (!v->cq) {
		r = last_err();
		sv_err("verbs: ibv_create_cq (%u entries): %s", nr + ns, strerror(-r));
		goto destroy_partial;
	}
	r = alloc_pool(&v->small, v, (size_t)(nr + ns) * v->start_size);
	if (r)
		goto destroy_partial;
make_qp:
	r = create_qp(v);
	if (r)
		goto destroy_partial;
	r = qp_to(v, IBV_QPS_INIT); /* receives may be posted from here on */
	if (r)
		goto destroy_partial;
	*out = v;
	return 0;

destroy_partial:
	sv_verbs_destroy(v);
	return r;
}

void sv_verbs_destroy(struct sv_verbs *v)
{
	if (!v)
		return;
	/* The QP first: after it, nothing reads or writes the memory below. */
	if (v->qp) {
		int d = ibv_destroy_qp(v->qp);
		if (d)
			sv_warn("verbs: ibv_destroy_qp: %s", strerror(-neg_err(d)));
		v->qp = NULL;
	}
	if (v->zc) {
		for (uint32_t i = 0; i < v->nsend; i++)
			if (v->zc[i].n)
				zc_release(v, i);
		free(v->zc);
	}
	free(v->rbig_on);
	free(v->sbig_on);
	free_pool(&v->rbig, "grown receive buffers");
	free_pool(&v->sbig, "grown send buffers");
	sv_pinned_give(v->grown_pin);
	/* Under the hub's lock a channel's drain never meets a CQ being
	 * destroyed; it acknowledges each event it takes at once, so
	 * ibv_destroy_cq (which waits for that) never waits. */
	sv_hub_lock();
	kit_keep(v); /* what it keeps is not freed below */
	int r;
	if (v->cq && (r = ibv_destroy_cq(v->cq)))
		sv_warn("verbs: ibv_destroy_cq: %s", strerror(-neg_err(r)));
	sv_hub_unlock();
	free_pool(&v->small, "buffers");
	if (v->pd)
		sv_verbs_pd_put(v->pd);
	free(v);
}

/* ---- Completions ------------------------------------------------------- */

/* A failed work request. On an RC QP any failure moves the QP to the error
 * state, after which everything still posted completes with a flush error. */
static int wc_failed(struct sv_verbs *v, struct sv_proto *p, const struct ibv_wc *wc,
		     uint32_t kind, uint32_t idx)
{
	/* The expected aftermath of a break, or of the end. */
	if (wc->status == IBV_WC_WR_FLUSH_ERR && sv_proto_flush_is_end(p))
		return 0;
	sv_dbg("verbs: QP %u: %s %u failed: %s (vendor error 0x%x)", v->qp ? v->qp->qp_num : 0,
	       kind == SV_WR_SEND ? "send slot" : "receive buffer", idx,
	       ibv_wc_status_str(wc->status), wc->vendor_err);
	sv_proto_abort(p, -ECONNRESET);
	return -ECONNRESET;
}

static int complete(struct sv_verbs *v, struct sv_proto *p, const struct ibv_wc *wc,
		    struct sv_clock *clk)
{
	uint32_t kind = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id;
	if ((kind != SV_WR_SEND || idx >= v->nsend) && (kind != SV_WR_RECV || idx >= v->nrecv)) {
		sv_err("verbs: completion with unknown wr_id 0x%llx (status %s)",
		       (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status));
		sv_proto_abort(p, -EIO);
		return -EIO;
	}
	int err = 0;
	if (wc->status != IBV_WC_SUCCESS)
		err = wc_failed(v, p, wc, kind, idx);
	if (kind == SV_WR_SEND) {
		/* Success or not, the slot is done: the memory may go back to the
		 * application, which the core allows once zc_inflight drops. Drop
		 * the registrations before the core learns of it. */
		zc_release(v, idx);
		v->data_in_flight -= v->zc[idx].data;
		v->zc[idx].data = 0;
		int r = sv_proto_on_send_done(p, idx, clk);
		return err ? err : r;
	}
	if (err || wc->status != IBV_WC_SUCCESS)
		return err; /* a flushed receive holds nothing */
	return sv_proto_on_recv(p, idx, wc->byte_len, clk);
}

int sv_verbs_poll(struct sv_verbs *v, struct sv_proto *p, struct sv_clock *clk)
{
	struct ibv_wc wc[SV_POLL_BATCH];
	int handled = 0, err = 0;
	for (;;) {
		int n = ibv_poll_cq(v->cq, SV_POLL_BATCH, wc);
		if (n < 0) {
			sv_err("verbs: ibv_poll_cq failed (%d)", n);
			sv_proto_abort(p, -EIO);
			if (!err)
				err = -EIO;
			break;
		}
		/* Every completion taken from the CQ is handed on, even after an
		 * error: each one releases a slot the core is waiting for. */
		for (int i = 0; i < n; i++) {
			int r = complete(v, p, &wc[i], clk);
			if (r < 0 && !err)
				err = r;
		}
		handled += n;
		if (n < SV_POLL_BATCH)
			break;
	}
	return err ? err : handled;
}

int sv_verbs_arm(struct sv_verbs *v)
{
	/* Marked before the request: its event, drained at any moment after,
	 * must find the mark to clear, or no arming would follow it. */
	if (atomic_exchange(&v->armed, true))
		return 0; /* its event, when it comes, wakes the hub */
	int r = ibv_req_notify_cq(v->cq, 0);
	if (r) {
		atomic_store(&v->armed, false);
		r = neg_err(r);
		sv_dbg("verbs: ibv_req_notify_cq: %s", strerror(-r));
		return r;
	}
	return 0;
}

void sv_verbs_chan_drain(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *cq_ctx;
	/* The fd is non-blocking: EAGAIN ends the loop when none is left. */
	while (ibv_get_cq_event(ch, &cq, &cq_ctx) == 0) {
		ibv_ack_cq_events(cq, 1); /* its CQ may be destroyed once we let go */
		struct sv_verbs *v = cq_ctx;
		if (!v)
			continue; /* a spare kit's CQ */
		atomic_store(&v->armed, false); /* the notification is spent */
		if (v->q.node)
			sv_hub_fire(v->q.node);
	}
	if (errno != EAGAIN && errno != EWOULDBLOCK)
		sv_dbg("verbs: ibv_get_cq_event: %s", strerror(errno));
}

/* ---- The stream's view (qp.h) ---------------------------------------------- */

static struct sv_verbs *of(const struct sv_qp *q)
{
	return (struct sv_verbs *)q;
}

static struct sv_xport q_xport(struct sv_qp *q)
{
	return sv_verbs_xport(of(q));
}

static int q_poll(struct sv_qp *q, struct sv_proto *p, struct sv_clock *clk)
{
	return sv_verbs_poll(of(q), p, clk);
}

static int q_arm(struct sv_qp *q)
{
	return sv_verbs_arm(of(q));
}

static uint32_t q_num(const struct sv_qp *q)
{
	return sv_verbs_qp_num(of(q));
}

static int q_connected(struct sv_qp *q)
{
	return sv_verbs_connected(of(q));
}

static void q_to_error(struct sv_qp *q)
{
	sv_verbs_qp_error(of(q));
}

static void q_destroy(struct sv_qp *q)
{
	sv_verbs_destroy(of(q));
}

static void q_regcache_stats(struct sv_qp *q, struct sv_regcache_stats *st)
{
	sv_verbs_regcache_stats(of(q), st);
}

static uint64_t q_data_in_flight(const struct sv_qp *q)
{
	return of(q)->data_in_flight;
}

static const struct sv_qp_ops qp_ops = {
	.xport = q_xport,
	.poll_cq = q_poll,
	.arm = q_arm,
	.num = q_num,
	.connected = q_connected,
	.to_error = q_to_error,
	.destroy = q_destroy,
	.regcache_stats = q_regcache_stats,
	.data_in_flight = q_data_in_flight,
};

struct sv_qp *sv_verbs_qp(struct sv_verbs *v)
{
	return &v->q;
}
