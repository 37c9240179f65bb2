/* Shared by the upgrade's files: upgrade.c (the client, the events, the
 * QP's life) and upgrade_server.c (listeners and requests).
 *
 * Every rdma_cm event is handled on the helper thread with up_lock held,
 * and a stream's id is destroyed under the same lock: an event never sees
 * a freed stream, and rdma_destroy_id never waits for an unacknowledged
 * event. */
#ifndef SV_UPGRADE_INT_H
#define SV_UPGRADE_INT_H

#include "cm.h"
#include "cmdata.h"
#include "lock.h"
#include "stream_int.h"
#include "verbs.h"
#include "upgrade.h"

extern struct sv_lock sv_up_lock;


/* Context pointers of listeners carry this tag, so an event tells a
 * listener's id from a stream's. */
#define SV_LISTENER_TAG ((uintptr_t)1)

/* Create the QP, its buffers and the core on s->id (receives are posted
 * before the connection is established) and a challenge. With s->lock.
 * -EAGAIN: the buffers do not fit the locked-memory budget now, but may
 * later (s->sw.room_wait set: ask again); -ENOBUFS: they never could (said
 * on stderr). */
int sv_up_attach_qp(struct sv_stream *s);
/* The stream stays on TCP: its QP and core go. With up_lock, without
 * s->lock. */
void sv_up_drop_qp(struct sv_stream *s, enum sv_fallback why);
/* The QP on rdma_cm's side is connected (ESTABLISHED, or the client's
 * CONNECT_RESPONSE): the switch starts. Without s->lock. */
void sv_up_established(struct sv_stream *s);
/* Reject and forget a request (the id is the caller's to destroy); with
 * `say`, the rejection says that it is ours, our version and why. */
void sv_up_reject(struct rdma_cm_id *id, bool say, enum sv_cm_rej why);
/* Destroy id (a stream's or a listener's, its context cleared first): at
 * once, or on the helper when this thread may not call rdma_cm
 * (helper.h). */
void sv_up_destroy_id(struct rdma_cm_id *id);
/* upgrade_server.c: a connect request arrived on a listener. A refused id
 * is left in *destroy: it may not be destroyed while its own event is not
 * acknowledged yet. */
void sv_up_connect_request(struct rdma_cm_event *ev, struct rdma_cm_id **destroy);
/* upgrade_server.c: the releases of entries finished with up_lock held,
 * done without it. */
void sv_up_run_releases(void);

#endif
