/* A connection's queue pair as the stream sees it: the message transport
 * under the protocol core (proto.h's sv_xport) plus what the stream needs
 * to wait on it and end it. The verbs transport (verbs.c) is the real one;
 * the stream-layer tests give an in-process fake. Calls are serialised by
 * the stream's lock. */
#ifndef SV_QP_H
#define SV_QP_H

#include "proto.h"

#include <stdint.h>

struct sv_qp;
struct sv_regcache_stats;

struct sv_qp_ops {
	/* The transport to give the core. */
	struct sv_xport (*xport)(struct sv_qp *q);
	/* Take every completion and feed it to the core, in order. The number
	 * handled, or -errno (a failed work request: the core is aborted;
	 * every completion is consumed even then). */
	int (*poll_cq)(struct sv_qp *q, struct sv_proto *p, struct sv_clock *clk);
	/* Ask for an event at the next completion: the transport's channel
	 * then fires `node` (hub.h). Poll once more after arming, before
	 * sleeping. 0 or -errno. */
	int (*arm)(struct sv_qp *q);
	/* The QP's number, for rdma_connect/rdma_accept. */
	uint32_t (*num)(const struct sv_qp *q);
	/* Ready to send and receive (RTR, then RTS). 0 or -errno. */
	int (*connected)(struct sv_qp *q);
	/* Into the error state: everything posted comes back flushed. */
	void (*to_error)(struct sv_qp *q);
	/* Free it all (after the core that used its buffers is gone). */
	void (*destroy)(struct sv_qp *q);
	/* The counters of the registration cache its zero-copy sends use
	 * (may be NULL: no cache). */
	void (*regcache_stats)(struct sv_qp *q, struct sv_regcache_stats *st);
	/* Stream bytes (DATA's payload) posted and not completed: on RC, not
	 * known to be in the peer's receive buffers yet (SIOCOUTQ counts
	 * them). */
	uint64_t (*data_in_flight)(const struct sv_qp *q);
};

struct sv_hub_node;

struct sv_qp {
	const struct sv_qp_ops *ops;
	/* What an armed completion fires (the stream's), set by the stream
	 * before it first arms; read by the channel's drain under the hub's
	 * lock. */
	struct sv_hub_node *node;
};

static inline int sv_qp_poll(struct sv_qp *q, struct sv_proto *p, struct sv_clock *clk)
{
	return q->ops->poll_cq(q, p, clk);
}

static inline int sv_qp_arm(struct sv_qp *q)
{
	return q->ops->arm(q);
}

#endif
