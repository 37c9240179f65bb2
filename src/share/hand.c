/* A connection handed to a fork's child (accept-then-fork servers: inetd,
 * PostgreSQL, ftpd), the child's adoption of it, and an exec that hands a
 * connection on to the new image (docs/design.md, "Copies of a
 * connection"). Both processes hold it after the fork, so it stays on
 * plain TCP until the child holds it alone: the parent enters it in the
 * family's holders' table before the fork (holders.h), the child adopts it
 * and claims it with the port of its own RDMA listener, and the port's
 * owner redirects the client there once the parent released its copy. */
#include "share_int.h"

#include "log.h"

#include <unistd.h>

/* Before a fork: a server connection still waiting for its upgrade
 * request, held by one fd with nothing read ahead, is entered as handed to
 * the child. The request is then answered by the child, once it holds the
 * connection alone; the counts it starts from are ours now, and our copy
 * is plain TCP meanwhile. With the stream's lock. */
bool sv_hand_before_upgrade(struct sv_stream *s, struct sv_share *c)
{
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	/* Not on 0, 1 or 2, where stdio may use it past the interposer. */
	if (f.is_client || !f.holders || c->hand.h || f.state != SV_CONN_TCP || f.has_id ||
	    f.fd <= STDERR_FILENO || f.opens != 1 || f.fd_private || f.read_ahead ||
	    f.room_wait || f.tx_shut)
		return false;
	if (sv_holders_hand(f.holders, &f.local, &f.peer, &c->hand) < 0) {
		sv_info("fd %d: the holders' table is full: the fork's child keeps it on TCP",
			f.fd);
		return false;
	}
	atomic_store_explicit(&c->role, SV_HAND_GIVEN, memory_order_release);
	return true;
}

/* Before a fork, once back on TCP: a server connection that was on RDMA
 * (the fork could not leave it there: bytes the application had not read
 * yet) is handed to the child as above, from where each direction stands:
 * our BACK's offsets plus what the kernel's socket carried since (as a
 * successor counts them, redo.c). With the stream's lock. */
static bool hand_detached(struct sv_share *c, const struct sv_stream_facts *f, uint64_t *tx,
			  uint64_t *rx)
{
	uint64_t ktx, krx;
	/* Not one an earlier fork's child holds too (kept, then shared):
	 * that child would still use the socket. */
	if (f->is_client || !f->holders || c->hand.h || f->state != SV_CONN_DETACHED ||
	    !c->redo.ok || f->error || f->fd <= STDERR_FILENO || f->opens != 1 ||
	    f->fd_private || f->read_ahead || f->tx_shut || f->app_closed || c->keep.ref.t ||
	    c->keep.handed.t || sv_tcp_app_counts(f->fd, &ktx, &krx) < 0)
		return false;
	if (sv_holders_hand(f->holders, &f->local, &f->peer, &c->hand) < 0) {
		sv_info("fd %d: the holders' table is full: the fork's child keeps it on TCP",
			f->fd);
		return false;
	}
	c->hand.dtx = c->redo.tx - c->redo.ktx;
	c->hand.drx = c->redo.rx - c->redo.krx;
	*tx = ktx + c->hand.dtx;
	*rx = krx + c->hand.drx;
	/* A call of ours under way at the fork spoils it (as above). */
	atomic_store_explicit(&c->role, SV_HAND_GIVEN, memory_order_release);
	sv_info("fd %d: handed to the fork's child, which may move it to RDMA again", f->fd);
	return true;
}

int sv_share_detach_for_fork(struct sv_stream *s, struct sv_hand *hand, uint64_t *tx,
			     uint64_t *rx)
{
	static const struct sv_hand none = {.h = NULL, .slot = -1};
	if (sv_share_keep_for_fork(s)) {
		*hand = none;
		*tx = *rx = 0;
		return 1;
	}
	struct sv_share *c = sv_share_of(s);
	struct sv_stream_facts f;
	sv_stream_lock(s);
	sv_stream_facts(s, &f);
	if (c)
		c->fork_back = true; /* it may be handed to the child */
	sv_stream_unlock(s);
	/* A client's end stays the application's (parked) if it can be
	 * shared with the child; otherwise the caller makes the fd the
	 * kernel's. */
	int r = sv_stream_detach_for_fork(s, !f.is_client);
	sv_stream_lock(s);
	if (r == 0 && c && sv_keep_share_for_fork(s, c)) {
		sv_stream_unlock(s);
		*hand = none;
		*tx = *rx = 0;
		sv_info("fd %d: plain TCP for the fork; back to RDMA once one process holds it",
			f.fd);
		return 1;
	}
	sv_stream_facts(s, &f);
	*tx = f.tcp_tx;
	*rx = f.tcp_rx;
	bool handed = r == 0 && c &&
		      ((f.fallback == SV_FB_HANDED && c->hand.h) || hand_detached(c, &f, tx, rx));
	*hand = handed ? c->hand : none;
	sv_stream_unlock(s);
	return r;
}

void sv_hand_called_off(struct sv_share *c)
{
	if (atomic_load(&c->role) == SV_HAND_ADOPTED)
		sv_holders_drop(&c->hand);
}

void sv_hand_moved(struct sv_share *c)
{
	if (atomic_load_explicit(&c->role, memory_order_acquire) == SV_HAND_GIVEN)
		sv_holders_spoil(&c->hand);
}

enum sv_conn_holding sv_hand_holding(struct sv_share *c, struct sv_hand *hand)
{
	/* Set before the stream was listed (adopted), or by a fork that
	 * handed it on (hand.h): read as the upgrade's lock orders it. */
	*hand = c->hand;
	return atomic_load(&c->role) == SV_HAND_ADOPTED ? SV_HOLD_ADOPTED
	       : c->hand.h				 ? SV_HOLD_GIVEN
							 : SV_HOLD_OWN;
}

bool sv_hand_others_hold(struct sv_share *c)
{
	/* Our parent (or another copy) may still use the connection: our
	 * counts would not be the stream's. */
	return c->hand.h && !sv_holders_sole(&c->hand);
}

void sv_share_leave_family(struct sv_stream *s)
{
	struct sv_share *c = s ? sv_share_of(s) : NULL;
	if (c && c->hand.h)
		sv_holders_spoil(&c->hand);
}

/* ---- The child's side ------------------------------------------------------------ */

struct sv_stream *sv_share_adopt(int fd, const struct sv_hand *hand, uint64_t tx, uint64_t rx)
{
	struct sv_stream *s = sv_stream_new(fd, false);
	struct sv_share *c = s ? sv_share_of(s) : NULL;
	if (!c) {
		sv_stream_put(s);
		return NULL;
	}
	/* Nobody else has it yet: no lock needed. */
	sv_stream_set_offsets(s, tx, rx);
	sv_stream_set_holders(s, hand->h);
	c->hand = *hand;
	atomic_store(&c->role, SV_HAND_ADOPTED);
	sv_stream_start_at_use(s);
	return s;
}

void sv_share_start_at_first_use(struct sv_stream *s)
{
	if (!sv_stream_take_start(s))
		return;
	struct sv_share *c = sv_share_of(s);
	struct sv_stream_facts f;
	sv_stream_lock(s);
	sv_stream_facts(s, &f);
	bool exposed = !f.is_client && c && c->std_exposed;
	if (exposed) {
		/* stdio may have moved bytes our counts miss: no upgrade here,
		 * and the owner redirects nobody to us. */
		sv_holders_drop(&c->hand);
		sv_stream_unserved(s, "stdio(standard-stream)");
	}
	sv_stream_unlock(s);
	if (f.is_client) {
		sv_stream_start_revived(s, NULL); /* continued after an exec */
		return;
	}
	if (exposed) {
		sv_info("fd %d: used on stdin, stdout or stderr before an exec: it stays on TCP",
			f.fd);
		return;
	}
	sv_stream_start_handed(s);
}

/* Handed to us and untouched: no upgrade began, nothing of ours is in the
 * connection, and the holders' table still has it as ours. With the
 * stream's lock. */
static bool untouched_hand(struct sv_stream *s, struct sv_share *c)
{
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	return atomic_load(&c->role) == SV_HAND_ADOPTED && c->hand.h &&
	       sv_stream_start_pending(s) && f.state == SV_CONN_TCP && !f.has_id &&
	       !f.has_core && !f.read_ahead && !f.room_wait && !f.tx_shut && !f.app_closed &&
	       sv_holders_check(&c->hand, &f.local, &f.peer);
}

bool sv_share_expose_std(struct sv_stream *s)
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return false;
	sv_stream_lock(s);
	bool ok = untouched_hand(s, c);
	if (ok)
		c->std_exposed = true;
	sv_stream_unlock(s);
	return ok;
}

bool sv_share_exec_hand(struct sv_stream *s, struct sv_hand *hand)
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return false;
	sv_stream_lock(s);
	bool ok = untouched_hand(s, c);
	if (ok)
		*hand = c->hand;
	sv_stream_unlock(s);
	return ok;
}

bool sv_share_exec_client(struct sv_stream *s, uint64_t *dtx, uint64_t *drx)
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return false;
	uint64_t ktx, krx;
	sv_stream_lock(s);
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	/* No process but this one holds it (not a fork's child's copy, kept
	 * or handed on), nothing read ahead. */
	bool ok = f.is_client && !f.error && !f.tx_shut && !f.app_closed && !c->keep.ref.t &&
		  !c->keep.letting_go && !f.read_ahead && sv_tcp_app_counts(f.fd, &ktx, &krx) == 0;
	if (ok && f.state == SV_CONN_DETACHED && c->redo.ok) {
		/* Back from RDMA: as a successor counts (redo.c). */
		*dtx = c->redo.tx - c->redo.ktx;
		*drx = c->redo.rx - c->redo.krx;
	} else if (ok && f.state == SV_CONN_FALLBACK && f.fallback == SV_FB_UNSUPPORTED &&
		   !c->pred.pending && !f.switch_seen) {
		/* Never switched, its upgrade called off by this exec (any
		 * other fallback is for good: its fd is the kernel's, or its
		 * peer said no): nothing of ours went on TCP, so the kernel's
		 * counts are the offsets, past where a second life's began,
		 * less our SYN, which a client's counts as acknowledged (a
		 * successor's difference has it already). */
		*dtx = c->redo.ok ? c->redo.tx - c->redo.ktx : (uint64_t)-1;
		*drx = c->redo.ok ? c->redo.rx - c->redo.krx : 0;
	} else {
		ok = false;
	}
	sv_stream_unlock(s);
	return ok;
}
