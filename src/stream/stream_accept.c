/* A server's part of the upgrade (stream_cm.c has the rest): an accepted
 * connection waits, in the upgrade's list (upgrade_server.c), for the
 * request that matches it, and takes it once the application used it;
 * or, handed to a fork's child, it is the child's request. */
#include "stream_int.h"

#include "cm.h"
#include "config.h"
#include "helper.h"
#include "holders.h"
#include "log.h"
#include "upgrade.h"
#include "verbs.h"

#include <errno.h>
#include <string.h>

/* When a request for s stops waiting for its first use, if it still waits
 * at `now`; else 0. With s->lock. */
static uint64_t use_wait_end(const struct sv_stream *s, uint64_t now)
{
	return !sv_stream_app_used(s) && now < s->up.use_wait_until ? s->up.use_wait_until : 0;
}

/* Attach the QP of request `id` to stream s and accept. */
enum sv_accept_result sv_stream_cm_accept(struct sv_stream *s, struct rdma_cm_id *id,
					    const struct sv_cm_req *req)
{
	sv_lock(&s->lock);
	if (s->state == SV_CONN_FALLBACK && s->fallback == SV_FB_HANDED) {
		sv_unlock(&s->lock);
		return SV_NOT_HERE;
	}
	if (s->share && sv_copies->others_hold(s)) {
		/* Our parent (or another copy) may still use the connection:
		 * our counts would not be the stream's. The owner redirects
		 * only once we hold it alone; this request came too soon. */
		sv_dbg("fd %d: upgrade request refused: another process still holds it", s->fd);
		sv_unlock(&s->lock);
		return SV_REFUSED;
	}
	if (s->state != SV_CONN_TCP || s->id || s->cl.app_closed) {
		sv_dbg("fd %d: upgrade request refused: state %s%s%s", s->fd,
		       sv_conn_state_name(s->state), s->id ? ", has an id" : "",
		       s->cl.app_closed ? ", closed" : "");
		sv_unlock(&s->lock);
		return SV_REFUSED; /* already upgrading (a duplicate), or gone */
	}
	if (use_wait_end(s, sv_now_us())) {
		/* Not read, written nor waited on yet: an accept-then-fork
		 * server's parent forks first, and a stream with a QP could
		 * not be handed to the child. The first use wakes the helper
		 * (sv_stream_app_uses), which asks again; so does the end of
		 * the wait (sv_upgrade_timers). */
		if (!s->up.use_wait_told)
			sv_dbg("fd %d: upgrade request waits for the application's first use",
			       s->fd);
		s->up.use_wait_told = true;
		sv_unlock(&s->lock);
		return SV_ACCEPT_LATER;
	}
	if (!sv_copies_may_upgrade(s)) {
		/* A successor (src/share/redo.c): its predecessor's calls first. */
		bool later = s->state == SV_CONN_TCP;
		sv_unlock(&s->lock);
		return later ? SV_ACCEPT_LATER : SV_REFUSED;
	}
	s->id = id;
	id->context = s;
	int r = sv_stream_cm_attach_qp(s);
	if (r == -EAGAIN) {
		/* The request stays unanswered (pending_timers asks again);
		 * the stream's own deadline ends the wait. */
		s->id = NULL;
		id->context = NULL;
		sv_unlock(&s->lock);
		return SV_ACCEPT_LATER;
	}
	if (r == 0)
		r = sv_proto_set_peer(s->proto, req->nrecv, req->buf_size);
	if (r == 0)
		r = s->qp->ops->connected(s->qp); /* ready before rdma_accept */
	struct sv_cm_rep rep = {.version = SV_CM_VERSION};
	uint32_t qp_num = 0;
	if (r == 0) {
		const struct sv_proto_params *prm = sv_proto_params(s->proto);
		memcpy(s->sw.peer_challenge, req->challenge, SV_CHALLENGE_SIZE);
		rep.nrecv = (uint16_t)sv_proto_nrecv(prm);
		rep.buf_size = sv_proto_start_size(prm);
		memcpy(rep.challenge, s->sw.my_challenge, SV_CHALLENGE_SIZE);
		qp_num = s->qp->ops->num(s->qp);
		sv_stream_set_state(s, SV_CONN_REQUESTED);
		s->up.deadline_us = sv_upgrade_deadline(sv_now_us());
	}
	sv_unlock(&s->lock);
	sv_dbg("upgrade request matched fd %d", s->fd);
	if (r < 0) {
		sv_cm->reject(id, NULL, 0);
		sv_stream_cm_drop_qp(s, r == -ENOBUFS ? SV_FB_MEMLOCK : SV_FB_RESOURCES);
		return SV_ACCEPTED; /* the id belongs to the stream now */
	}
	uint8_t pd[SV_CM_REP_LEN];
	sv_cm_rep_encode(&rep, pd);
	struct rdma_conn_param cp = {
		.private_data = pd,
		.private_data_len = sizeof(pd),
		.retry_count = SV_TRANSPORT_RETRY,
		.rnr_retry_count = SV_RNR_RETRY,
		.qp_num = qp_num,
	};
	if (sv_cm->accept_id(id, &cp) < 0) {
		sv_dbg("fd %d: rdma_accept: %s", s->fd, strerror(errno));
		sv_stream_cm_drop_qp(s, SV_FB_RESOURCES);
	}
	return SV_ACCEPTED;
}

/* Where an accepted connection stands for the requests that wait (the
 * upgrade's timers). */
enum sv_conn_wait sv_stream_cm_waiting(struct sv_stream *s, uint64_t now, uint64_t *use_wait)
{
	sv_lock(&s->lock);
	bool handed = s->state == SV_CONN_FALLBACK && s->fallback == SV_FB_HANDED;
	bool gone = s->cl.app_closed || (s->state != SV_CONN_TCP && !handed);
	*use_wait = use_wait_end(s, now);
	sv_unlock(&s->lock);
	return gone ? SV_WAIT_GONE : handed ? SV_WAIT_HANDED : SV_WAIT_ON;
}

enum sv_conn_holding sv_stream_cm_holding(struct sv_stream *s, struct sv_hand *hand)
{
	sv_lock(&s->lock);
	enum sv_conn_holding h = s->share ? sv_copies->holding(s, hand) : SV_HOLD_OWN;
	sv_unlock(&s->lock);
	return h;
}

/* The application accepted s on l's socket: a request may match it. */
void sv_stream_cm_accepted(struct sv_stream *s, struct sv_listener *l)
{
	sv_lock(&s->lock);
	uint64_t now = sv_now_us(), deadline = sv_upgrade_deadline(now);
	s->up.deadline_us = deadline;
	s->up.use_wait_until = now + sv_upgrade_first_use_wait(sv_upgrade_listener_holders(l));
	if (!s->holders)
		s->holders = sv_upgrade_listener_holders(l);
	struct sockaddr_storage local = s->tuple.local, peer = s->tuple.peer;
	sv_unlock(&s->lock);
	if (!sv_upgrade_accepted(l, s, &local, &peer, deadline)) {
		sv_stream_cm_fall_back(s, SV_FB_RESOURCES);
		return;
	}
	sv_dbg("fd %d accepted: waiting for its upgrade request", s->fd);
	sv_helper_watch(s); /* wakes the helper to match it, and times it out */
}

/* A fork's child took s, handed to it: its request comes to a listener of
 * ours on its address, to which the parent redirects it. */
void sv_stream_cm_adopted(struct sv_stream *s)
{
	sv_lock(&s->lock);
	uint64_t now = sv_now_us(), deadline = sv_upgrade_deadline(now);
	s->up.deadline_us = deadline;
	struct sv_holders *h = s->holders;
	s->up.use_wait_until = now + sv_upgrade_first_use_wait(h);
	struct sockaddr_storage local = s->tuple.local, peer = s->tuple.peer;
	sv_unlock(&s->lock);
	if (!sv_upgrade_adopted(s, &local, &peer, h, deadline)) {
		sv_stream_cm_fall_back(s, SV_FB_RESOURCES);
		return;
	}
	sv_dbg("fd %d accepted: waiting for its upgrade request", s->fd);
	sv_helper_watch(s);
}

