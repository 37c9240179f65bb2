/* The verbs transport's device contexts and protection domains, one of
 * each per device and process, and the registration cache of each PD
 * (regcache.h). */
#include "verbs.h"
#include "verbs_int.h"

#include "hub.h"
#include "lock.h"
#include "log.h"
#include "ownfd.h"
#include "real.h"
#include "regcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
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
	/* Every CQ of ours on the device reports here: one descriptor per
	 * device, not per connection (hub.h). */
	struct ibv_comp_channel *chan;
	struct sv_hub_chan hc;
	int hub_err; /* 1 until the channel joined the hub, -errno if it could not */
};

static struct sv_ctx_ent *ctx_list; /* under pd_lock */

static void chan_drain(struct sv_hub_chan *c)
{
	struct sv_ctx_ent *e = (struct sv_ctx_ent *)((char *)c - offsetof(struct sv_ctx_ent, hc));
	sv_verbs_chan_drain(e->chan);
}

/* The channel is polled by the hub's sleepers: a read must never block. */
static int set_fd_flags(int fd)
{
	int fl = SV_REAL(fcntl)(fd, F_GETFL);
	if (fl < 0 || SV_REAL(fcntl)(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return last_err();
	return 0;
}

static int open_chan(struct sv_ctx_ent *e)
{
	e->chan = ibv_create_comp_channel(e->ctx);
	if (!e->chan) {
		int r = last_err();
		sv_err("verbs: ibv_create_comp_channel: %s", strerror(-r));
		return r;
	}
	/* libibverbs reads and closes it by this field */
	e->chan->fd = sv_ownfd_move(e->chan->fd);
	int r = set_fd_flags(e->chan->fd);
	if (r) {
		sv_err("verbs: completion channel fd flags: %s", strerror(-r));
		goto destroy_chan;
	}
	e->hc = (struct sv_hub_chan){.fd = e->chan->fd, .drain = chan_drain};
	return 0;

destroy_chan:
	ibv_destroy_comp_channel(e->chan);
	e->chan = NULL;
	return r;
}

/* Our context for dev, opened on first use and kept. Under pd_lock. */
static struct sv_ctx_ent *own_ctx(struct ibv_device *dev, int *err)
{
	for (struct sv_ctx_ent *e = ctx_list; e; e = e->next)
		if (e->dev == dev)
			return e;
	struct sv_ctx_ent *e = calloc(1, sizeof(*e));
	if (!e) {
		*err = -ENOMEM;
		return NULL;
	}
	e->dev = dev;
	e->ctx = ibv_open_device(dev);
	if (!e->ctx) {
		*err = last_err();
		sv_err("verbs: ibv_open_device %s: %s", ibv_get_device_name(dev), strerror(-*err));
		goto free_entry;
	}
	/* Its command and event files: libibverbs writes doorbells to the
	 * first. A close-all loop of the application must not take them. */
	sv_ownfd_add(e->ctx->cmd_fd);
	sv_ownfd_add(e->ctx->async_fd);
	*err = open_chan(e);
	if (*err)
		goto close_ctx;
	/* The hub's lock ranks below ours: the channel joins it after. */
	e->hub_err = 1;
	e->next = ctx_list;
	ctx_list = e;
	return e;

close_ctx:
	sv_ownfd_del(e->ctx->cmd_fd);
	sv_ownfd_del(e->ctx->async_fd);
	ibv_close_device(e->ctx);
free_entry:
	free(e);
	return NULL;
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
	 * useless here): start afresh. Their channels' files are shared with
	 * the parent: a read here would take the parent's events. */
	for (struct sv_ctx_ent *e = ctx_list; e; e = e->next) {
		if (e->chan)
			sv_ownfd_close(e->chan->fd);
		sv_ownfd_del(e->ctx->cmd_fd); /* left open: they are useless, not ours to close */
		sv_ownfd_del(e->ctx->async_fd);
	}
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


struct ibv_context *sv_verbs_own_ctx(struct ibv_device *dev, struct ibv_comp_channel **chan,
				     int *err)
{
	sv_lock(&pd_lock);
	struct sv_ctx_ent *e = own_ctx(dev, err);
	bool join = e && e->hub_err == 1;
	if (join)
		e->hub_err = 0;
	sv_unlock(&pd_lock);
	if (join && sv_hub_chan_add(&e->hc) < 0) {
		sv_err("verbs: %s: more devices than libsovia serves (%d)",
		       ibv_get_device_name(dev), SV_HUB_MAX_CHANS);
		sv_lock(&pd_lock);
		e->hub_err = -ENOSPC;
		sv_unlock(&pd_lock);
	}
	if (!e)
		return NULL;
	sv_lock(&pd_lock);
	*err = e->hub_err < 0 ? e->hub_err : 0;
	sv_unlock(&pd_lock);
	if (*err)
		return NULL; /* its completions could wake nobody */
	*chan = e->chan;
	return e->ctx;
}
