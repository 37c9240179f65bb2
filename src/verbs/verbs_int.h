/* Shared by the verbs transport's files: verbs.c (the QP, its buffers and
 * completions) and verbs_pd.c (device contexts, protection domains). */
#ifndef SV_VERBS_INT_H
#define SV_VERBS_INT_H

#include <errno.h>
#include <stdint.h>

struct ibv_comp_channel;
struct ibv_context;
struct ibv_device;
struct ibv_pd;
struct sv_regcache;

/* Verbs calls that return an error number return it positive; some
 * providers return it negative. Either way, -errno. */
static inline int neg_err(int r)
{
	if (r < 0)
		r = -r;
	return r ? -r : -EIO;
}

/* -errno for a call that returned NULL or -1 and set errno. */
static inline int last_err(void)
{
	return errno > 0 ? -errno : -EIO;
}

/* libsovia's own context for dev (never librdmacm's: see verbs_pd.c),
 * opened on first use, and its completion channel (the hub's, hub.h);
 * NULL with *err set. */
struct ibv_context *sv_verbs_own_ctx(struct ibv_device *dev, struct ibv_comp_channel **chan,
				     int *err);
/* The channel's drain for the hub: take its events, acknowledge each at
 * once, and fire the node of each CQ's connection. Under the hub's lock. */
void sv_verbs_chan_drain(struct ibv_comp_channel *ch);
/* The PD of ctx (shared by its connections) and its registration cache,
 * with a reference; sv_verbs_pd_put drops it. 0 or -errno. */
int sv_verbs_pd_get(struct ibv_context *ctx, struct ibv_pd **out, struct sv_regcache **rc_out);
void sv_verbs_pd_put(struct ibv_pd *pd);
/* In a fork's child: forget verbs.c's spare kit (the parent's). */
void sv_verbs_kit_atfork_child(void);

#endif
