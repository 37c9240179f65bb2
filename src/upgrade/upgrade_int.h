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
#include "holders.h"
#include "lock.h"
#include "stream_int.h"
#include "verbs.h"
#include "upgrade.h"

extern struct sv_lock sv_up_lock;


/* Context pointers of listeners carry this tag, so an event tells a
 * listener's id from a stream's. */
#define SV_LISTENER_TAG ((uintptr_t)1)

/* A listening socket's RDMA listener (upgrade_listen.c), also a fork
 * child's for the connections handed to it (upgrade_server.c). */
struct sv_listener {
	struct rdma_cm_id *id;
	struct sockaddr_storage addr;
	int fd;
	/* Holders, under up_lock: the application's listening fd, a queued
	 * creation job, and each accepted connection still waiting for its
	 * upgrade request. The application may close its listening socket
	 * right after accept() (nc -l does): like TCP's, the connections it
	 * accepted must not suffer, so the RDMA listener outlives the fd. */
	int refs;
	bool failed; /* no RDMA listener could be had on its address */
	struct sv_holders *holders; /* the family's table (NULL: none) */
	/* A fork child's, for a listening socket it inherited: its RDMA
	 * listener is on the same address, at side_port (once open). */
	bool inherited;
	atomic_bool side_started; /* its opening was asked for */
	uint16_t side_port;
	/* A fork child's for the connections handed to it (no listening
	 * socket: fd -1), one per address, in `adopters`. */
	bool adopter;
	struct sv_listener *next_adopter;
	/* Its registration with sovia-warden (warden.h): the handle + 1, 0
	 * when it has none. */
	int warden;
};

/* Drop a hold on a listener (the last frees it, its id and its warden
 * registration). With up_lock. */
void sv_up_listener_put(struct sv_listener *l);
/* upgrade_server.c: an inherited listener's accepted connections go into
 * the holders' table once its RDMA listener is open. With up_lock. */
void sv_up_enter_holders(struct sv_listener *l);

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
