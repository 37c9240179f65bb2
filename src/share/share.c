/* The share module's start, its events from the stream (stream.h, struct
 * sv_stream_copies) and the second life's state table. */
#include "share_int.h"

#include "helper.h"
#include "lock.h"
#include "log.h"
#include "upgrade.h"

#include <stdlib.h>

/* ---- The second life's transitions ---------------------------------------------- */

#define TO(s) (1u << (s))
static const unsigned life_allowed[SV_LIFE_N] = {
	/* Our BACK went (not for a connection whose fd became the
	 * kernel's); or back on TCP where a successor may take it. */
	[SV_LIFE_NONE] = TO(SV_LIFE_GOING) | TO(SV_LIFE_PARKED),
	/* Detached: parked, or not (its fd is not the application's one). */
	[SV_LIFE_GOING] = TO(SV_LIFE_PARKED) | TO(SV_LIFE_NONE),
	/* A successor took it; or it was given away (unparked, handed on). */
	[SV_LIFE_PARKED] = TO(SV_LIFE_SUCCEEDED) | TO(SV_LIFE_NONE),
	[SV_LIFE_SUCCEEDED] = 0,
};

static const char *life_name(enum sv_life l)
{
	static const char *const names[SV_LIFE_N] = {"none", "going", "parked", "succeeded"};
	return (unsigned)l < SV_LIFE_N ? names[l] : "?";
}

void sv_share_set_life(struct sv_share *c, enum sv_life to)
{
	enum sv_life from = sv_share_life(c);
	if (from == to)
		return;
	if (sv_checks && !(life_allowed[from] & TO(to)))
		sv_fatal("fd %d: second life %s -> %s is not an allowed transition",
			 sv_stream_fd(c->s), life_name(from), life_name(to));
	atomic_store_explicit(&c->life, to, memory_order_release);
}

/* ---- The stream's events ------------------------------------------------------------ */

static void *on_born(struct sv_stream *s)
{
	struct sv_share *c = calloc(1, sizeof(*c));
	if (c)
		c->s = s;
	return c;
}

static void on_died(struct sv_stream *s, void *state)
{
	struct sv_share *c = state;
	sv_redo_pred_forget(c);
	sv_keep_forget(s, c);
	if (atomic_load(&c->role) == SV_HAND_ADOPTED)
		sv_holders_drop(&c->hand); /* if still there */
	free(c);
}

static void on_state(struct sv_stream *s, enum sv_conn_state to)
{
	struct sv_share *c = sv_share_of(s);
	sv_keep_state(s, c, to);
	if (to == SV_CONN_RDMA || to == SV_CONN_FALLBACK || to == SV_CONN_BROKEN)
		sv_redo_pred_done(c); /* the switch is over, or the upgrade */
}

static void on_let_go(struct sv_stream *s, bool exiting)
{
	struct sv_share *c = sv_share_of(s);
	sv_stream_lock(s);
	bool kept = c->keep.ref.t != NULL;
	sv_stream_unlock(s);
	/* A close matters to a kept connection only; an exit to every one
	 * (a copy's claim can no longer be answered). */
	if (exiting || kept)
		sv_keep_let_go(s, exiting ? "the process exits" : "closed here");
}

static void on_closed(struct sv_stream *s)
{
	sv_redo_pred_done(sv_share_of(s));
}

static bool on_fork_hand(struct sv_stream *s)
{
	return sv_hand_before_upgrade(s, sv_share_of(s));
}

static void on_called_off(struct sv_stream *s)
{
	sv_hand_called_off(sv_share_of(s));
}

static void on_back(struct sv_stream *s, bool peer_first)
{
	struct sv_share *c = sv_share_of(s);
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	sv_redo_snapshot(s, c, peer_first);
	/* A request that comes now hears "later": it will be parked, unless
	 * its fd became the kernel's. */
	if (!f.escaped && sv_share_life(c) == SV_LIFE_NONE)
		sv_share_set_life(c, SV_LIFE_GOING);
}

static void on_detached(struct sv_stream *s)
{
	struct sv_share *c = sv_share_of(s);
	sv_redo_detached(s, c);
	if (sv_share_life(c) == SV_LIFE_GOING)
		sv_share_set_life(c, SV_LIFE_NONE);
}

static bool on_may_upgrade(struct sv_stream *s)
{
	return sv_redo_ready(s, sv_share_of(s));
}

static bool on_may_pump(struct sv_stream *s)
{
	return !sv_redo_pred_busy(sv_share_of(s));
}

static bool on_superseded(struct sv_stream *s)
{
	enum sv_life l = sv_share_life(sv_share_of(s));
	return l == SV_LIFE_PARKED || l == SV_LIFE_SUCCEEDED;
}

static void on_moved(struct sv_stream *s)
{
	sv_hand_moved(sv_share_of(s));
}

static enum sv_conn_holding on_holding(struct sv_stream *s, struct sv_hand *hand)
{
	return sv_hand_holding(sv_share_of(s), hand);
}

static bool on_others_hold(struct sv_stream *s)
{
	return sv_hand_others_hold(sv_share_of(s));
}

/* ---- The module ----------------------------------------------------------------------- */

/* Each round of the helper, before it looks at the streams: predecessors
 * whose successors took over are let go first, then copies' claims start
 * their way back (a claim's first step comes before its stream's look). */
static uint64_t copies_round(uint64_t now)
{
	sv_redo_reap();
	return sv_keep_service(now);
}

void sv_share_init(void)
{
	static const struct sv_stream_copies events = {
		.born = on_born,
		.died = on_died,
		.state = on_state,
		.let_go = on_let_go,
		.closed = on_closed,
		.fork_hand = on_fork_hand,
		.called_off = on_called_off,
		.back = on_back,
		.detached = on_detached,
		.may_upgrade = on_may_upgrade,
		.may_pump = on_may_pump,
		.superseded = on_superseded,
		.moved = on_moved,
		.holding = on_holding,
		.others_hold = on_others_hold,
	};
	sv_stream_init();
	sv_stream_serve_copies(&events);
	sv_helper_each_round(SV_HELPER_BEFORE_LOOKS, copies_round);
	sv_upgrade_serve_revive(sv_redo_revive_parked);
}

void sv_share_atfork_child(void)
{
	sv_stream_atfork_child();
	sv_keep_atfork_child();
	sv_redo_atfork_child();
}
