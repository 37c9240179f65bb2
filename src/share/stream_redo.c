/* A second life: a connection that went back to plain TCP (BACK/RETURN,
 * stream_back.c) moves to RDMA again once one process holds it alone: a
 * fork's child used its copy and is gone (stream_keep.c), or the peer asks
 * again (a server's request for a connection that is back on TCP here).
 *
 * The stream that went back stays as it is; a new stream, its successor,
 * takes the application's fd and upgrades as any other, from the offsets
 * where the connection stands: where each direction went on TCP at our
 * BACK, plus every byte the kernel's socket carried since (its counts,
 * sv_tcp_app_counts, taken at the BACK and now), whichever process moved
 * them. Those are taken only once no call of the predecessor is under way
 * (a call that began before the successor read the kernel's socket past
 * us, and could take a switch's echo for data). */
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "shares.h"

#include <stdlib.h>

static _Atomic(sv_revive_fn) revive_fn;

/* Predecessors let go once their successor's counts are taken: by the
 * helper, holding no lock (the predecessor's release takes locks of its
 * own). */
struct reap {
	struct sv_stream *s;
	void *entry;
	void (*put)(void *entry);
	struct reap *next;
};
static _Atomic(struct reap *) to_reap;

/* Client connections the peer took back to TCP, whose server end may
 * move to RDMA again: asked for by the helper, holding no lock (a
 * successor takes the fd table's). */
struct ask {
	struct sv_stream *s; /* held */
	struct ask *next;
};
static _Atomic(struct ask *) to_ask;

void sv_stream_set_revive(sv_revive_fn fn)
{
	atomic_store(&revive_fn, fn);
}

void sv_stream_redo_snapshot(struct sv_stream *s, bool peer_first)
{
	uint64_t tx, rx;
	s->redo.ok = sv_tcp_app_counts(s->fd, &tx, &rx) == 0;
	s->redo.peer_first = peer_first;
	s->redo.ktx = tx;
	s->redo.krx = rx;
}

void sv_stream_redo_detached(struct sv_stream *s)
{
	if (!s->redo.ok || !s->proto)
		return;
	sv_proto_back_points(s->proto, &s->redo.tx, &s->redo.rx);
	/* One fd of the application's, which the successor takes over. */
	if (s->opens == 1 && !s->fd_private && !s->cl.app_closed && !s->cl.tx_shut &&
	    !s->keep.escaped)
		atomic_store(&s->parked, true);
	/* The server went back: its end may move to RDMA again once its
	 * process holds it alone (or its child, handed it), and it tells
	 * us when we ask (SV_CM_REJ_LATER until then). */
	struct ask *a = sv_cfg.ask_again && s->is_client && s->redo.peer_first &&
				atomic_load(&s->parked)
				? malloc(sizeof(*a))
				: NULL;
	if (a) {
		sv_stream_get(s);
		a->s = s;
		a->next = atomic_load(&to_ask);
		while (!atomic_compare_exchange_weak(&to_ask, &a->next, a))
			;
		sv_helper_watch(s); /* its next round asks */
	}
}

void sv_stream_unpark(struct sv_stream *s)
{
	atomic_store(&s->parked, false);
	sv_lock(&s->lock);
	s->keep.escaped = true;
	sv_unlock(&s->lock);
}

/* May s have a successor? With the lock. */
static bool revivable(const struct sv_stream *s)
{
	/* Not while a fork's child may use it too (stream_keep.c), nor while
	 * a fork that gives one a copy is under way (the child's claim can
	 * be answered before the parent's fork() returns and shares it). A
	 * client a fork took back is shared with the child at once (before
	 * that, an ask of ours is dropped: alone_again asks once it is
	 * alone, stream_keep.c). */
	return atomic_load(&s->parked) && (!s->keep.shared || s->keep.alone) &&
	       !s->keep.forking && (!s->fork_back || s->keep.shared) && !s->keep.letting_go &&
	       !s->keep.handed.t && s->state == SV_CONN_DETACHED && s->redo.ok && !s->error &&
	       !s->cl.app_closed && !s->cl.tx_shut && s->opens == 1 && !s->fd_private &&
	       s->fd >= 0;
}

struct sv_stream *sv_stream_successor(struct sv_stream *s, void *entry, bool (*idle)(void *),
				      void (*put)(void *))
{
	struct reap *node = malloc(sizeof(*node));
	struct sv_stream *n = node ? sv_stream_new(s->fd, s->is_client) : NULL;
	if (!n) {
		free(node);
		return NULL;
	}
	sv_lock(&s->lock);
	bool ok = revivable(s);
	if (ok) {
		atomic_store(&s->parked, false); /* one successor */
		s->succeeded = true;
		n->redo = s->redo;
		sv_stream_get(s);
		n->pred = (struct sv_pred){.s = s, .entry = entry, .idle = idle, .put = put,
					   .kc = &s->kc, .node = node, .pending = true};
	}
	sv_unlock(&s->lock);
	if (!ok) {
		free(node);
		sv_stream_put(n);
		return NULL;
	}
	atomic_store(&n->app_used, true); /* the predecessor was used */
	return n;
}

void sv_stream_successor_took(struct sv_stream *s, struct sv_stream *n)
{
	sv_kcalls_took(&s->kc, n);
}

struct sv_stream *sv_stream_adopted(int fd, const struct sv_share_redo *redo, void *entry,
				    bool (*idle)(void *), void (*put)(void *),
				    struct sv_kcalls *kc)
{
	/* A server's end: its own RDMA listener, entered in the family's
	 * holders' table (made before the fork, the owner's), which the
	 * owner looks at from now on (sv_upgrade_adopted). */
	struct sv_holders *h = redo->server ? sv_holders_get() : NULL;
	if (redo->server && !h)
		return NULL;
	struct reap *node = malloc(sizeof(*node));
	struct sv_stream *n = node ? sv_stream_new(fd, !redo->server) : NULL;
	if (!n) {
		free(node);
		return NULL;
	}
	if (h) {
		n->holders = h;
		sv_holders_mark_forked(h);
	}
	n->redo = (struct sv_redo){.ok = true, .tx = redo->tx, .rx = redo->rx,
				   .ktx = redo->ktx, .krx = redo->krx};
	n->pred = (struct sv_pred){.entry = entry, .idle = idle, .put = put, .kc = kc,
				   .node = node, .pending = true};
	atomic_store(&n->app_used, true);
	return n;
}

struct sv_stream *sv_kcalls_enter(struct sv_kcalls *k)
{
	/* Counted first: a successor that took the fd after our look at
	 * `next` waits for us (sequentially consistent, both). */
	atomic_fetch_add(&k->n, 1);
	struct sv_stream *n = atomic_load(&k->next);
	if (!n)
		return NULL;
	sv_stream_get(n);
	sv_kcalls_leave(k);
	return n;
}

void sv_kcalls_leave(struct sv_kcalls *k)
{
	if (atomic_fetch_sub(&k->n, 1) != 1)
		return;
	/* The last: a successor that waits for it looks again. It lives as
	 * long as k, which the caller's fd entry holds. */
	struct sv_stream *n = atomic_load(&k->next);
	if (n)
		sv_helper_watch(n);
}

void sv_kcalls_took(struct sv_kcalls *k, struct sv_stream *n)
{
	sv_stream_get(n);
	sv_stream_put(atomic_exchange(&k->next, n));
}

void sv_kcalls_forget(struct sv_kcalls *k)
{
	sv_stream_put(atomic_exchange(&k->next, NULL));
}

static void reap_later(struct sv_stream *s)
{
	struct reap *r = s->pred.node;
	*r = (struct reap){.s = s->pred.s, .entry = s->pred.entry, .put = s->pred.put};
	s->pred = (struct sv_pred){0};
	r->next = atomic_load(&to_reap);
	while (!atomic_compare_exchange_weak(&to_reap, &r->next, r))
		;
}

bool sv_stream_redo_ready(struct sv_stream *s)
{
	if (!s->pred.pending)
		return true;
	if (s->pred.kc && atomic_load(&s->pred.kc->n))
		return false;
	s->pred.pending = false;
	uint64_t ktx, krx;
	int r = sv_tcp_app_counts(s->fd, &ktx, &krx);
	if (r < 0) {
		sv_info("fd %d: the kernel's counts of a connection back on TCP cannot be read "
			"(%d): it stays on TCP", s->fd, r);
		sv_stream_fall_back(s, SV_FB_SHUTDOWN);
		return false;
	}
	/* What our reads took from the kernel's socket ahead of the
	 * application is not the application's yet. */
	s->tcp_tx = s->redo.tx + (ktx - s->redo.ktx);
	s->tcp_rx = s->redo.rx + (krx - s->redo.krx) - sv_stream_tcpbuf_held(s);
	sv_dbg("fd %d: back on TCP at %llu bytes out, %llu in: it may move to RDMA again",
	       s->fd, (unsigned long long)s->tcp_tx, (unsigned long long)s->tcp_rx);
	return true;
}

bool sv_stream_pred_busy(const struct sv_stream *s)
{
	return s->pred.entry && !s->pred.idle(s->pred.entry);
}

void sv_stream_pred_done(struct sv_stream *s)
{
	if (s->pred.node)
		reap_later(s);
}

void sv_stream_redo_atfork_child(void)
{
	/* The parent's predecessors and asks are the parent's. */
	atomic_store(&to_reap, NULL);
	atomic_store(&to_ask, NULL);
}

void sv_stream_redo_reap(void)
{
	struct ask *a = atomic_exchange(&to_ask, NULL);
	while (a) {
		struct ask *next = a->next;
		if (sv_stream_revive(a->s, NULL) == 1)
			sv_info("fd %d: the server took it back to TCP: asking it to move to RDMA "
				"again", a->s->fd);
		sv_stream_put(a->s);
		free(a);
		a = next;
	}
	struct reap *r = atomic_exchange(&to_reap, NULL);
	while (r) {
		struct reap *next = r->next;
		if (r->entry)
			r->put(r->entry);
		sv_stream_put(r->s);
		free(r);
		r = next;
	}
}

void sv_stream_pred_forget(struct sv_stream *s)
{
	if (s->pred.entry)
		s->pred.put(s->pred.entry);
	if (s->pred.s)
		sv_stream_put(s->pred.s);
	free(s->pred.node);
	sv_kcalls_forget(&s->kc);
}

int sv_stream_revive(struct sv_stream *s, struct sv_listener *l)
{
	sv_revive_fn fn = atomic_load(&revive_fn);
	sv_lock(&s->lock);
	int fd = s->fd;
	bool ok = revivable(s);
	/* A fork's child still holds it (its owner looks again soon, or
	 * shares it once the fork is over), or it is on its way back (the
	 * client's request beat our detached). */
	bool later = !ok && ((((s->keep.shared && !s->keep.alone) || s->keep.forking) &&
			      atomic_load(&s->parked)) ||
			     (s->state == SV_CONN_DETACHING && !s->error && !s->cl.app_closed &&
			      !s->keep.escaped) ||
			     (s->keep.handed.t && sv_shares_handed(&s->keep.handed)));
	sv_unlock(&s->lock);
	if (later)
		return 0;
	return fn && ok && fn(s, fd, l) ? 1 : -1;
}

int sv_stream_revive_parked(const struct sockaddr_storage *local,
			    const struct sockaddr_storage *peer, struct sv_listener *l)
{
	struct sv_stream *s = sv_stream_find_parked(local, peer);
	if (!s)
		return -1;
	int r = sv_stream_revive(s, l);
	if (r < 0) {
		/* Neither revivable nor "later": back on TCP for good, unless
		 * a fork's child may have it (handed: its entry in the
		 * holders' table, which the pending request looks at, says
		 * where once the child holds it alone). */
		sv_lock(&s->lock);
		if ((s->state == SV_CONN_DETACHED || s->state == SV_CONN_DETACHING) &&
		    !s->keep.handed.t && !s->fork_back && !s->cl.app_closed)
			r = -2;
		sv_unlock(&s->lock);
	}
	sv_stream_put(s);
	return r;
}
