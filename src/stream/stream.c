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

/* Every live stream, for the exit flush and the fork child. */
static struct sv_lock all_lock = SV_LOCK_INIT(SV_RANK_STREAMS);
static struct sv_stream *all_streams;

static void all_add(struct sv_stream *s)
{
	sv_lock(&all_lock);
	s->next_all = all_streams;
	all_streams = s;
	sv_unlock(&all_lock);
}

static void all_remove(struct sv_stream *s)
{
	sv_lock(&all_lock);
	for (struct sv_stream **pp = &all_streams; *pp; pp = &(*pp)->next_all) {
		if (*pp == s) {
			*pp = s->next_all;
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
	sv_stream_pred_forget(s);
	sv_stream_keep_forget(s);
	if (s->adopted)
		sv_holders_drop(&s->hand); /* if still there */
	sv_stream_cm_forget(s); /* the QP before the core whose buffers it used */
	sv_proto_free(s->proto);
	if (s->fd_private && s->fd >= 0)
		sv_ownfd_close(s->fd); /* e.g. after the way back, the last copy gone */
	free(s->tcpbuf);
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
static atomic_bool upgrades_off;

void sv_stream_upgrades_off(void)
{
	atomic_store(&upgrades_off, true);
}

static bool no_rdma(struct sv_stream *s)
{
	if (atomic_load(&upgrades_off)) {
		sv_lock(&s->lock);
		sv_stream_fall_back(s, SV_FB_UNSUPPORTED);
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
	s->sw.upgrade_at = sv_now_us() + (uint64_t)sv_cfg.upgrade_delay_ms * 1000u;
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
	/* The helper starts it once the predecessor's calls are over
	 * (sv_stream_redo_ready). */
	sv_lock(&s->lock);
	s->sw.upgrade_at = sv_now_us();
	sv_unlock(&s->lock);
	sv_helper_watch(s);
}

void sv_stream_start_connecting(struct sv_stream *s, const struct sockaddr *to, socklen_t len)
{
	if (port_unprivileged(s, to) || no_rdma(s))
		return;
	sv_lock(&s->lock);
	s->sw.connect_pending = true;
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

struct sv_stream *sv_stream_adopt(int fd, const struct sv_hand *hand, uint64_t tx, uint64_t rx)
{
	struct sv_stream *s = sv_stream_new(fd, false);
	if (!s)
		return NULL;
	s->tcp_tx = tx;
	s->tcp_rx = rx;
	s->hand = *hand;
	s->holders = hand->h;
	s->adopted = true;
	atomic_store(&s->adopt_pending, true);
	return s;
}

bool sv_stream_adopt_pending(const struct sv_stream *s)
{
	return atomic_load_explicit(&((struct sv_stream *)s)->adopt_pending, memory_order_relaxed);
}

void sv_stream_start_at_use(struct sv_stream *s)
{
	atomic_store(&s->adopt_pending, true);
}

void sv_stream_start_adopted(struct sv_stream *s)
{
	if (!atomic_exchange(&s->adopt_pending, false))
		return;
	if (s->is_client) {
		sv_stream_start_revived(s, NULL); /* continued after an exec */
		return;
	}
	sv_lock(&s->lock);
	bool exposed = s->std_exposed;
	if (exposed) {
		/* stdio may have moved bytes our counts miss: no upgrade here,
		 * and the owner redirects nobody to us. */
		sv_holders_drop(&s->hand);
		sv_stream_fall_back(s, SV_FB_UNSUPPORTED);
	}
	sv_unlock(&s->lock);
	if (exposed) {
		sv_info("fd %d: used on stdin, stdout or stderr before an exec: it stays on TCP",
			s->fd);
		return;
	}
	if (no_rdma(s))
		return;
	sv_dbg("fd %d: handed to us by the parent at %llu bytes out, %llu in: its upgrade "
	       "waits until we hold it alone", s->fd, (unsigned long long)s->tcp_tx,
	       (unsigned long long)s->tcp_rx);
	sv_stream_cm_adopted(s);
}

/* Handed to us and untouched: no upgrade began, nothing of ours is in the
 * connection, and the holders' table still has it as ours. With the lock. */
static bool untouched_hand(struct sv_stream *s)
{
	return s->adopted && s->hand.h && atomic_load(&s->adopt_pending) &&
	       s->state == SV_CONN_TCP && !s->id && !s->proto && !sv_stream_tcpbuf_held(s) &&
	       !s->sw.room_wait && !s->cl.tx_shut && !s->cl.app_closed &&
	       sv_holders_check(&s->hand, &s->tuple.local, &s->tuple.peer);
}

bool sv_stream_expose_std(struct sv_stream *s)
{
	sv_lock(&s->lock);
	bool ok = untouched_hand(s);
	if (ok)
		s->std_exposed = true;
	sv_unlock(&s->lock);
	return ok;
}

bool sv_stream_exec_hand(struct sv_stream *s, struct sv_hand *hand)
{
	sv_lock(&s->lock);
	bool ok = untouched_hand(s);
	if (ok)
		*hand = s->hand;
	sv_unlock(&s->lock);
	return ok;
}

bool sv_stream_exec_client(struct sv_stream *s, uint64_t *dtx, uint64_t *drx)
{
	uint64_t ktx, krx;
	sv_lock(&s->lock);
	/* No process but this one holds it (not a fork's child's copy, kept
	 * or handed on), nothing read ahead. */
	bool ok = s->is_client && !s->error && !s->cl.tx_shut && !s->cl.app_closed &&
		  !s->keep.ref.t && !s->keep.letting_go && !sv_stream_tcpbuf_held(s) &&
		  sv_tcp_app_counts(s->fd, &ktx, &krx) == 0;
	if (ok && s->state == SV_CONN_DETACHED && s->redo.ok) {
		/* Back from RDMA: as a successor counts (stream_redo.c). */
		*dtx = s->redo.tx - s->redo.ktx;
		*drx = s->redo.rx - s->redo.krx;
	} else if (ok && s->state == SV_CONN_FALLBACK && s->fallback == SV_FB_UNSUPPORTED &&
		   !s->pred.pending && !s->sw.echo_sent && !s->sw.chal_len) {
		/* Never switched, its upgrade called off by this exec (any
		 * other fallback is for good: its fd is the kernel's, or its
		 * peer said no): nothing of ours went on TCP, so the kernel's
		 * counts are the offsets, past where a second life's began,
		 * less our SYN, which a client's counts as acknowledged (a
		 * successor's difference has it already). */
		*dtx = s->redo.ok ? s->redo.tx - s->redo.ktx : (uint64_t)-1;
		*drx = s->redo.ok ? s->redo.rx - s->redo.krx : 0;
	} else {
		ok = false;
	}
	sv_unlock(&s->lock);
	return ok;
}

struct sv_stream *sv_stream_find_parked(const struct sockaddr_storage *local,
					const struct sockaddr_storage *peer)
{
	/* One that may revive first; else any (a predecessor, one that went
	 * back for good), which sv_stream_revive_parked then refuses. */
	struct sv_stream *found = NULL, *other = NULL;
	sv_lock(&all_lock);
	for (struct sv_stream *s = all_streams; s && !found; s = s->next_all) {
		if (s->is_client || !sv_addr_equal(&s->tuple.local, local) ||
		    !sv_addr_equal(&s->tuple.peer, peer))
			continue;
		if (atomic_load(&s->parked) || atomic_load(&s->going_back))
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
	for (struct sv_stream *s = all_streams; s; s = s->next_all)
		cap++;
	all = cap ? malloc(cap * sizeof(*all)) : NULL;
	for (struct sv_stream *s = all_streams; all && s; s = s->next_all)
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
	sv_stream_keep_atfork_child();
	sv_stream_redo_atfork_child();
	if (sv_cm->atfork_child)
		sv_cm->atfork_child();
	sv_lock_reinit(&all_lock);
	/* The parent's private copies of its sockets would keep its
	 * connections open as long as this child lives. */
	for (struct sv_stream *s = all_streams; s; s = s->next_all)
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
		for (struct sv_stream *s = all_streams; s && n < 64; s = s->next_all) {
			if (s->exit_listed)
				continue;
			s->exit_listed = true;
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
