/* The stream's life: creation, references, the start of its upgrade, the
 * list of live streams (for exit and fork). The data paths are in
 * stream_rx.c and stream_tx.c, waiting in stream_wait.c, the QP's side in
 * stream_qp.c, the switch in stream_switch.c, closing in stream_close.c. */
#include "stream_int.h"

#include "hub.h"

#include "cm.h"
#include "cmdata.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "pinned.h"
#include "ownfd.h"
#include "real.h"
#include "upgrade.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

atomic_bool sv_stream_exit_begun;
const struct sv_stream_copies *sv_copies;

/* Every live stream, for the exit flush and the fork child. */
static struct sv_lock all_lock = SV_LOCK_INIT(SV_RANK_STREAMS);
static struct sv_stream *all_streams;

static void all_add(struct sv_stream *s)
{
	sv_lock(&all_lock);
	s->all.next = all_streams;
	all_streams = s;
	sv_unlock(&all_lock);
}

static void all_remove(struct sv_stream *s)
{
	sv_lock(&all_lock);
	for (struct sv_stream **pp = &all_streams; *pp; pp = &(*pp)->all.next) {
		if (*pp == s) {
			*pp = s->all.next;
			break;
		}
	}
	sv_unlock(&all_lock);
}

static bool tcp_flag(int fd, int name)
{
	int v = 0;
	socklen_t l = sizeof(v);
	return SV_REAL(getsockopt)(fd, IPPROTO_TCP, name, &v, &l) == 0 && v != 0;
}

static void load_tuple(struct sv_stream *s)
{
	socklen_t l = sizeof(s->tuple.local);
	getsockname(s->fd, (struct sockaddr *)&s->tuple.local, &l);
	l = sizeof(s->tuple.peer);
	getpeername(s->fd, (struct sockaddr *)&s->tuple.peer, &l);
}

struct sv_stream *sv_stream_new(int fd, bool is_client)
{
	struct sv_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	sv_lock_init(&s->lock, SV_RANK_STREAM);
	atomic_init(&s->refs, 1);
	s->fd = fd;
	s->opens = 1;
	s->is_client = is_client;
	s->state = SV_CONN_TCP;
	sv_stream_load_timeouts(s); /* set before the connect, or the listener's */
	load_tuple(s);
	s->st.born_us = sv_now_us();
	/* TCP_NODELAY and TCP_CORK set before the connect, or on the listener
	 * (accepted sockets inherit them), are the kernel socket's. */
	s->opt.nodelay = !sv_cfg.coalesce || tcp_flag(fd, TCP_NODELAY);
	s->opt.cork = tcp_flag(fd, TCP_CORK);
	if (sv_copies)
		s->share = sv_copies->born(s);
	all_add(s);
	return s;
}

void sv_stream_get(struct sv_stream *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

bool sv_stream_try_get(struct sv_stream *s)
{
	int refs = atomic_load(&s->refs);
	while (refs > 0 && !atomic_compare_exchange_weak(&s->refs, &refs, refs + 1))
		;
	return refs > 0;
}

void sv_stream_put(struct sv_stream *s)
{
	if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	all_remove(s);
	if (s->share)
		sv_copies->died(s, s->share);
	sv_kcalls_forget(&s->kc); /* the successor it passed calls on to */
	sv_stream_cm_forget(s); /* the QP before the core whose buffers it used */
	sv_proto_free(s->proto);
	if (s->fd_private && s->fd >= 0)
		sv_ownfd_close(s->fd); /* e.g. after the way back, the last copy gone */
	free(s->tcpbuf.buf);
	sv_lock_destroy(&s->lock);
	free(s);
}

void sv_stream_app_uses(struct sv_stream *s)
{
	if (atomic_load_explicit(&s->app_used, memory_order_relaxed) ||
	    atomic_exchange(&s->app_used, true) || s->is_client)
		return;
	sv_lock(&s->lock);
	bool waiting = s->state == SV_CONN_TCP;
	sv_unlock(&s->lock);
	if (waiting)
		sv_helper_watch(s); /* a request that waited for this use is matched now */
}

bool sv_stream_app_used(const struct sv_stream *s)
{
	return atomic_load_explicit(&((struct sv_stream *)s)->app_used, memory_order_relaxed);
}

struct sv_hub_node *sv_stream_hub_node(struct sv_stream *s)
{
	return &s->wt.node;
}

static struct sv_watch **watch_slot(struct sv_stream *s)
{
	return &s->watch;
}

void sv_stream_init(void)
{
	static const struct sv_helper_hooks hooks = {
		.get = sv_stream_get,
		.put = sv_stream_put,
		.node = sv_stream_hub_node,
		.service = sv_stream_service,
		.watch_slot = watch_slot,
		.view_all = sv_stream_view_all,
	};
	sv_upgrade_init();
	sv_stream_cm_init();
	sv_helper_serve_streams(&hooks);
}

/* ---- The start of the upgrade -------------------------------------------------- */

/* RDMA cannot be had in this process: the reason a stream stays on TCP. */
static _Atomic(const char *) upgrades_off;

void sv_stream_upgrades_off(const char *call)
{
	atomic_store(&upgrades_off, call);
}

static bool no_rdma(struct sv_stream *s)
{
	const char *off = atomic_load(&upgrades_off);
	if (off) {
		sv_lock(&s->lock);
		sv_stream_unserved(s, off);
		sv_unlock(&s->lock);
		return true;
	}
	if (sv_helper_start() == 0 && sv_helper_rdma_state() >= 0)
		return false;
	sv_lock(&s->lock);
	sv_stream_fall_back(s, sv_helper_creds_stale() ? SV_FB_CREDENTIALS : SV_FB_DISABLED);
	sv_unlock(&s->lock);
	return true;
}

/* With SOVIA_PRIVILEGED_PORTS, a server port of 1024 or above stays on
 * TCP: anyone on the server's host may listen there with rdma_cm (its port
 * space is not TCP's) before the server's libsovia, answer for the server
 * and be handed the client's echo, 8 bytes the client then writes into the
 * real server's stream. Below 1024 rdma_cm asks for CAP_NET_BIND_SERVICE. */
static bool port_unprivileged(struct sv_stream *s, const struct sockaddr *peer)
{
	if (!sv_cfg.privileged_ports)
		return false;
	in_port_t port = 0;
	if (peer->sa_family == AF_INET)
		port = ntohs(((const struct sockaddr_in *)(const void *)peer)->sin_port);
	else if (peer->sa_family == AF_INET6)
		port = ntohs(((const struct sockaddr_in6 *)(const void *)peer)->sin6_port);
	if (port && port < 1024)
		return false;
	sv_lock(&s->lock);
	sv_stream_fall_back(s, SV_FB_UNPRIVILEGED);
	sv_unlock(&s->lock);
	return true;
}

void sv_stream_start_client(struct sv_stream *s)
{
	if (port_unprivileged(s, (const struct sockaddr *)&s->tuple.peer) || no_rdma(s))
		return;
	/* A peer known to speak libsovia gets its upgrade at once: the first
	 * writes wait for it. */
	sv_lock(&s->lock);
	bool hold = sv_stream_hold_first(s), now = hold || !sv_cfg.upgrade_delay_ms;
	sv_unlock(&s->lock);
	if (hold)
		sv_helper_watch(s); /* the hold ends in time even while rdma_cm starts */
	if (now) {
		sv_stream_cm_connect_now(s);
		return;
	}
	/* A connection closed sooner never pays for RDMA (the QP, its
	 * registered buffers, rdma_cm's round trips): the helper starts the
	 * upgrade when the delay is over (sv_stream_service). */
	sv_lock(&s->lock);
	s->up.upgrade_at = sv_now_us() + (uint64_t)sv_cfg.upgrade_delay_ms * 1000u;
	sv_unlock(&s->lock);
	sv_dbg("fd %d connected: its upgrade starts in %u ms", s->fd, sv_cfg.upgrade_delay_ms);
	sv_helper_watch(s);
}

void sv_stream_start_revived(struct sv_stream *s, struct sv_listener *l)
{
	if (!s->is_client && !l) {
		/* Handed on by the parent that accepted it: our own listener,
		 * to which the parent's redirects the client's request. */
		if (!no_rdma(s))
			sv_stream_cm_adopted(s);
		return;
	}
	if (!s->is_client) {
		sv_stream_start_server(s, l);
		return;
	}
	if (port_unprivileged(s, (const struct sockaddr *)&s->tuple.peer) || no_rdma(s))
		return;
	/* The helper starts it once the predecessor's calls are over (the
	 * copies' may_upgrade, src/share/redo.c). */
	sv_lock(&s->lock);
	s->up.upgrade_at = sv_now_us();
	sv_unlock(&s->lock);
	sv_helper_watch(s);
}

void sv_stream_start_connecting(struct sv_stream *s, const struct sockaddr *to, socklen_t len)
{
	if (port_unprivileged(s, to) || no_rdma(s))
		return;
	sv_lock(&s->lock);
	s->up.connect_pending = true;
	/* The kernel names the peer once connected; the address asked for
	 * tells meanwhile whether its first writes wait for RDMA. */
	if (len <= sizeof(s->tuple.peer) && s->tuple.peer.ss_family == AF_UNSPEC)
		memcpy(&s->tuple.peer, to, len);
	sv_stream_hold_first(s);
	sv_unlock(&s->lock);
	sv_helper_watch(s); /* it schedules the upgrade once the connect is done */
}

void sv_stream_start_server(struct sv_stream *s, struct sv_listener *l)
{
	if (no_rdma(s))
		return;
	sv_lock(&s->lock);
	bool hold = sv_stream_hold_first(s);
	sv_unlock(&s->lock);
	if (hold)
		sv_helper_watch(s); /* it ends the hold in time if no request comes */
	sv_stream_cm_accepted(s, l);
}

bool sv_stream_start_pending(const struct sv_stream *s)
{
	return atomic_load_explicit(&((struct sv_stream *)s)->start_pending, memory_order_relaxed);
}

bool sv_stream_take_start(struct sv_stream *s)
{
	return atomic_exchange(&s->start_pending, false);
}

void sv_stream_start_at_use(struct sv_stream *s)
{
	atomic_store(&s->start_pending, true);
}

void sv_stream_start_handed(struct sv_stream *s)
{
	if (no_rdma(s))
		return;
	sv_dbg("fd %d: handed to us by the parent at %llu bytes out, %llu in: its upgrade "
	       "waits until we hold it alone", s->fd, (unsigned long long)s->tcp_tx,
	       (unsigned long long)s->tcp_rx);
	sv_stream_cm_adopted(s);
}

/* ---- For the copies (src/share) --------------------------------------------------- */

void sv_stream_serve_copies(const struct sv_stream_copies *copies)
{
	sv_copies = copies;
}

void *sv_stream_copies_state(struct sv_stream *s)
{
	return s->share;
}

int sv_stream_fd(const struct sv_stream *s)
{
	return s->fd;
}

struct sv_kcalls *sv_stream_kcalls(struct sv_stream *s)
{
	return &s->kc;
}

void sv_stream_lock(struct sv_stream *s)
{
	sv_lock(&s->lock);
}

void sv_stream_unlock(struct sv_stream *s)
{
	sv_unlock(&s->lock);
}

void sv_stream_facts(struct sv_stream *s, struct sv_stream_facts *f)
{
	sv_lock_assert_held(&s->lock);
	enum sv_tx_state tx = s->proto ? sv_proto_tx_state(s->proto) : SV_TX_TCP;
	*f = (struct sv_stream_facts){
		.state = s->state,
		.fallback = s->fallback,
		.fd = s->fd,
		.error = s->error,
		.opens = s->opens,
		.is_client = s->is_client,
		.fd_private = s->fd_private,
		.app_closed = s->cl.app_closed,
		.tx_shut = s->cl.tx_shut,
		.escaped = s->escaped,
		.read_ahead = sv_stream_tcpbuf_held(s),
		.has_id = s->id != NULL,
		.has_core = s->proto != NULL,
		.room_wait = s->up.room_wait != 0,
		.switch_seen = s->sw.echo_sent || s->sw.chal_len,
		.switch_pending = s->sw.tx_held || s->sw.echo_owed,
		.core_back_ready = s->proto && sv_proto_back_ready(s->proto),
		.off_qp = s->proto && (tx == SV_TX_TCP || tx == SV_TX_RESET) &&
			  !sv_proto_rx_on_qp(s->proto),
		.holders = s->holders,
		.local = s->tuple.local,
		.peer = s->tuple.peer,
		.tcp_tx = s->tcp_tx,
		.tcp_rx = s->tcp_rx,
	};
}

void sv_stream_want_back(struct sv_stream *s, bool on)
{
	s->back_wanted = on;
}

void sv_stream_escape(struct sv_stream *s)
{
	s->escaped = true;
}

void sv_stream_announce_end(struct sv_stream *s)
{
	sv_stream_resume_announce(s);
}

void sv_stream_back_points(struct sv_stream *s, uint64_t *tx, uint64_t *rx)
{
	sv_proto_back_points(s->proto, tx, rx);
}

void sv_stream_set_offsets(struct sv_stream *s, uint64_t tx, uint64_t rx)
{
	s->tcp_tx = tx;
	s->tcp_rx = rx;
}

void sv_stream_set_holders(struct sv_stream *s, struct sv_holders *h)
{
	s->holders = h;
}

void sv_stream_mark_revived(struct sv_stream *s)
{
	s->revived = true;
}

void sv_stream_mark_used(struct sv_stream *s)
{
	atomic_store(&s->app_used, true);
}

struct sv_stream *sv_stream_find(const struct sockaddr_storage *local,
				 const struct sockaddr_storage *peer,
				 bool (*pick)(struct sv_stream *s))
{
	struct sv_stream *found = NULL, *other = NULL;
	sv_lock(&all_lock);
	for (struct sv_stream *s = all_streams; s && !found; s = s->all.next) {
		if (s->is_client || !sv_addr_equal(&s->tuple.local, local) ||
		    !sv_addr_equal(&s->tuple.peer, peer))
			continue;
		if (pick(s))
			found = sv_stream_try_get(s) ? s : NULL;
		else if (!other && sv_stream_try_get(s))
			other = s;
	}
	sv_unlock(&all_lock);
	if (found && other)
		sv_stream_put(other);
	return found ? found : other;
}

/* ---- The views (sovia-stat, include/sovia.h) ----------------------------------- */

void sv_stream_view_all(void (*fn)(const struct sv_conn_view *v, void *arg), void *arg)
{
	/* References taken under the list's lock, the views made without it:
	 * a stream's lock ranks below the list's. */
	size_t n = 0, cap = 0;
	struct sv_stream **all = NULL;
	sv_lock(&all_lock);
	for (struct sv_stream *s = all_streams; s; s = s->all.next)
		cap++;
	all = cap ? malloc(cap * sizeof(*all)) : NULL;
	for (struct sv_stream *s = all_streams; all && s; s = s->all.next)
		if (sv_stream_try_get(s))
			all[n++] = s;
	sv_unlock(&all_lock);
	for (size_t i = 0; i < n; i++) {
		struct sv_conn_view v;
		sv_stream_view(all[i], &v);
		if (!v.closing)
			fn(&v, arg);
		sv_stream_put(all[i]);
	}
	free(all);
}

/* ---- Process events ---------------------------------------------------------- */

void sv_stream_atfork_child(void)
{
	sv_hub_atfork_child();
	sv_helper_atfork_child();
	sv_upgrade_atfork_child();
	sv_pinned_atfork_child();
	if (sv_cm->atfork_child)
		sv_cm->atfork_child();
	sv_lock_reinit(&all_lock);
	/* The parent's private copies of its sockets would keep its
	 * connections open as long as this child lives. */
	for (struct sv_stream *s = all_streams; s; s = s->all.next)
		if (s->fd_private && s->fd >= 0)
			sv_ownfd_close(s->fd);
	all_streams = NULL; /* never flushed nor freed here */
}

void sv_stream_exit_flush_all(void)
{
	atomic_store(&sv_stream_exit_begun, true);
	/* Streams stay alive: the exit path only holds the list lock while it
	 * takes references to a batch, then flushes each without it, batch
	 * after batch until every stream was taken once. No allocation: _exit
	 * may run in a vfork child. */
	for (;;) {
		struct sv_stream *batch[64];
		size_t n = 0, seen = 0;
		sv_lock(&all_lock);
		for (struct sv_stream *s = all_streams; s && n < 64; s = s->all.next) {
			if (s->all.exit_listed)
				continue;
			s->all.exit_listed = true;
			seen++;
			/* A stream whose last reference is being dropped right
			 * now (it is still listed until its release takes this
			 * lock) must not be revived. */
			if (sv_stream_try_get(s))
				batch[n++] = s;
		}
		sv_unlock(&all_lock);
		if (!seen)
			return;
		for (size_t i = 0; i < n; i++) {
			sv_stream_exit_flush(batch[i]);
			sv_stream_put(batch[i]);
		}
	}
}
