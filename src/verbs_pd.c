/* The verbs transport's device contexts and protection domains, one of
 * each per device and process, and the registration cache of each PD
 * (regcache.h). */
#include "verbs.h"
#include "verbs_int.h"

#include "lock.h"
#include "log.h"
#include "regcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

/* ---- Device contexts of our own ------------------------------------------
 *
 * librdmacm opens each device once per process and keeps it; its context is
 * inherited by fork children, where the kernel refuses the writes rxe posts
 * with (the file was opened under the parent's credentials). So the QP and
 * everything under it live on a context libsovia opens itself in each
 * process, after any fork; librdmacm only connects (the id carries our QP's
 * number, and we move the QP through its states, rdma_init_qp_attr). */

struct sv_ctx_ent {
	struct sv_ctx_ent *next;
	struct ibv_device *dev;
	struct ibv_context *ctx;
};

static struct sv_ctx_ent *ctx_list; /* under pd_lock */

/* Our context for dev, opened on first use and kept. Under pd_lock. */
static struct ibv_context *own_ctx(struct ibv_device *dev, int *err)
{
	for (struct sv_ctx_ent *e = ctx_list; e; e = e->next)
		if (e->dev == dev)
			return e->ctx;
	struct sv_ctx_ent *e = calloc(1, sizeof(*e));
	if (!e) {
		*err = -ENOMEM;
		return NULL;
	}
	e->ctx = ibv_open_device(dev);
	if (!e->ctx) {
		*err = last_err();
		sv_err("verbs: ibv_open_device %s: %s", ibv_get_device_name(dev), strerror(-*err));
		free(e);
		return NULL;
	}
	e->dev = dev;
	e->next = ctx_list;
	ctx_list = e;
	return e->ctx;
}

/* ---- Protection domains, one per device context ------------------------ */

struct sv_pd_ent {
	struct sv_pd_ent *next;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct sv_regcache *rc; /* zero-copy registrations in this PD */
	unsigned int refs;
};

static struct sv_lock pd_lock = SV_LOCK_INIT(SV_RANK_TRANSPORT);
static struct sv_pd_ent *pd_list;

static const struct sv_regcache_ops regcache_ops;

int sv_verbs_pd_get(struct ibv_context *ctx, struct ibv_pd **out, struct sv_regcache **rc_out)
{
	int r = 0;
	sv_lock(&pd_lock);
	struct sv_pd_ent *e;
	for (e = pd_list; e; e = e->next)
		if (e->ctx == ctx)
			break;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			r = -ENOMEM;
			goto unlock;
		}
		e->pd = ibv_alloc_pd(ctx);
		if (!e->pd) {
			r = last_err();
			sv_err("verbs: ibv_alloc_pd on %s: %s", ibv_get_device_name(ctx->device),
			       strerror(-r));
			goto free_entry;
		}
		struct sv_regcache_params prm;
		sv_regcache_default_params(&prm);
		r = sv_regcache_create(&e->rc, &regcache_ops, e->pd, &prm);
		if (r) {
			sv_err("verbs: registration cache: %s", strerror(-r));
			ibv_dealloc_pd(e->pd);
			goto free_entry;
		}
		/* With libibverbs' fork support on (RDMAV_FORK_SAFE on a kernel
		 * that needs it) every registered range is MADV_DONTFORK: a
		 * cached one would be missing from children for as long as it
		 * stays cached. Register per send then. */
		if (ibv_is_fork_initialized() == IBV_FORK_ENABLED)
			sv_regcache_disable(e->rc);
		e->ctx = ctx;
		e->next = pd_list;
		pd_list = e;
	}
	e->refs++;
	*out = e->pd;
	*rc_out = e->rc;
	goto unlock;

free_entry:
	free(e);
unlock:
	sv_unlock(&pd_lock);
	return r;
}

void sv_verbs_atfork_child(void)
{
	/* The parent's contexts and PDs are the parent's (their files are
	 * useless here): start afresh. */
	sv_lock_reinit(&pd_lock);
	ctx_list = NULL;
	pd_list = NULL;
	sv_verbs_kit_atfork_child();
}

void sv_verbs_pd_put(struct ibv_pd *pd)
{
	sv_lock(&pd_lock);
	for (struct sv_pd_ent **pe = &pd_list; *pe; pe = &(*pe)->next) {
		struct sv_pd_ent *e = *pe;
		if (e->pd != pd)
			continue;
		if (--e->refs == 0) {
			*pe = e->next;
			/* Every connection of the PD is gone: nothing is held. */
			sv_regcache_destroy(e->rc);
			int r = ibv_dealloc_pd(e->pd);
			if (r)
				sv_warn("verbs: ibv_dealloc_pd: %s", strerror(-neg_err(r)));
			free(e);
		}
		break;
	}
	sv_unlock(&pd_lock);
}

/* ---- Zero-copy registrations ------------------------------------------ */

/* User memory is registered through the PD's registration cache
 * (regcache.c): a registration made for one send is kept and reused by
 * later sends from the same pages, but only after checking that the
 * addresses still map the pages it pinned (the application may have freed
 * and unmapped them, and glibc does that through calls no interposer
 * sees). Where that check is impossible the cache registers per send.
 *
 * Sending only needs local read access, which every MR has: access 0 also
 * registers read-only memory (string constants, PROT_READ file mappings).
 * Should a provider refuse it, retry with LOCAL_WRITE. */
static int rc_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
	struct ibv_pd *pd = ctx;
	struct ibv_mr *m = ibv_reg_mr(pd, addr, len, 0);
	if (!m)
		m = ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
	if (!m) {
		int r = last_err();
		sv_dbg("verbs: ibv_reg_mr of %zu user bytes at %p: %s", len, addr, strerror(-r));
		return r;
	}
	*mr = m;
	*lkey = m->lkey;
	return 0;
}

static void rc_dereg(void *ctx, void *mr)
{
	int r = ibv_dereg_mr(mr);
	if (r)
		sv_warn("verbs: ibv_dereg_mr (user memory): %s", strerror(-neg_err(r)));
}

static const struct sv_regcache_ops regcache_ops = {
	.reg = rc_reg,
	.dereg = rc_dereg,
};


struct ibv_context *sv_verbs_own_ctx(struct ibv_device *dev, int *err)
{
	sv_lock(&pd_lock);
	struct ibv_context *ctx = own_ctx(dev, err);
	sv_unlock(&pd_lock);
	return ctx;
}
