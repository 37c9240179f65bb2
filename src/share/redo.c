/* A second life: a connection that went back to plain TCP (BACK/RETURN,
 * the stream's way back) moves to RDMA again once one process holds it
 * alone: a fork's child used its copy and is gone (keep.c), or the peer
 * asks again (a server's request for a connection that is back on TCP
 * here).
 *
 * The stream that went back stays as it is; a new stream, its successor,
 * takes the application's fd and upgrades as any other, from the offsets
 * where the connection stands: where each direction went on TCP at our
 * BACK, plus every byte the kernel's socket carried since (its counts,
 * sv_tcp_app_counts, taken at the BACK and now), whichever process moved
 * them. Those are taken only once no call of the predecessor is under way
 * (a call that began before the successor read the kernel's socket past
 * us, and could take a switch's echo for data). */
#include "share_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"

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

void sv_share_set_revive(sv_revive_fn fn)
{
	atomic_store(&revive_fn, fn);
}

void sv_redo_snapshot(struct sv_stream *s, struct sv_share *c, bool peer_first)
{
	uint64_t tx, rx;
	c->redo.ok = sv_tcp_app_counts(sv_stream_fd(s), &tx, &rx) == 0;
	c->redo.peer_first = peer_first;
	c->redo.ktx = tx;
	c->redo.krx = rx;
}

void sv_redo_detached(struct sv_stream *s, struct sv_share *c)
{
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	if (!c->redo.ok || !f.has_core)
		return;
	sv_stream_back_points(s, &c->redo.tx, &c->redo.rx);
	/* One fd of the application's, which the successor takes over. */
	if (f.opens == 1 && !f.fd_private && !f.app_closed && !f.tx_shut && !f.escaped)
		sv_share_set_life(c, SV_LIFE_PARKED);
	/* The server went back: its end may move to RDMA again once its
	 * process holds it alone (or its child, handed it), and it tells
	 * us when we ask (SV_CM_REJ_LATER until then). */
	struct ask *a = sv_cfg.ask_again && f.is_client && c->redo.peer_first &&
				sv_share_life(c) == SV_LIFE_PARKED
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

void sv_share_unpark(struct sv_stream *s)
{
	struct sv_share *c = sv_share_of(s);
	sv_stream_lock(s);
	if (c && sv_share_life(c) == SV_LIFE_PARKED)
		sv_share_set_life(c, SV_LIFE_NONE);
	sv_stream_escape(s);
	sv_stream_unlock(s);
}

/* May s have a successor? With the lock. */
static bool revivable(const struct sv_share *c, const struct sv_stream_facts *f)
{
	/* Not while a fork's child may use it too (keep.c), nor while a fork
	 * that gives one a copy is under way (the child's claim can be
	 * answered before the parent's fork() returns and shares it). A
	 * client a fork took back is shared with the child at once (before
	 * that, an ask of ours is dropped: alone_again asks once it is
	 * alone, keep.c). */
	return sv_share_life(c) == SV_LIFE_PARKED && (!c->keep.shared || c->keep.alone) &&
	       !c->keep.forking && (!c->fork_back || c->keep.shared) && !c->keep.letting_go &&
	       !c->keep.handed.t && f->state == SV_CONN_DETACHED && c->redo.ok && !f->error &&
	       !f->app_closed && !f->tx_shut && f->opens == 1 && !f->fd_private && f->fd >= 0;
}

struct sv_stream *sv_share_successor(struct sv_stream *s, void *entry, bool (*idle)(void *),
				     void (*put)(void *))
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return NULL;
	struct sv_stream_facts f;
	sv_stream_lock(s);
	sv_stream_facts(s, &f);
	sv_stream_unlock(s);
	struct reap *node = malloc(sizeof(*node));
	struct sv_stream *n = node ? sv_stream_new(f.fd, f.is_client) : NULL;
	struct sv_share *nc = n ? sv_share_of(n) : NULL;
	if (!nc) {
		free(node);
		sv_stream_put(n);
		return NULL;
	}
	sv_stream_lock(s);
	sv_stream_facts(s, &f);
	bool ok = revivable(c, &f);
	if (ok) {
		sv_share_set_life(c, SV_LIFE_SUCCEEDED); /* one successor */
		nc->redo = c->redo;
		sv_stream_get(s);
		nc->pred = (struct sv_pred){.s = s, .entry = entry, .idle = idle, .put = put,
					    .kc = sv_stream_kcalls(s), .node = node,
					    .pending = true};
	}
	sv_stream_unlock(s);
	if (!ok) {
		free(node);
		sv_stream_put(n);
		return NULL;
	}
	sv_stream_mark_revived(n);
	sv_stream_mark_used(n); /* the predecessor was used */
	return n;
}

void sv_share_successor_took(struct sv_stream *s, struct sv_stream *n)
{
	sv_kcalls_took(sv_stream_kcalls(s), n);
}

struct sv_stream *sv_share_adopted(int fd, const struct sv_share_redo *redo, void *entry,
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
	struct sv_share *nc = n ? sv_share_of(n) : NULL;
	if (!nc) {
		free(node);
		sv_stream_put(n);
		return NULL;
	}
	if (h) {
		sv_stream_set_holders(n, h);
		sv_holders_mark_forked(h);
	}
	nc->redo = (struct sv_redo){.ok = true, .tx = redo->tx, .rx = redo->rx,
				    .ktx = redo->ktx, .krx = redo->krx};
	nc->pred = (struct sv_pred){.entry = entry, .idle = idle, .put = put, .kc = kc,
				    .node = node, .pending = true};
	sv_stream_mark_revived(n);
	sv_stream_mark_used(n);
	return n;
}

static void reap_later(struct sv_share *c)
{
	struct reap *r = c->pred.node;
	*r = (struct reap){.s = c->pred.s, .entry = c->pred.entry, .put = c->pred.put};
	c->pred = (struct sv_pred){0};
	r->next = atomic_load(&to_reap);
	while (!atomic_compare_exchange_weak(&to_reap, &r->next, r))
		;
}

bool sv_redo_ready(struct sv_stream *s, struct sv_share *c)
{
	if (!c->pred.pending)
		return true;
	if (c->pred.kc && atomic_load(&c->pred.kc->n))
		return false;
	c->pred.pending = false;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	uint64_t ktx, krx;
	int r = sv_tcp_app_counts(f.fd, &ktx, &krx);
	if (r < 0) {
		sv_info("fd %d: the kernel's counts of a connection back on TCP cannot be read "
			"(%d): it stays on TCP", f.fd, r);
		sv_stream_fall_back(s, SV_FB_SHUTDOWN);
		return false;
	}
	/* What our reads took from the kernel's socket ahead of the
	 * application is not the application's yet. */
	uint64_t tx = c->redo.tx + (ktx - c->redo.ktx);
	uint64_t rx = c->redo.rx + (krx - c->redo.krx) - f.read_ahead;
	sv_stream_set_offsets(s, tx, rx);
	sv_dbg("fd %d: back on TCP at %llu bytes out, %llu in: it may move to RDMA again", f.fd,
	       (unsigned long long)tx, (unsigned long long)rx);
	return true;
}

bool sv_redo_pred_busy(const struct sv_share *c)
{
	return c->pred.entry && !c->pred.idle(c->pred.entry);
}

void sv_redo_pred_done(struct sv_share *c)
{
	if (c->pred.node)
		reap_later(c);
}

void sv_redo_atfork_child(void)
{
	/* The parent's predecessors and asks are the parent's. */
	atomic_store(&to_reap, NULL);
	atomic_store(&to_ask, NULL);
}

void sv_redo_reap(void)
{
	struct ask *a = atomic_exchange(&to_ask, NULL);
	while (a) {
		struct ask *next = a->next;
		if (sv_share_revive(a->s, NULL) == 1)
			sv_info("fd %d: the server took it back to TCP: asking it to move to RDMA "
				"again", sv_stream_fd(a->s));
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

void sv_redo_pred_forget(struct sv_share *c)
{
	if (c->pred.entry)
		c->pred.put(c->pred.entry);
	if (c->pred.s)
		sv_stream_put(c->pred.s);
	free(c->pred.node);
}

int sv_share_revive(struct sv_stream *s, struct sv_listener *l)
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return -1;
	sv_revive_fn fn = atomic_load(&revive_fn);
	sv_stream_lock(s);
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	bool ok = revivable(c, &f);
	/* A fork's child still holds it (its owner looks again soon, or
	 * shares it once the fork is over), or it is on its way back (the
	 * client's request beat our detached). */
	bool later = !ok &&
		     ((((c->keep.shared && !c->keep.alone) || c->keep.forking) &&
		       sv_share_life(c) == SV_LIFE_PARKED) ||
		      (f.state == SV_CONN_DETACHING && !f.error && !f.app_closed && !f.escaped) ||
		      (c->keep.handed.t && sv_shares_handed(&c->keep.handed)));
	sv_stream_unlock(s);
	if (later)
		return 0;
	return fn && ok && fn(s, f.fd, l) ? 1 : -1;
}

/* One that may revive first: back on TCP here, or on its way. */
static bool parked_or_going(struct sv_stream *s)
{
	struct sv_share *c = sv_share_of(s);
	enum sv_life life = c ? sv_share_life(c) : SV_LIFE_NONE;
	return life == SV_LIFE_PARKED || life == SV_LIFE_GOING;
}

int sv_redo_revive_parked(const struct sockaddr_storage *local,
			  const struct sockaddr_storage *peer, struct sv_listener *l)
{
	/* One that may revive first; else any (a predecessor, one that went
	 * back for good), which is then refused. */
	struct sv_stream *s = sv_stream_find(local, peer, parked_or_going);
	if (!s)
		return -1;
	int r = sv_share_revive(s, l);
	struct sv_share *c = sv_share_of(s);
	if (r < 0 && c) {
		/* Neither revivable nor "later": back on TCP for good, unless
		 * a fork's child may have it (handed: its entry in the
		 * holders' table, which the pending request looks at, says
		 * where once the child holds it alone). */
		sv_stream_lock(s);
		struct sv_stream_facts f;
		sv_stream_facts(s, &f);
		if ((f.state == SV_CONN_DETACHED || f.state == SV_CONN_DETACHING) &&
		    !c->keep.handed.t && !c->fork_back && !f.app_closed)
			r = -2;
		sv_stream_unlock(s);
	}
	sv_stream_put(s);
	return r;
}
