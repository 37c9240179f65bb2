/* A client's part of the upgrade (stream_cm.c has the rest): it asks the
 * server host's warden where the server's libsovia listens (or the
 * server's port where the host has none), makes its QP once the route is
 * resolved, asks again after the answers that say "later", and checks the
 * server's reply before the switch. */
#include "stream_int.h"

#include "cm.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "peers.h"
#include "upgrade.h"
#include "verbs.h"

#include <errno.h>
#include <string.h>

static void start_connect(struct sv_stream *s);

static void connect_job(void *arg, int rdma_err)
{
	struct sv_stream *s = arg;
	if (rdma_err)
		sv_stream_cm_fall_back(s, sv_helper_creds_stale() ? SV_FB_CREDENTIALS : SV_FB_DISABLED);
	else
		start_connect(s);
	sv_stream_put(s);
}

void sv_stream_cm_connect_now(struct sv_stream *s)
{
	sv_stream_get(s);
	int r = sv_helper_when_ready(connect_job, s);
	if (r == 0)
		return; /* the helper starts it once rdma_cm is up */
	sv_stream_put(s);
	if (r < 0)
		sv_stream_cm_fall_back(s, sv_helper_creds_stale() ? SV_FB_CREDENTIALS : SV_FB_DISABLED);
	else
		start_connect(s);
}

/* A request that met no RDMA listener (the IB CM's reject reason "invalid
 * service ID") is asked again this many times, after 20, 40, 80, 160 and
 * 320 ms. A fresh libsovia server opens its listener on the helper thread
 * once rdma_cm is up, after listen() has returned (listen never waits for
 * it), so a quick client can meet none. A plain TCP server never has a
 * listener: its clients pay five more requests, off the application's path
 * (the data flows on TCP meanwhile), and then stay on TCP. */
#define SV_REJ_NO_LISTENER 8
/* Not on the wire: the warden's port had no listener (retry_connect). */
#define SV_CM_REJ_NO_WARDEN (-1000)
#define SV_CONNECT_RETRIES 5
#define SV_CONNECT_RETRY_MS 20u
/* "Later" (a connection back on TCP that another process of the server
 * holds too): asked again after 200 ms, then at twice the last interval
 * up to 3.2 s (the server's own looks at its holders back off as far),
 * at most 96 times (about 5 minutes): a server that says it for ever
 * costs a request every 3.2 s, for a while. */
#define SV_LATER_RETRIES 96
#define SV_LATER_RETRY_MS 200u
#define SV_LATER_RETRY_MAX_MS 3200u

static void start_connect(struct sv_stream *s)
{
	sv_upgrade_lock();
	struct rdma_cm_id *id;
	if (sv_cm->create_id(sv_helper_channel(), &id, s, RDMA_PS_TCP) < 0) {
		int err = errno;
		sv_dbg("fd %d: rdma_create_id: %s", s->fd, strerror(err));
		sv_upgrade_unlock();
		/* EACCES: the credentials changed while we were on the way here */
		sv_stream_cm_fall_back(s, err == EACCES ? SV_FB_CREDENTIALS : SV_FB_NO_ROUTE);
		return;
	}
	sv_lock(&s->lock);
	if (s->cl.app_closed || s->state != SV_CONN_TCP) {
		/* Closed (or called off) before the upgrade began. The close
		 * judged, under this lock, that the helper had no part in the
		 * stream: it must not get one now. */
		sv_unlock(&s->lock);
		sv_cm->destroy_id(id);
		sv_upgrade_unlock();
		return;
	}
	s->id = id;
	sv_stream_set_state(s, SV_CONN_RESOLVING);
	if ((s->up.connect_retries || s->up.later_retries) && s->fallback == SV_FB_REJECTED)
		s->fallback = SV_FB_NONE; /* asked again (retry_connect) */
	s->up.deadline_us = sv_upgrade_deadline(sv_now_us());
	struct sockaddr_storage src = s->tuple.local, dst = s->tuple.peer;
	uint16_t redirected = s->up.redirect_port;
	/* Where the server's libsovia listens is the warden's to say, if its
	 * host has one: the server's own port in rdma_cm's space may be held
	 * by anyone (warden.h). A redirect comes from the warden, or from the
	 * listener it sent us to. */
	if (!s->up.no_warden && !sv_cfg.warden_required && sv_upgrade_no_warden_known(&dst, sv_now_us()))
		s->up.no_warden = true;
	bool warden = !redirected && sv_cfg.warden_port && !s->up.no_warden;
	s->up.at_warden = warden;
	sv_unlock(&s->lock);
	/* The same interface as the TCP connection, any port; the warden's,
	 * the one we were sent to, or the server's. */
	sv_addr_set_port(&src, 0);
	/* An IPv6 socket's IPv4 connection (IPv4-mapped): rdma_cm routes
	 * the IPv4 addresses. */
	sv_addr_unmap(&src);
	sv_addr_unmap(&dst);
	if (redirected)
		sv_addr_set_port(&dst, redirected);
	else if (warden)
		sv_addr_set_port(&dst, (uint16_t)sv_cfg.warden_port);
	int r = sv_cm->resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	if (r < 0) {
		sv_dbg("fd %d: rdma_resolve_addr: %s", s->fd, strerror(errno));
		sv_stream_cm_drop_qp(s, SV_FB_NO_ROUTE);
	}
	sv_upgrade_unlock();
	if (r == 0)
		sv_helper_watch(s);
}

/* The QP number a request to the warden names: it has no QP of ours (the
 * warden only rejects, saying where to ask), and rdma_cm carries the
 * number without looking at it. Not 0, 1 (the special QPs) or 0xffffff
 * (multicast). */
#define SV_WARDEN_QPN 0x5356u

void sv_stream_cm_route_resolved(struct sv_stream *s)
{
	sv_lock(&s->lock);
	bool was_waiting = s->up.room_wait;
	/* Asking the warden: no QP and no buffers, and the connection stays
	 * RESOLVING (where a connection waiting for room has none either). A
	 * QP made for a request that is only ever rejected cost the warden's
	 * round trip most of its time (docs/benchmarks.md). */
	bool warden = s->up.at_warden;
	int r = s->state != SV_CONN_RESOLVING ? -ECANCELED : warden ? 0 : sv_stream_cm_attach_qp(s);
	struct sv_cm_req req = {
		.version = SV_CM_VERSION,
		.client = s->tuple.local,
		.server = s->tuple.peer,
	};
	uint32_t qp_num = SV_WARDEN_QPN;
	if (r == 0 && !warden) {
		const struct sv_proto_params *prm = sv_proto_params(s->proto);
		req.nrecv = (uint16_t)sv_proto_nrecv(prm);
		req.buf_size = sv_proto_start_size(prm);
		memcpy(req.challenge, s->sw.my_challenge, SV_CHALLENGE_SIZE);
		qp_num = s->qp->ops->num(s->qp);
		sv_stream_set_state(s, SV_CONN_REQUESTED);
	}
	sv_unlock(&s->lock);
	if (r == -EAGAIN) {
		/* From now on the helper looks at it at every wake-up, and a
		 * give-back wakes it (stream_service.c): one look to start. A
		 * kick at every refusal would have it look again at once, for
		 * ever. */
		if (!was_waiting)
			sv_helper_watch(s);
		return;
	}
	if (r < 0) {
		sv_stream_cm_drop_qp(s, r == -ECANCELED ? SV_FB_TIMEOUT
				 : r == -ENOBUFS ? SV_FB_MEMLOCK
						 : SV_FB_RESOURCES);
		return;
	}
	uint8_t pd[SV_CM_REQ_MAX];
	int len = sv_cm_req_encode(&req, pd);
	if (len < 0) {
		sv_stream_cm_drop_qp(s, SV_FB_NO_ROUTE);
		return;
	}
	struct rdma_conn_param cp = {
		.private_data = pd,
		.private_data_len = (uint8_t)len,
		.retry_count = SV_TRANSPORT_RETRY,
		.rnr_retry_count = SV_RNR_RETRY,
		.qp_num = qp_num,
	};
	if (sv_cm->connect_id(s->id, &cp) < 0) {
		sv_dbg("fd %d: rdma_connect: %s", s->fd, strerror(errno));
		sv_stream_cm_drop_qp(s, SV_FB_UNREACHABLE);
	}
}

void sv_stream_cm_retry_room(struct sv_stream *s)
{
	sv_upgrade_lock();
	sv_stream_cm_route_resolved(s);
	sv_upgrade_unlock();
}

/* The server had no RDMA listener (yet), its accept() waits for our
 * first bytes (SV_CM_REJ_WRITE_FIRST), it had too many requests waiting
 * (SV_CM_REJ_BUSY), or another of its processes holds the connection
 * (SV_CM_REJ_REDIRECT to port `to`): drop this attempt's QP and id and
 * have the helper ask again, later or (redirected) at once, within
 * SV_CONNECT_RETRIES. "Later" (SV_CM_REJ_LATER) has retries of its own.
 * Until then the connection is on TCP, labelled with the reason it keeps
 * if no retry gets through. False when no retry is due: the caller falls
 * back. The id is the caller's to destroy (its event is not acknowledged
 * yet). With up_lock. */
static bool retry_connect(struct sv_stream *s, int said, uint16_t to)
{
	bool write_first = said == SV_CM_REJ_WRITE_FIRST, busy = said == SV_CM_REJ_BUSY;
	bool later = said == SV_CM_REJ_LATER;
	/* No warden at the server's host: the server's port, at once and
	 * not as a retry. */
	bool no_warden = said == SV_CM_REJ_NO_WARDEN;
	sv_lock(&s->lock);
	bool asked = s->state == SV_CONN_REQUESTED ||
		     (s->up.at_warden && s->state == SV_CONN_RESOLVING);
	bool go = s->is_client && asked && !s->cl.app_closed &&
		  !s->error && !s->cl.tx_shut &&
		  (later       ? s->up.later_retries < SV_LATER_RETRIES
		   : no_warden ? true
			       : s->up.connect_retries < SV_CONNECT_RETRIES);
	if (go) {
		sv_stream_cm_release_qp(s);
		s->id = NULL;
		sv_stream_set_state(s, SV_CONN_TCP);
		if (!no_warden)
			s->fallback = SV_FB_REJECTED;
		/* A redirect: that port's listener is up already. */
		uint32_t ms = to || no_warden ? 0 : SV_CONNECT_RETRY_MS << s->up.connect_retries;
		if (no_warden) {
			s->up.no_warden = true;
		} else if (later) {
			unsigned n = s->up.later_retries < 5 ? s->up.later_retries : 5;
			ms = SV_LATER_RETRY_MS << n;
			if (ms > SV_LATER_RETRY_MAX_MS)
				ms = SV_LATER_RETRY_MAX_MS;
			s->up.later_retries++;
		} else {
			s->up.connect_retries++;
		}
		bool was_redirected = s->up.redirect_port != 0;
		s->up.redirect_port = to;
		s->up.upgrade_at = sv_now_us() + (uint64_t)ms * 1000u;
		/* "No listener": a plain server, or one that has just called
		 * listen() (a passive FTP data port in a fresh session
		 * process), whose RDMA listener comes up with its rdma_cm,
		 * after its client's first request. The port is remembered as
		 * plain (its next clients leave their connections to the
		 * kernel) until a retry gets through (sv_peers_learn), and a
		 * held connection keeps holding until its span after the
		 * retry. A server whose accept() waits for data gets our
		 * first bytes on TCP. */
		if (write_first) {
			sv_stream_end_hold(s, UINT64_MAX);
		} else {
			sv_stream_hold_past(s, s->up.upgrade_at);
			/* Not for a second life's ask: a server that closed its
			 * listening socket; nor for a host without a warden. */
			if (!busy && !later && !to && !no_warden && !was_redirected &&
			    !s->revived)
				sv_peers_plain_port(&s->tuple.peer);
		}
		sv_info("fd %d: %s: asking again in %u ms", s->fd,
			write_first ? "the server accepts once we wrote: our first bytes go on TCP"
			: no_warden ? "no sovia-warden at the server's host: at the server's port"
			: said == SV_CM_REJ_UNKNOWN
				? "the server host's sovia-warden knows no RDMA listener for it (yet)"
			: later	    ? "another process of the server holds it too, for now"
			: busy	    ? "the server has too many requests waiting"
			: to	    ? "another process of the server holds it: at its port"
				    : "no RDMA listener at the server (yet)",
			ms);
	}
	sv_unlock(&s->lock);
	if (go)
		sv_helper_watch(s);
	return go;
}

void sv_stream_cm_client_established(struct sv_stream *s, const struct rdma_conn_param *cp)
{
	struct sv_cm_rep rep;
	int r = sv_cm_rep_decode(cp->private_data, cp->private_data_len, &rep);
	if (r == 0) {
		sv_lock(&s->lock);
		r = s->proto ? sv_proto_set_peer(s->proto, rep.nrecv, rep.buf_size) : -ECANCELED;
		memcpy(s->sw.peer_challenge, rep.challenge, SV_CHALLENGE_SIZE);
		/* Our own challenge back: we would write it on TCP, and a
		 * server that echoes its input would hand it back to us as
		 * the proof, from an RDMA peer that is not the TCP peer. */
		if (r == 0 && !memcmp(rep.challenge, s->sw.my_challenge, SV_CHALLENGE_SIZE))
			r = -EACCES;
		sv_unlock(&s->lock);
	}
	if (r < 0) {
		if (r == -EACCES)
			sv_warn("fd %d: the RDMA peer handed us our own challenge: it stays on TCP",
				s->fd);
		sv_stream_cm_disconnect_locked(s);
		sv_stream_cm_drop_qp(s, r == -EPROTONOSUPPORT ? SV_FB_VERSION
				 : r == -EACCES	       ? SV_FB_CHALLENGE
							: SV_FB_REJECTED);
		return;
	}
	sv_stream_cm_established(s);
}

/* Our QP is not librdmacm's: we make it ready, then complete the
 * connection (the server gets ESTABLISHED). */
void sv_stream_cm_connect_response(struct sv_stream *s, struct rdma_cm_event *ev)
{
	sv_lock(&s->lock);
	bool ok = s->is_client && s->qp && s->qp->ops->connected(s->qp) == 0;
	sv_unlock(&s->lock);
	if (!ok || sv_cm->establish(ev->id) < 0) {
		sv_dbg("fd %d: completing the connection failed", s->fd);
		sv_stream_cm_disconnect_locked(s);
		sv_stream_cm_drop_qp(s, SV_FB_RESOURCES);
		return;
	}
	sv_stream_cm_client_established(s, &ev->param.conn);
}

/* What a rejection said: SV_CM_REJ_*, or -errno (cmdata.h). */
static int reject_said(const struct rdma_cm_event *ev)
{
	return sv_cm_rej_decode(ev->param.conn.private_data, ev->param.conn.private_data_len);
}

void sv_stream_cm_rejected(struct sv_stream *s, struct rdma_cm_event *ev,
			   struct rdma_cm_id **destroy)
{
	int said = reject_said(ev);
	uint16_t to = said == SV_CM_REJ_REDIRECT
			      ? sv_cm_rej_port(ev->param.conn.private_data,
					       ev->param.conn.private_data_len)
			      : 0;
	bool warden = s->up.at_warden;
	if (warden && ev->status == SV_REJ_NO_LISTENER) {
		/* No warden on the server's host: what the server's port
		 * says, unless only a warden's word will do. */
		if (sv_cfg.warden_required) {
			sv_stream_cm_drop_qp(s, SV_FB_UNVOUCHED);
			return;
		}
		sv_upgrade_no_warden_learn(&s->tuple.peer, sv_now_us());
		said = SV_CM_REJ_NO_WARDEN;
	}
	bool again = said == SV_CM_REJ_WRITE_FIRST || said == SV_CM_REJ_BUSY ||
		     said == SV_CM_REJ_LATER || said == SV_CM_REJ_NO_WARDEN ||
		     said == SV_CM_REJ_UNKNOWN || to;
	if ((ev->status == SV_REJ_NO_LISTENER || again) && retry_connect(s, said, to)) {
		*destroy = ev->id; /* once its event is acknowledged */
		return;
	}
	/* No listener after the retries, or another version: no libsovia
	 * of ours at that port. */
	if ((ev->status == SV_REJ_NO_LISTENER && !s->up.redirect_port && !s->revived) ||
	    (said == SV_CM_REJ_UNKNOWN && !s->revived) || said == -EPROTONOSUPPORT)
		sv_peers_plain_port(&s->tuple.peer);
	sv_stream_cm_drop_qp(s, said == -EPROTONOSUPPORT    ? SV_FB_VERSION
				: said == SV_CM_REJ_UNKNOWN ? SV_FB_UNVOUCHED
							    : SV_FB_REJECTED);
}
