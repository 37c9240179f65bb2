/* The connection manager under the upgrade: librdmacm's calls, and the
 * queue pair made for a connection, as one operations table. The library
 * uses librdmacm and the verbs transport (cm_rdma.c); the stream-layer
 * tests put an in-process fake in its place (sv_cm_use) before the first
 * connection, so the upgrade, the helper and the stream run unchanged
 * without an RDMA device. Every call returns as librdmacm's do: 0, or -1
 * with errno set. */
#ifndef SV_CM_H
#define SV_CM_H

#include "proto.h"

#include <rdma/rdma_cma.h>

struct sv_qp;

struct sv_cm_ops {
	struct rdma_event_channel *(*create_event_channel)(void);
	void (*destroy_event_channel)(struct rdma_event_channel *ch);
	/* Move every id of the process that is on another channel to ch,
	 * with its queued events (rdma_migrate_id); after a credential change
	 * (helper.c). No event taken may be unacknowledged. */
	int (*move_ids)(struct rdma_event_channel *ch);
	int (*create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx,
			 enum rdma_port_space ps);
	int (*destroy_id)(struct rdma_cm_id *id);
	int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
			    int timeout_ms);
	int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
	int (*connect_id)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*accept_id)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*reject)(struct rdma_cm_id *id, const void *pd, uint8_t len);
	int (*establish)(struct rdma_cm_id *id);
	int (*disconnect)(struct rdma_cm_id *id);
	int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
	/* An IPv6 id's listener takes IPv6 requests only (1) or IPv4 ones
	 * too (0), as a socket's IPV6_V6ONLY; before bind_addr. */
	int (*set_afonly)(struct rdma_cm_id *id, int afonly);
	int (*listen_id)(struct rdma_cm_id *id, int backlog);
	int (*get_event)(struct rdma_event_channel *ch, struct rdma_cm_event **ev);
	int (*ack_event)(struct rdma_cm_event *ev);
	struct sockaddr *(*peer_addr)(struct rdma_cm_id *id);
	struct sockaddr *(*local_addr)(struct rdma_cm_id *id); /* the port a bind chose */
	/* The queue pair for a connection on id (bound to a device: address
	 * resolved, or a connect request's id), its buffers registered for
	 * prm, in the INIT state. 0 or -errno (not the librdmacm convention). */
	int (*create_qp)(struct sv_qp **out, struct rdma_cm_id *id,
			 const struct sv_proto_params *prm);
	/* Does a connection between these addresses run over a link of an
	 * RDMA device (links.h)? */
	bool (*on_rdma_link)(const struct sockaddr_storage *local,
			     const struct sockaddr_storage *peer);
	/* Does a fork leave the parent's QPs and registered buffers intact
	 * (the kernel copies pinned pages for the child), so a connection may
	 * stay on its QP across a fork (shares.h)? NULL: no. */
	bool (*fork_keeps_qp)(void);
	/* In a fork's child: what the parent opened is the parent's. */
	void (*atfork_child)(void);
};

/* librdmacm's calls are made between these (sv_cm_rdma does): a fork
 * waits until no thread is between them, so that librdmacm's own locks are
 * free in the child. They nest, and a step that must not be split by a
 * fork may be made between them too, as long as no thread waits there for
 * another that is about to fork. */
void sv_cm_calls_enter(void);
void sv_cm_calls_leave(void);

/* The table in use: librdmacm's unless sv_cm_use put another. */
extern const struct sv_cm_ops *sv_cm;
extern const struct sv_cm_ops sv_cm_rdma;
void sv_cm_use(const struct sv_cm_ops *ops);

#endif
