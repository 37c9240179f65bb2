/* The upgrade over rdma_cm: the client asks the server's libsovia, on the
 * same address and port (RDMA_PS_TCP), to attach an RC queue pair to a TCP
 * connection both already have; the server matches the request to a
 * connection its application accepted. Each side puts a random challenge
 * in the private data; the other side echoes it on TCP at its switch point,
 * proving the RDMA peer is the TCP peer (docs/protocol.md).
 *
 * Every rdma_cm event is handled on the helper thread with `up_lock` held,
 * and a stream's id is destroyed under the same lock: an event never sees a
 * freed stream, and rdma_destroy_id never waits for an unacked event. */
#include "cmdata.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "stream_int.h"
#include "verbs.h"

#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

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
};

/* Drop a holder. Called with up_lock. */
static void listener_put(struct sv_listener *l)
{
	if (--l->refs > 0)
		return;
	if (l->id)
		rdma_destroy_id(l->id);
	free(l);
}

/* A connect request waiting for the application to accept its TCP side. */
struct pending_req {
	struct rdma_cm_id *id;
	struct sv_cm_req req;
	uint64_t deadline;
	struct pending_req *next;
};

/* An accepted connection a request may still come for. */
struct unmatched {
	struct sv_stream *s;
	struct sv_listener *l; /* held until the request came or the wait ended */
	uint64_t deadline;
	struct unmatched *next;
};

static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pending_req *pending;
static struct unmatched *unmatched;
/* Finished entries whose holds are dropped once up_lock is released and
 * every event taken is acknowledged: the last reference of a stream takes
 * up_lock itself, and a listener's id may not be destroyed inside its own
 * CONNECT_REQUEST event. */
static struct unmatched *release_later;

static void release_unmatched(struct unmatched *u)
{
	u->next = release_later;
	release_later = u;
}

static void listener_put(struct sv_listener *l);

/* Called without up_lock. */
static void run_releases(void)
{
	pthread_mutex_lock(&up_lock);
	struct unmatched *list = release_later;
	release_later = NULL;
	for (struct unmatched *u = list; u; u = u->next)
		listener_put(u->l);
	pthread_mutex_unlock(&up_lock);
	while (list) {
		struct unmatched *n = list->next;
		sv_stream_put(list->s);
		free(list);
		list = n;
	}
}

/* Tag the context pointers so an event tells a listener from a stream. */
#define LISTENER_TAG ((uintptr_t)1)


static void random_bytes(uint8_t *b, size_t n)
{
	while (n) {
		ssize_t r = getrandom(b, n, 0);
		if (r <= 0)
			continue; /* EINTR; the pool is ready long before a connection */
		b += r;
		n -= (size_t)r;
	}
}

/* Create the QP, its buffers and the core on s->id; receives are posted
 * before the connection is established. Called with s->lock held. */
static int attach_qp(struct sv_stream *s)
{
	struct sv_proto_params prm;
	sv_config_proto_params(&sv_cfg, &prm);
	prm.coalesce = !s->nodelay;
	int r = sv_verbs_create(&s->verbs, s->id, &prm);
	if (r < 0) {
		s->verbs = NULL;
		return r;
	}
	struct sv_xport xp = sv_verbs_xport(s->verbs);
	xp.now = sv_now_us; /* for SV_NOW_UNREAD callers (stream_tx.c) */
	r = sv_proto_init(&s->proto, &prm, &xp);
	if (r < 0) {
		sv_verbs_destroy(s->verbs);
		s->verbs = NULL;
		return r;
	}
	s->proto_ready = true;
	random_bytes(s->my_challenge, sizeof(s->my_challenge));
	return 0;
}

/* Free the protocol state and the QP of an attempt that is over. Under
 * the stream's lock. */
static void release_qp(struct sv_stream *s)
{
	if (s->proto_ready) {
		sv_proto_destroy(&s->proto);
		s->proto_ready = false;
	}
	if (s->verbs) {
		sv_verbs_destroy(s->verbs);
		s->verbs = NULL;
	}
}

/* Give up on the QP of a stream that stays on TCP. Called with up_lock. */
static void drop_qp(struct sv_stream *s, enum sv_fallback why)
{
	pthread_mutex_lock(&s->lock);
	if (s->state != SV_CONN_RDMA && s->state != SV_CONN_BROKEN) {
		s->state = SV_CONN_FALLBACK;
		if (s->fallback == SV_FB_NONE)
			s->fallback = why;
		sv_info("fd %d stays on TCP: %s", s->fd, sv_fallback_name(s->fallback));
		release_qp(s);
		sv_stream_wake(s);
	}
	pthread_mutex_unlock(&s->lock);
}

/* ---- Client ------------------------------------------------------------- */

static void start_connect(struct sv_stream *s);

static void connect_job(void *arg, int rdma_err)
{
	struct sv_stream *s = arg;
	if (rdma_err)
		sv_stream_fallback(s, sv_helper_no_rdma_reason());
	else
		start_connect(s);
	sv_stream_put(s);
}

void sv_upgrade_connect(struct sv_stream *s)
{
	if (sv_helper_start() < 0) {
		sv_stream_fallback(s, SV_FB_DISABLED);
		return;
	}
	if (sv_cfg.upgrade_delay_ms) {
		/* A connection closed sooner never pays for RDMA (the QP, its
		 * registered buffers, rdma_cm's round trips): the helper starts
		 * the upgrade when the delay is over (sv_stream_service). */
		pthread_mutex_lock(&s->lock);
		s->upgrade_at = sv_now_us() + (uint64_t)sv_cfg.upgrade_delay_ms * 1000u;
		pthread_mutex_unlock(&s->lock);
		sv_helper_watch(s);
		return;
	}
	sv_upgrade_connect_now(s);
}

void sv_upgrade_connect_now(struct sv_stream *s)
{
	sv_stream_get(s);
	int r = sv_helper_when_ready(connect_job, s);
	if (r == 0)
		return; /* the helper starts it once rdma_cm is up */
	sv_stream_put(s);
	if (r < 0)
		sv_stream_fallback(s, sv_helper_no_rdma_reason());
	else
		start_connect(s);
}

/* A request that met no RDMA listener (the IB CM's reject reason "invalid
 * service ID") is asked again this many times, after 20, 40, 80, 160 and
 * 320 ms. A fresh libsovia server opens its listener on the helper thread
 * once rdma_cm is up, after listen() has returned (listen never waits
 * for it), so a client quick enough met none: in the bed, about one first
 * connection in 30 to a new sovia-bench server stayed on TCP
 * ("fallback=rejected"). A plain TCP server never has a listener: its
 * clients pay five more requests, off the application's path (the data
 * flows on TCP meanwhile), and then stay on TCP as before. */
#define SV_REJ_NO_LISTENER 8
#define SV_CONNECT_RETRIES 5
#define SV_CONNECT_RETRY_MS 20u

static void start_connect(struct sv_stream *s)
{
	pthread_mutex_lock(&up_lock);
	struct rdma_cm_id *id;
	if (rdma_create_id(sv_helper_channel(), &id, s, RDMA_PS_TCP) < 0) {
		sv_dbg("fd %d: rdma_create_id: %s", s->fd, strerror(errno));
		pthread_mutex_unlock(&up_lock);
		sv_stream_fallback(s, SV_FB_NO_ROUTE);
		return;
	}
	pthread_mutex_lock(&s->lock);
	if (s->app_closed) {
		/* Closed before the upgrade began. The close judged, under
		 * this lock, that the helper had no part in the stream: it
		 * must not get one now. */
		pthread_mutex_unlock(&s->lock);
		rdma_destroy_id(id);
		pthread_mutex_unlock(&up_lock);
		return;
	}
	s->id = id;
	s->state = SV_CONN_RESOLVING;
	if (s->connect_retries && s->fallback == SV_FB_REJECTED)
		s->fallback = SV_FB_NONE; /* asked again (retry_connect) */
	s->deadline_us = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	struct sockaddr_storage src = s->tuple.local, dst = s->tuple.peer;
	pthread_mutex_unlock(&s->lock);
	/* The same interface as the TCP connection, any port. */
	if (src.ss_family == AF_INET)
		((struct sockaddr_in *)&src)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&src)->sin6_port = 0;
	int r = rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	if (r < 0) {
		sv_dbg("fd %d: rdma_resolve_addr: %s", s->fd, strerror(errno));
		drop_qp(s, SV_FB_NO_ROUTE);
	}
	pthread_mutex_unlock(&up_lock);
	if (r == 0)
		sv_helper_watch(s);
}

static void client_route_resolved(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	int r = s->state == SV_CONN_RESOLVING ? attach_qp(s) : -ECANCELED;
	struct sv_cm_req req = {
		.version = SV_CM_VERSION,
		.nrecv = (uint16_t)(s->proto_ready ? sv_proto_nrecv(&s->proto.prm) : 0),
		.buf_size = s->proto.prm.buf_size,
		.client = s->tuple.local,
		.server = s->tuple.peer,
	};
	memcpy(req.challenge, s->my_challenge, SV_CHALLENGE_SIZE);
	if (r == 0)
		s->state = SV_CONN_REQUESTED;
	pthread_mutex_unlock(&s->lock);
	if (r < 0) {
		drop_qp(s, r == -ECANCELED ? SV_FB_TIMEOUT : SV_FB_RESOURCES);
		return;
	}
	uint8_t pd[SV_CM_REQ_MAX];
	int len = sv_cm_req_encode(&req, pd);
	if (len < 0) {
		drop_qp(s, SV_FB_NO_ROUTE);
		return;
	}
	struct rdma_conn_param cp = {
		.private_data = pd,
		.private_data_len = (uint8_t)len,
		.retry_count = 7,
		.rnr_retry_count = 7,
		.qp_num = sv_verbs_qp_num(s->verbs),
	};
	if (rdma_connect(s->id, &cp) < 0) {
		sv_dbg("fd %d: rdma_connect: %s", s->fd, strerror(errno));
		drop_qp(s, SV_FB_UNREACHABLE);
	}
}

/* The server had no RDMA listener (yet): drop this attempt's QP and id
 * and have the helper ask again later (SV_CONNECT_RETRIES). Until then
 * the connection is on TCP, labelled with the reason it keeps if no retry
 * gets through. False when no retry is due: the caller falls back. The id
 * is the caller's to destroy (its event is not acknowledged yet). Called
 * with up_lock. */
static bool retry_connect(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	bool go = s->is_client && s->state == SV_CONN_REQUESTED && !s->app_closed &&
		  !s->error && !s->tx_shut && s->connect_retries < SV_CONNECT_RETRIES;
	if (go) {
		release_qp(s);
		s->id = NULL;
		s->state = SV_CONN_TCP;
		s->fallback = SV_FB_REJECTED;
		uint32_t ms = SV_CONNECT_RETRY_MS << s->connect_retries;
		s->connect_retries++;
		s->upgrade_at = sv_now_us() + (uint64_t)ms * 1000u;
		sv_info("fd %d: no RDMA listener at the server (yet): asking again in %u ms", s->fd,
			ms);
	}
	pthread_mutex_unlock(&s->lock);
	if (go)
		sv_helper_watch(s);
	return go;
}

static void client_established(struct sv_stream *s, const struct rdma_conn_param *cp)
{
	struct sv_cm_rep rep;
	int r = sv_cm_rep_decode(cp->private_data, cp->private_data_len, &rep);
	if (r == 0) {
		pthread_mutex_lock(&s->lock);
		r = sv_proto_set_peer(&s->proto, rep.nrecv, rep.buf_size);
		memcpy(s->peer_challenge, rep.challenge, SV_CHALLENGE_SIZE);
		pthread_mutex_unlock(&s->lock);
	}
	if (r < 0) {
		sv_upgrade_disconnect(s);
		drop_qp(s, r == -EPROTONOSUPPORT ? SV_FB_VERSION : SV_FB_REJECTED);
		return;
	}
	sv_stream_established(s);
	sv_helper_watch(s);
}

/* ---- Server ------------------------------------------------------------- */

/* Open the RDMA listener on l->addr. Called with up_lock. */
static void create_listener(struct sv_listener *l)
{
	if (rdma_create_id(sv_helper_channel(), &l->id, (void *)((uintptr_t)l | LISTENER_TAG),
			   RDMA_PS_TCP) < 0)
		goto failed;
	if (rdma_bind_addr(l->id, (struct sockaddr *)&l->addr) < 0) {
		sv_info("fd %d: no RDMA listener on its address (%s); its connections stay on TCP",
			l->fd, strerror(errno));
		goto destroy_id;
	}
	if (rdma_listen(l->id, 128) < 0) {
		sv_info("fd %d: rdma_listen: %s", l->fd, strerror(errno));
		goto destroy_id;
	}
	sv_dbg("fd %d: RDMA listener up beside it", l->fd);
	return;

destroy_id:
	rdma_destroy_id(l->id);
	l->id = NULL;
failed:
	l->failed = true;
}

static void listen_job(void *arg, int rdma_err)
{
	struct sv_listener *l = arg;
	pthread_mutex_lock(&up_lock);
	if (rdma_err)
		l->failed = true;
	else if (l->refs > 1)
		create_listener(l); /* the application still listens */
	listener_put(l);         /* the job's hold */
	pthread_mutex_unlock(&up_lock);
}

struct sv_listener *sv_upgrade_listen(int fd)
{
	if (sv_helper_start() < 0)
		return NULL;
	struct sv_listener *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->fd = fd;
	socklen_t len = sizeof(l->addr);
	if (getsockname(fd, (struct sockaddr *)&l->addr, &len) < 0) {
		free(l);
		return NULL;
	}
	l->refs = 2; /* the fd and the job */
	int r = sv_helper_when_ready(listen_job, l);
	if (r == 0)
		return l; /* opened by the helper once rdma_cm is up */
	if (r < 0) {
		free(l);
		return NULL;
	}
	pthread_mutex_lock(&up_lock);
	l->refs = 1;
	create_listener(l);
	bool failed = l->failed;
	if (failed)
		listener_put(l);
	pthread_mutex_unlock(&up_lock);
	return failed ? NULL : l;
}

bool sv_upgrade_listener_usable(struct sv_listener *l)
{
	pthread_mutex_lock(&up_lock);
	bool ok = !l->failed;
	pthread_mutex_unlock(&up_lock);
	return ok;
}

void sv_upgrade_unlisten(struct sv_listener *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&up_lock);
	listener_put(l);
	pthread_mutex_unlock(&up_lock);
}

void sv_upgrade_accepted(struct sv_stream *s, struct sv_listener *l)
{
	if (sv_helper_start() < 0 || sv_helper_rdma_state() < 0) {
		sv_stream_fallback(s, sv_helper_no_rdma_reason());
		return;
	}
	struct unmatched *u = malloc(sizeof(*u));
	if (!u) {
		sv_stream_fallback(s, SV_FB_RESOURCES);
		return;
	}
	uint64_t deadline = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	pthread_mutex_lock(&s->lock);
	s->deadline_us = deadline;
	pthread_mutex_unlock(&s->lock);
	sv_stream_get(s);
	u->s = s;
	u->l = l;
	u->deadline = deadline;
	pthread_mutex_lock(&up_lock);
	l->refs++;
	u->next = unmatched;
	unmatched = u;
	pthread_mutex_unlock(&up_lock);
	sv_dbg("fd %d accepted: waiting for its upgrade request", s->fd);
	sv_helper_watch(s); /* wakes the helper to match it, and times it out */
}

/* Reject and forget a request (the id is ours to destroy). */
static void reject(struct rdma_cm_id *id, bool say_version)
{
	uint8_t pd[8] = {0};
	if (say_version) {
		struct sv_cm_rep rep = {.version = SV_CM_VERSION};
		uint8_t full[SV_CM_REP_LEN];
		sv_cm_rep_encode(&rep, full);
		memcpy(pd, full, sizeof(pd));
	}
	rdma_reject(id, say_version ? pd : NULL, say_version ? sizeof(pd) : 0);
}

/* Attach the QP of request `id` to stream s and accept. */
static bool accept_request(struct sv_stream *s, struct rdma_cm_id *id, const struct sv_cm_req *req)
{
	pthread_mutex_lock(&s->lock);
	if (s->state != SV_CONN_TCP || s->id || s->app_closed) {
		sv_dbg("fd %d: upgrade request refused: state %s%s%s", s->fd,
		       sv_conn_state_name(s->state), s->id ? ", has an id" : "",
		       s->app_closed ? ", closed" : "");
		pthread_mutex_unlock(&s->lock);
		return false; /* already upgrading (a duplicate), or gone */
	}
	s->id = id;
	id->context = s;
	int r = attach_qp(s);
	if (r == 0)
		r = sv_proto_set_peer(&s->proto, req->nrecv, req->buf_size);
	if (r == 0)
		r = sv_verbs_connected(s->verbs); /* ready before rdma_accept */
	uint32_t qp_num = r == 0 ? sv_verbs_qp_num(s->verbs) : 0;
	struct sv_cm_rep rep = {.version = SV_CM_VERSION};
	if (r == 0) {
		memcpy(s->peer_challenge, req->challenge, SV_CHALLENGE_SIZE);
		rep.nrecv = (uint16_t)sv_proto_nrecv(&s->proto.prm);
		rep.buf_size = s->proto.prm.buf_size;
		memcpy(rep.challenge, s->my_challenge, SV_CHALLENGE_SIZE);
		s->state = SV_CONN_REQUESTED;
		s->deadline_us = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	}
	pthread_mutex_unlock(&s->lock);
	if (r < 0) {
		rdma_reject(id, NULL, 0);
		drop_qp(s, SV_FB_RESOURCES);
		return true; /* the id belongs to the stream now */
	}
	uint8_t pd[SV_CM_REP_LEN];
	sv_cm_rep_encode(&rep, pd);
	struct rdma_conn_param cp = {
		.private_data = pd,
		.private_data_len = sizeof(pd),
		.retry_count = 7,
		.rnr_retry_count = 7,
		.qp_num = qp_num,
	};
	if (rdma_accept(id, &cp) < 0) {
		sv_dbg("fd %d: rdma_accept: %s", s->fd, strerror(errno));
		drop_qp(s, SV_FB_RESOURCES);
	}
	return true;
}

/* Find the accepted stream a request is for. Called with up_lock. */
static struct unmatched **find_unmatched(const struct sv_cm_req *req)
{
	for (struct unmatched **pp = &unmatched; *pp; pp = &(*pp)->next) {
		struct sv_stream *s = (*pp)->s;
		if (sv_addr_equal(&s->tuple.local, &req->server) &&
		    sv_addr_equal(&s->tuple.peer, &req->client))
			return pp;
	}
	return NULL;
}

/* Try to match a request; true when it is settled (accepted or refused).
 * A refused id is left in *destroy: it may not be destroyed while its own
 * event (the CONNECT_REQUEST) is not acknowledged yet. */
static bool match_request(struct rdma_cm_id *id, const struct sv_cm_req *req,
			  struct rdma_cm_id **destroy)
{
	struct unmatched **pp = find_unmatched(req);
	if (!pp)
		return false;
	struct unmatched *u = *pp;
	*pp = u->next;
	sv_dbg("upgrade request matched fd %d", u->s->fd);
	if (!accept_request(u->s, id, req)) {
		rdma_reject(id, NULL, 0);
		*destroy = id;
	}
	release_unmatched(u);
	return true;
}

static void connect_request(struct rdma_cm_event *ev, struct rdma_cm_id **destroy)
{
	struct rdma_cm_id *id = ev->id;
	struct sv_cm_req req;
	int r = sv_cm_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
				 &req);
	if (r < 0) {
		/* Not ours (an rsockets peer, say), or another version. */
		sv_dbg("upgrade request: not libsovia's or another version (%d): rejected", r);
		reject(id, r == -EPROTONOSUPPORT);
		*destroy = id;
		return;
	}
	/* The request must come from the TCP peer's host. */
	struct sockaddr *peer = rdma_get_peer_addr(id);
	struct sockaddr_storage ps = {0};
	memcpy(&ps, peer, peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						       : sizeof(struct sockaddr_in));
	if (!sv_addr_same_host(&ps, &req.client)) {
		sv_dbg("upgrade request from another host than its TCP client");
		sv_warn("an upgrade request from another host than its TCP peer: refused");
		reject(id, false);
		*destroy = id;
		return;
	}
	id->context = NULL;
	if (match_request(id, &req, destroy)) {
		sv_dbg("upgrade request: matched an accepted connection");
		return;
	}
	sv_dbg("upgrade request: no accepted connection yet; waiting for accept()");
	/* The application has not accepted the TCP connection yet. */
	struct pending_req *p = malloc(sizeof(*p));
	if (!p) {
		reject(id, false);
		*destroy = id;
		return;
	}
	p->id = id;
	p->req = req;
	p->deadline = sv_now_us() + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
	p->next = pending;
	pending = p;
}

uint64_t sv_upgrade_timers(uint64_t now)
{
	uint64_t next = 0;
	pthread_mutex_lock(&up_lock);
	for (struct pending_req **pp = &pending; *pp;) {
		struct pending_req *p = *pp;
		struct rdma_cm_id *refused = NULL;
		bool settled = match_request(p->id, &p->req, &refused);
		if (refused)
			rdma_destroy_id(refused); /* its event was acknowledged long ago */
		if (!settled && now >= p->deadline) {
			/* Its TCP connection was never accepted in time. */
			sv_dbg("upgrade request: no matching accepted connection in time: rejected");
			reject(p->id, false);
			rdma_destroy_id(p->id);
			settled = true;
		}
		if (settled) {
			*pp = p->next;
			free(p);
			continue;
		}
		if (!next || p->deadline < next)
			next = p->deadline;
		pp = &p->next;
	}
	for (struct unmatched **pp = &unmatched; *pp;) {
		struct unmatched *u = *pp;
		pthread_mutex_lock(&u->s->lock);
		bool gone = now >= u->deadline || u->s->app_closed || u->s->state != SV_CONN_TCP;
		pthread_mutex_unlock(&u->s->lock);
		if (gone) {
			*pp = u->next;
			release_unmatched(u);
			continue;
		}
		if (!next || u->deadline < next)
			next = u->deadline;
		pp = &u->next;
	}
	pthread_mutex_unlock(&up_lock);
	run_releases();
	return next;
}

/* ---- Events ------------------------------------------------------------- */

static enum sv_fallback reject_reason(const struct rdma_cm_event *ev)
{
	struct sv_cm_rep rep;
	const uint8_t *pd = ev->param.conn.private_data;
	if (pd && ev->param.conn.private_data_len >= 5 &&
	    sv_cm_rep_decode(pd, ev->param.conn.private_data_len, &rep) == -EPROTONOSUPPORT)
		return SV_FB_VERSION;
	return SV_FB_REJECTED;
}

/* One event; called with up_lock held. It is acknowledged here. */
static void handle_event(struct rdma_cm_event *ev)
{
	struct rdma_cm_id *destroy = NULL;
	{
		uintptr_t c = (uintptr_t)ev->id->context;
		sv_dbg("rdma_cm: %s (status %d) for %s", rdma_event_str(ev->event), ev->status,
		       ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? "a listener"
		       : !c                                    ? "nobody"
		       : (c & LISTENER_TAG)                    ? "a listener"
							       : "a stream");
	}
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		connect_request(ev, &destroy);
		goto ack;
	}
	uintptr_t ctx = (uintptr_t)ev->id->context;
	if (!ctx || (ctx & LISTENER_TAG))
		goto ack; /* a listener's own event, or a stream that is gone */
	struct sv_stream *s = (struct sv_stream *)ctx;
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(ev->id, 2000) < 0)
			drop_qp(s, SV_FB_NO_ROUTE);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		client_route_resolved(s);
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		/* Our QP is not librdmacm's: we make it ready, then complete
		 * the connection (the server gets ESTABLISHED). */
		if (!s->is_client || !s->verbs || sv_verbs_connected(s->verbs) < 0 ||
		    rdma_establish(ev->id) < 0) {
			sv_dbg("fd %d: completing the connection failed", s->fd);
			sv_upgrade_disconnect(s);
			drop_qp(s, SV_FB_RESOURCES);
			break;
		}
		client_established(s, &ev->param.conn);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (s->is_client) {
			client_established(s, &ev->param.conn);
		} else {
			sv_stream_established(s);
			sv_helper_watch(s);
		}
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		drop_qp(s, SV_FB_NO_ROUTE);
		break;
	case RDMA_CM_EVENT_REJECTED:
		if (ev->status == SV_REJ_NO_LISTENER && retry_connect(s)) {
			destroy = ev->id; /* once its event is acknowledged */
			break;
		}
		drop_qp(s, reject_reason(ev));
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		drop_qp(s, SV_FB_UNREACHABLE);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		sv_upgrade_disconnect(s);
		sv_stream_qp_down(s, -ECONNRESET);
		break;
	default:
		break;
	}
ack:
	rdma_ack_cm_event(ev);
	if (destroy)
		rdma_destroy_id(destroy);
}

void sv_upgrade_events(struct rdma_event_channel *ch)
{
	/* Events are taken from the channel with up_lock held: rdma_destroy_id
	 * (always called with up_lock) waits for every event already taken for
	 * its id to be acknowledged, so none may be in a hand that waits for
	 * the lock. */
	pthread_mutex_lock(&up_lock);
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(ch, &ev) == 0)
		handle_event(ev);
	pthread_mutex_unlock(&up_lock);
	run_releases();
}

/* The stream is being freed: its QP and id go with it. */
void sv_upgrade_forget(struct sv_stream *s)
{
	pthread_mutex_lock(&up_lock);
	if (s->id)
		s->id->context = NULL;
	if (s->verbs) {
		sv_verbs_destroy(s->verbs);
		s->verbs = NULL;
	}
	if (s->id) {
		rdma_destroy_id(s->id);
		s->id = NULL;
	}
	pthread_mutex_unlock(&up_lock);
}

void sv_upgrade_disconnect(struct sv_stream *s)
{
	if (s->id)
		rdma_disconnect(s->id);
	sv_verbs_qp_error(s->verbs);
}

void sv_upgrade_atfork_child(void)
{
	/* The parent's requests and connections are the parent's. */
	pthread_mutex_init(&up_lock, NULL);
	pending = NULL;
	unmatched = NULL;
	release_later = NULL;
}
