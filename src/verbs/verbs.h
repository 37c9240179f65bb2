/* The RDMA verbs transport under the protocol core: one RC queue pair per
 * connection, created on a librdmacm id, with one completion queue, and the registered buffer pools the core numbers.
 *
 * It implements struct sv_xport_ops (proto.h). Like the core it has no
 * locks of its own (only the process-wide PD list and each PD's
 * registration cache of zero-copy memory, regcache.h, are shared, each with
 * its lock), never blocks and keeps no clocks: the caller serialises calls,
 * polls and arms; the armed completion's event goes to the device's
 * channel, which the hub's sleepers poll (hub.h). */
#ifndef SV_VERBS_H
#define SV_VERBS_H

#include "proto.h"

#include <stdint.h>

struct rdma_cm_id;

/* The user iovec pieces of one zero-copy message (proto.h); each message
 * has one more scatter/gather entry for the header in the send buffer. */
#define SV_XPORT_MAX_SGE SV_ZCOPY_MAX_IOV

/* RNR retries of our QPs: finite. Credits mean a peer that follows the
 * protocol always has a buffer posted for each message, so an RNR NAK comes
 * only from one that withholds its buffers; 7 would retry for ever and
 * block a zero-copy write whatever O_NONBLOCK, SO_SNDTIMEO or signals say.
 * After 6 the QP fails and the connection resumes over TCP (docs/protocol.md,
 * 11). We ask it of the peer in rdma_conn_param; the count our own QP uses
 * is the one the peer asked of us, so sv_verbs_connected caps it too. */
#define SV_RNR_RETRY 6
/* Transport retries (a lost packet, no ACK): 7 is the most, and finite. */
#define SV_TRANSPORT_RETRY 7
/* The local ACK timeout of our QPs, 4.096 us * 2^20 = 4.3 s per try: the
 * passive side's comes from the peer's request, and 0 there means none. */
#define SV_ACK_TIMEOUT_MAX 20

/* One connection's verbs resources. */
struct sv_verbs;

/* Create the CQ (on the device's completion channel), the RC QP on `id` (which must be bound to a device:
 * address resolved on the active side, the connect request's id on the
 * passive side) and the registered receive and send pools for `prm`.
 * The protection domain is shared by all connections on one device.
 * Call sv_proto_new right after, before rdma_connect/rdma_accept: the core
 * posts every receive buffer there. Returns 0 or -errno. */
int sv_verbs_create(struct sv_verbs **out, struct rdma_cm_id *id, const struct sv_proto_params *prm);

/* The QP lives on libsovia's own device context (not librdmacm's, which a
 * fork child inherits unusable), in the INIT state after sv_verbs_create.
 * Pass its number in rdma_connect's and rdma_accept's parameters; call
 * sv_verbs_connected on the passive side before rdma_accept, on the active
 * side on RDMA_CM_EVENT_CONNECT_RESPONSE, before rdma_establish. */
uint32_t sv_verbs_qp_num(const struct sv_verbs *v);
/* Move the QP to RTR, then RTS. Returns 0 or -errno. */
int sv_verbs_connected(struct sv_verbs *v);
/* Move the QP to the error state, flushing everything posted. librdmacm
 * does not touch our QP: call it after each rdma_disconnect. Safe on NULL. */
void sv_verbs_qp_error(struct sv_verbs *v);
/* In a fork's child: the parent's device contexts are not usable here. */
void sv_verbs_atfork_child(void);

/* Destroy the QP (the id stays the caller's: call this before
 * rdma_destroy_id), the memory registrations, the CQ and the channel, and
 * drop the PD reference. Safe on NULL and on a partially
 * created object. */
void sv_verbs_destroy(struct sv_verbs *v);

/* The same QP as the stream sees it (qp.h). */
struct sv_qp;
struct sv_qp *sv_verbs_qp(struct sv_verbs *v);

/* The ops and context to pass to sv_proto_new. */
struct sv_xport sv_verbs_xport(struct sv_verbs *v);

/* Poll the CQ until it is empty and feed each completion to the core, in
 * the order the CQ reports them. Returns the number of completions handled,
 * or -errno: -ECONNRESET for a failed work request (the core is marked
 * broken), or the core's own error. Every completion is consumed even when
 * an error is returned: send slots (and their zero-copy registrations) are
 * released on failed completions too, so a zero-copy writer waiting on
 * sv_proto_zcopy_busy() is let go. Flush errors are not reported after a
 * break, nor once both directions are done with the QP (the peer's FIN
 * received, our FIN posted or our sending back on TCP, no DATA in flight):
 * a disconnect then is the normal end, and the received data stays
 * readable up to the EOF.
 *
 * The QP goes to the error state (so that everything posted is flushed)
 * by sv_verbs_qp_error: answer RDMA_CM_EVENT_DISCONNECTED with
 * rdma_disconnect and sv_verbs_qp_error. */
int sv_verbs_poll(struct sv_verbs *v, struct sv_proto *p, struct sv_clock *clk);

/* Request an event on the channel for the next completion. Poll once more
 * after arming and before sleeping, or a completion that raced in is missed. */
int sv_verbs_arm(struct sv_verbs *v);

/* The counters of the registration cache this connection's zero-copy sends
 * use (one per device, shared by its connections). */
struct sv_regcache_stats;
void sv_verbs_regcache_stats(struct sv_verbs *v, struct sv_regcache_stats *st);

#endif
