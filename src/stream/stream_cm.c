/* The stream's rdma_cm half: a client asks its server's libsovia (through
 * the server host's warden where one runs) to attach a queue pair to the
 * connection, and handles the events on its id; a server's accepted
 * connection takes the request that matched it (the upgrade module,
 * src/upgrade/, holds listeners and requests); both make and drop the QP
 * and the core on it. Every rdma_cm event comes with the upgrade's lock
 * held (sv_upgrade_lock), and a stream's id is destroyed under it. */
#include "stream_int.h"

#include "addr.h"
#include "cm.h"
#include "config.h"
#include "helper.h"
#include "holders.h"
#include "hub.h"
#include "log.h"
#include "peers.h"
#include "pinned.h"
#include "real.h"
#include "upgrade.h"
#include "verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* n bytes from the kernel's /dev/urandom: 0, or -errno. */
static int urandom_bytes(uint8_t *b, size_t n)
{
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = 0;
	while (n) {
		ssize_t k = SV_REAL(read)(fd, b, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			r = k < 0 ? -errno : -EIO;
			break;
		}
		b += k;
		n -= (size_t)k;
	}
	SV_REAL(close)(fd);
	return r;
}

/* The challenge's random bytes: 0, or -errno when the process can have none
 * (a seccomp filter that refuses getrandom and /dev/urandom): the
 * connection then stays on TCP rather than wait for them. */
static int random_bytes(uint8_t *b, size_t n)
{
	while (n) {
		ssize_t r = getrandom(b, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? errno : EIO;
			int u = urandom_bytes(b, n);
			if (u < 0) {
				static atomic_bool told;
				if (!atomic_exchange(&told, true))
					sv_warn("no random bytes for the RDMA upgrade's challenge "
						"(getrandom: %s; /dev/urandom: %s): connections stay on TCP",
						strerror(e), strerror(-u));
			}
			return u;
		}
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Destroy the stream's QP, and give back its buffers' share of the
 * locked-memory budget. */
static void destroy_qp(struct sv_stream *s)
{
	if (s->qp) {
		s->qp->ops->destroy(s->qp);
		s->qp = NULL;
	}
	sv_pinned_give(s->pinned);
	s->pinned = 0;
}

int sv_stream_cm_attach_qp(struct sv_stream *s)
{
	int r = random_bytes(s->sw.my_challenge, sizeof(s->sw.my_challenge));
	if (r < 0)
		return r;
	struct sv_proto_params prm;
	sv_config_proto_params(&sv_cfg, &prm);
	prm.coalesce = !s->opt.nodelay;
	/* What the connection starts with; growth takes its own (verbs.c). */
	size_t pin = sv_pinned_pages((size_t)(sv_proto_nrecv(&prm) + sv_proto_nsend(&prm)) *
				     sv_proto_start_size(&prm));
	r = sv_pinned_take(pin);
	if (r < 0 && sv_pinned_fits_ever(pin)) {
		if (!s->up.room_wait)
			sv_info("fd %d: its buffers wait for room in the locked-memory budget",
				s->fd);
		s->up.room_wait = pin;
		return -EAGAIN;
	}
	s->up.room_wait = 0;
	if (r < 0) {
		sv_pinned_tell(pin);
		return r;
	}
	s->pinned = pin;
	r = sv_cm->create_qp(&s->qp, s->id, &prm);
	if (r < 0) {
		s->qp = NULL;
		destroy_qp(s);
		return r;
	}
	sv_hub_lock(); /* the channel's drain reads it under this lock */
	s->qp->node = &s->wt.node;
	sv_hub_unlock();
	struct sv_xport xp = s->qp->ops->xport(s->qp);
	r = sv_proto_new(&s->proto, &prm, &xp);
	if (r < 0) {
		destroy_qp(s);
		return r;
	}
	struct sv_clock clk = SV_CLOCK_INIT;
	sv_proto_set_cork(s->proto, s->opt.cork, &clk);
	return 0;
}

/* Free the core and the QP of an attempt that is over. With s->lock. */
void sv_stream_cm_release_qp(struct sv_stream *s)
{
	sv_proto_free(s->proto);
	s->proto = NULL;
	destroy_qp(s);
}

/* The stream stays on TCP: its QP and core go. With the upgrade's lock,
 * without s->lock. */
void sv_stream_cm_drop_qp(struct sv_stream *s, enum sv_fallback why)
{
	sv_lock(&s->lock);
	bool past = s->state == SV_CONN_RDMA || s->state == SV_CONN_BROKEN ||
		    s->state == SV_CONN_RESUMING ||
		    s->state == SV_CONN_DETACHING || s->state == SV_CONN_DETACHED;
	if (!past) {
		sv_stream_fall_back(s, why);
		sv_stream_cm_release_qp(s);
	}
	sv_unlock(&s->lock);
}

/* The QP on rdma_cm's side is connected (ESTABLISHED, or the client's
 * CONNECT_RESPONSE): the switch starts. Without s->lock. */
void sv_stream_cm_established(struct sv_stream *s)
{
	sv_lock(&s->lock);
	sv_stream_established(s);
	sv_unlock(&s->lock);
	sv_helper_watch(s);
}

void sv_stream_cm_disconnect_locked(struct sv_stream *s)
{
	sv_lock(&s->lock);
	sv_stream_cm_disconnect(s);
	sv_unlock(&s->lock);
}

void sv_stream_cm_fall_back(struct sv_stream *s, enum sv_fallback why)
{
	sv_lock(&s->lock);
	sv_stream_fall_back(s, why);
	sv_unlock(&s->lock);
}

/* ---- Events ------------------------------------------------------------- */

/* An event on a stream's id. *destroy: an id to destroy once the event is
 * acknowledged. */
static void stream_event(struct sv_stream *s, struct rdma_cm_event *ev,
			 struct rdma_cm_id **destroy)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (sv_cm->resolve_route(ev->id, 2000) < 0)
			sv_stream_cm_drop_qp(s, SV_FB_NO_ROUTE);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		sv_stream_cm_route_resolved(s);
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		sv_stream_cm_connect_response(s, ev);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (s->is_client)
			sv_stream_cm_client_established(s, &ev->param.conn);
		else
			sv_stream_cm_established(s);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		sv_stream_cm_drop_qp(s, SV_FB_NO_ROUTE);
		break;
	case RDMA_CM_EVENT_REJECTED:
		sv_stream_cm_rejected(s, ev, destroy);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		sv_stream_cm_drop_qp(s, SV_FB_UNREACHABLE);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		sv_stream_cm_disconnect_locked(s);
		sv_stream_qp_down(s, ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ? -ENODEV
									: -ECONNRESET);
		break;
	default:
		break;
	}
}

void sv_stream_cm_forget(struct sv_stream *s)
{
	sv_upgrade_lock();
	if (s->id)
		s->id->context = NULL;
	destroy_qp(s);
	if (s->id) {
		sv_upgrade_destroy_id(s->id);
		s->id = NULL;
	}
	sv_upgrade_unlock();
}

static void disconnect_job(void *arg, int rdma_err)
{
	(void)rdma_err;
	struct sv_stream *s = arg;
	sv_upgrade_lock();
	int r = s->id ? sv_cm->disconnect(s->id) : 0;
	int err = errno;
	sv_upgrade_unlock();
	if (r < 0 && err == EACCES && !sv_helper_creds_stale() &&
	    sv_helper_defer(disconnect_job, s) == 0)
		return; /* again once the helper followed (destroy_job) */
	sv_stream_put(s);
}

void sv_stream_cm_disconnect(struct sv_stream *s)
{
	if (s->id) {
		if (sv_helper_may_call_cm()) {
			sv_cm->disconnect(s->id);
		} else {
			sv_stream_get(s);
			if (sv_helper_defer(disconnect_job, s) < 0)
				sv_stream_put(s); /* no helper: no id either */
		}
	}
	if (s->qp)
		s->qp->ops->to_error(s->qp);
}

void sv_stream_cm_init(void)
{
	static const struct sv_upgrade_conns conns = {
		.get = sv_stream_get,
		.put = sv_stream_put,
		.event = stream_event,
		.take_request = sv_stream_cm_accept,
		.waiting = sv_stream_cm_waiting,
		.holding = sv_stream_cm_holding,
	};
	sv_upgrade_serve_conns(&conns);
}

