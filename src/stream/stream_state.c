/* The stream's state machine: the allowed transitions, in one table, and
 * each direction's medium, derived in one place. docs/design.md shows the
 * same table. */
#include "stream_int.h"

#include "log.h"
#include "peers.h"

const char *sv_conn_state_name(enum sv_conn_state s)
{
	switch (s) {
	case SV_CONN_TCP:
		return "tcp";
	case SV_CONN_RESOLVING:
		return "resolving";
	case SV_CONN_REQUESTED:
		return "requested";
	case SV_CONN_SWITCHING:
		return "switching";
	case SV_CONN_RDMA:
		return "rdma";
	case SV_CONN_FALLBACK:
		return "fallback";
	case SV_CONN_BROKEN:
		return "broken";
	case SV_CONN_DETACHING:
		return "detaching";
	case SV_CONN_DETACHED:
		return "detached";
	case SV_CONN_RESUMING:
		return "resuming";
	case SV_CONN_NSTATES:
		break;
	}
	return "?";
}

const char *sv_fallback_name(enum sv_fallback f)
{
	switch (f) {
	case SV_FB_NONE:
		return "none";
	case SV_FB_DISABLED:
		return "disabled";
	case SV_FB_NO_ROUTE:
		return "no-rdma-route";
	case SV_FB_REJECTED:
		return "rejected";
	case SV_FB_UNREACHABLE:
		return "unreachable";
	case SV_FB_VERSION:
		return "version-mismatch";
	case SV_FB_TIMEOUT:
		return "timeout";
	case SV_FB_NO_MATCH:
		return "no-matching-connection";
	case SV_FB_CHALLENGE:
		return "challenge-failed";
	case SV_FB_RESOURCES:
		return "no-resources";
	case SV_FB_UNSUPPORTED:
		return "unsupported-call";
	case SV_FB_SHUTDOWN:
		return "shut-down-before-upgrade";
	case SV_FB_QP_LOST:
		return "qp-lost";
	case SV_FB_CALLED_OFF:
		return "called-off-by-peer";
	case SV_FB_CREDENTIALS:
		return "credentials";
	case SV_FB_MEMLOCK:
		return "memlock";
	case SV_FB_UNPRIVILEGED:
		return "unprivileged-port";
	case SV_FB_HANDED:
		return "handed-to-child";
	case SV_FB_UNVOUCHED:
		return "unvouched";
	}
	return "?";
}

#define TO(s) (1u << (s))

/* allowed[from] is the set of states `from` may change to. */
static const unsigned allowed[SV_CONN_NSTATES] = {
	/* Client: resolving starts the upgrade; server: a matching request. */
	[SV_CONN_TCP] = TO(SV_CONN_RESOLVING) | TO(SV_CONN_REQUESTED) | TO(SV_CONN_FALLBACK),
	/* TCP: the warden (whose request has no QP: upgrade.c) sent us
	 * elsewhere, or its host has none; asked again from TCP. */
	[SV_CONN_RESOLVING] = TO(SV_CONN_REQUESTED) | TO(SV_CONN_TCP) | TO(SV_CONN_FALLBACK),
	/* TCP: no listener yet at the server, the client asks again later.
	 * RDMA: the peer's switch came and was verified before rdma_cm's
	 * ESTABLISHED reached us. */
	[SV_CONN_REQUESTED] = TO(SV_CONN_TCP) | TO(SV_CONN_SWITCHING) | TO(SV_CONN_RDMA) |
			      TO(SV_CONN_FALLBACK),
	/* BROKEN: the QP failed after bytes moved to it. DETACHING: the way
	 * back asked for in the switch's last moments. */
	[SV_CONN_SWITCHING] = TO(SV_CONN_RDMA) | TO(SV_CONN_FALLBACK) | TO(SV_CONN_BROKEN) |
			      TO(SV_CONN_DETACHING),
	/* FALLBACK: a peer that switched back to TCP and announced a second
	 * switch that failed its challenge (nothing of ours follows it). */
	/* RESUMING: the QP was lost with both directions on it. */
	[SV_CONN_RDMA] = TO(SV_CONN_BROKEN) | TO(SV_CONN_DETACHING) | TO(SV_CONN_FALLBACK) |
			 TO(SV_CONN_RESUMING),
	[SV_CONN_FALLBACK] = 0,
	[SV_CONN_BROKEN] = 0,
	[SV_CONN_DETACHING] = TO(SV_CONN_DETACHED) | TO(SV_CONN_BROKEN),
	[SV_CONN_DETACHED] = 0,
	/* BROKEN: resumed (TCP carries both directions, no error), or failed. */
	[SV_CONN_RESUMING] = TO(SV_CONN_BROKEN),
};

void sv_stream_set_state(struct sv_stream *s, enum sv_conn_state to)
{
	enum sv_conn_state from = s->state;
	if (from == to)
		return;
	sv_lock_assert_held(&s->lock);
	if (sv_checks && !(allowed[from] & TO(to)))
		sv_fatal("fd %d: state %s -> %s is not an allowed transition", s->fd,
			 sv_conn_state_name(from), sv_conn_state_name(to));
	sv_dbg("fd %d: %s -> %s", s->fd, sv_conn_state_name(from), sv_conn_state_name(to));
	s->state = to;
	sv_copies_state(s, to);
}

/* What a fallback says of the peer, for its next connections (peers.h).
 * A port without libsovia is told by the upgrade (upgrade.c): a rejection
 * may also come from a libsovia server (a connection it closed first). */
static void remember(const struct sv_stream *s, enum sv_fallback why)
{
	if (s->is_client && why == SV_FB_NO_ROUTE)
		sv_peers_no_route(&s->tuple.peer);
}

void sv_stream_unserved(struct sv_stream *s, const char *call)
{
	if (s->fallback == SV_FB_NONE && !s->unserved)
		s->unserved = call;
	sv_stream_fall_back(s, SV_FB_UNSUPPORTED);
}

void sv_stream_fall_back(struct sv_stream *s, enum sv_fallback why)
{
	switch (s->state) {
	case SV_CONN_RDMA:
	case SV_CONN_BROKEN:
	case SV_CONN_DETACHING:
	case SV_CONN_DETACHED:
	case SV_CONN_RESUMING:
		return; /* past the upgrade: TCP is not a fallback any more */
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
	case SV_CONN_SWITCHING:
	case SV_CONN_FALLBACK:
	case SV_CONN_NSTATES:
		break;
	}
	if (s->fallback == SV_FB_NONE)
		s->fallback = why;
	remember(s, why);
	if (s->state != SV_CONN_FALLBACK && s->fallback == SV_FB_UNSUPPORTED && s->unserved)
		sv_info("fd %d stays on TCP: %s (%s, a call libsovia does not serve)", s->fd,
			sv_fallback_name(s->fallback), s->unserved);
	else if (s->state != SV_CONN_FALLBACK)
		sv_info("fd %d stays on TCP: %s", s->fd, sv_fallback_name(s->fallback));
	sv_stream_set_state(s, SV_CONN_FALLBACK);
	sv_stream_wake(s);
}

bool sv_stream_may_switch(const struct sv_stream *s)
{
	switch (s->state) {
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
	case SV_CONN_SWITCHING:
	case SV_CONN_RDMA:
		return true;
	case SV_CONN_FALLBACK:
	case SV_CONN_BROKEN:
	case SV_CONN_DETACHING:
	case SV_CONN_DETACHED:
	case SV_CONN_RESUMING:
	case SV_CONN_NSTATES:
		return false;
	}
	return true;
}

bool sv_stream_tcp_for_good(const struct sv_stream *s)
{
	if (s->state == SV_CONN_DETACHED)
		return true;
	if (s->state != SV_CONN_FALLBACK)
		return false;
	/* A fallback keeps its core only after a switch began: TCP for good
	 * once no part of either direction is the QP's. */
	return !s->proto || (sv_proto_tx_state(s->proto) == SV_TX_TCP && !s->sw.tx_held &&
			     !sv_proto_rx_on_qp(s->proto));
}

/* Called where a call looks at the stream, never in the middle of a
 * change (a failed challenge falls back, then puts the would-be echo in
 * front). */
void sv_stream_note_kernel_only(struct sv_stream *s)
{
	if (sv_stream_tcp_for_good(s) && !sv_stream_tcpbuf_held(s))
		atomic_store_explicit(&s->kernel_only, true, memory_order_release);
}

bool sv_stream_kernel_only_seen(const struct sv_stream *s)
{
	return atomic_load_explicit(&s->kernel_only, memory_order_acquire);
}

enum sv_medium sv_stream_rx_medium(const struct sv_stream *s)
{
	if (sv_stream_tcpbuf_held(s))
		return SV_MEDIUM_TCP; /* what was read ahead goes first */
	/* After our BACK the peer writes the rest on TCP (DETACHING). */
	if (sv_stream_tcp_for_good(s) || s->state == SV_CONN_DETACHING)
		return SV_MEDIUM_KERNEL;
	if (s->proto && sv_proto_rx_on_qp(s->proto))
		return SV_MEDIUM_QP;
	return SV_MEDIUM_TCP;
}

enum sv_medium sv_stream_tx_medium(const struct sv_stream *s)
{
	if (sv_stream_tcp_for_good(s))
		return SV_MEDIUM_KERNEL;
	if (s->state == SV_CONN_DETACHING || s->state == SV_CONN_RESUMING)
		return SV_MEDIUM_HELD; /* the bytes given back (or resent) go first */
	if (sv_stream_holding_first(s))
		return SV_MEDIUM_HELD; /* a peer that speaks libsovia: for the QP */
	if (!s->proto || sv_proto_tx_state(s->proto) == SV_TX_TCP)
		return SV_MEDIUM_TCP;
	return s->sw.tx_held ? SV_MEDIUM_HELD : SV_MEDIUM_QP;
}
