/* A connection on RDMA kept across a fork (shares.h): the parent's QP goes
 * on carrying it while children hold copies of its socket, until one of
 * them claims its copy or the parent lets go of the connection (its close,
 * its exit, an exec). Then the connection takes the way back (BACK/RETURN,
 * stream_back.c), and the copies share the kernel's socket. */
#include "stream_int.h"

#include "cm.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "shares.h"

#include <sys/stat.h>

/* The owner's kept streams, by their entry in its table. No reference:
 * a stream leaves it before it is freed (sv_stream_keep_forget), and a
 * look takes one only while the stream still has some. Ranked below a
 * stream's lock: settling takes it under that. */
static struct sv_lock keep_lock = SV_LOCK_INIT(SV_RANK_STREAMS);
static struct sv_stream *kept[SV_SHARES_SLOTS];

static bool fork_keeps_qp(void)
{
	return sv_cfg.fork_keep && sv_cm->fork_keeps_qp && sv_cm->fork_keeps_qp();
}

/* Under s->lock. */
static bool enter_kept(struct sv_stream *s)
{
	struct sv_shares *t = sv_shares_own(sv_helper_wake_fd());
	struct stat st;
	if (!t || fstat(s->fd, &st) < 0)
		return false;
	if (sv_shares_keep(t, (uint64_t)st.st_ino, &s->keep.ref) < 0) {
		sv_info("fd %d: too many connections kept across forks: this one goes back to "
			"TCP first", s->fd);
		return false;
	}
	sv_lock(&keep_lock);
	kept[s->keep.ref.slot] = s;
	sv_unlock(&keep_lock);
	return true;
}

bool sv_stream_keep_for_fork(struct sv_stream *s)
{
	if (!fork_keeps_qp())
		return false;
	sv_lock(&s->lock);
	/* Only a connection settled on RDMA (any other state's bytes may sit
	 * in the TCP stream, a switch's echo, which the child shares) that
	 * can still take the way back when a copy claims it (not after the
	 * QP's normal end, nor with the peer's sending moved to TCP). */
	bool ok = s->state == SV_CONN_RDMA && s->proto && !s->error && s->fd >= 0 &&
		  !s->cl.app_closed && !s->sw.tx_held && !s->sw.echo_owed &&
		  !sv_stream_tcpbuf_held(s) && sv_proto_back_ready(s->proto) &&
		  (s->keep.ref.t || enter_kept(s)) && sv_shares_fork_begin(&s->keep.ref);
	if (ok)
		s->keep.forking++;
	sv_unlock(&s->lock);
	return ok;
}

static void settle_if_due(struct sv_stream *s);

void sv_stream_keep_forked(struct sv_stream *s, pid_t pid)
{
	sv_lock(&s->lock);
	if (s->keep.forking) {
		s->keep.forking--;
		sv_shares_fork_end(&s->keep.ref, pid);
		/* It may have left the QP meanwhile (a claim answered while
		 * this fork was under way): settled now. */
		settle_if_due(s);
	}
	sv_unlock(&s->lock);
}

bool sv_stream_kept_for_child(const struct sv_stream *s, struct sv_share_ref *ref)
{
	/* In the child, without the lock (the parent's, not ours): the fork
	 * happened between sv_stream_keep_for_fork and sv_stream_keep_forked. */
	if (!s->keep.forking || !s->keep.ref.t)
		return false;
	*ref = s->keep.ref;
	return true;
}

/* Shared streams (keep.shared): looked at now and then, whether the
 * copies' holders are all gone (each look reads their /proc/PID/fd): soon
 * after a stream is shared, then less and less often. */
static unsigned nshared;
static uint64_t shared_look_at, shared_look_us;
#define SV_SHARED_LOOK_US 200000u
#define SV_SHARED_LOOK_MAX_US 3200000u

/* The entry is no longer ours to follow. Under s->lock. */
static void leave_entry(struct sv_stream *s)
{
	struct sv_share_ref ref = s->keep.ref;
	s->keep.ref.t = NULL;
	s->keep.want_back = false;
	sv_lock(&keep_lock);
	if (kept[ref.slot] == s)
		kept[ref.slot] = NULL;
	if (s->keep.shared)
		nshared--;
	sv_unlock(&keep_lock);
	s->keep.shared = s->keep.alone = false;
}

/* The owner is done with the entry: released or lost. Under s->lock. */
static void settle(struct sv_stream *s, bool lost)
{
	struct sv_share_ref ref = s->keep.ref;
	if (!ref.t || s->keep.forking)
		return; /* a fork under way still counts on it */
	sv_shares_settle(&ref, lost);
	if (s->keep.claimed && !s->keep.shared)
		sv_info("fd %d: %s to the fork's child that claimed it", s->fd,
			lost ? "lost (the connection failed)" : "plain TCP again, given");
	leave_entry(s);
}

/* We let go of a connection back on plain TCP that copies may still
 * hold: when its counts are known, it is handed to them, so that the one
 * holder left takes it to RDMA again (shares.h, sv_shares_adopt). A
 * server's end goes only where a holder can be found by its client: the
 * accepting listener has a holders' table (our listener then redirects
 * the client's request to the adopter's; until it adopts, "later"). Not
 * one shut down, nor one whose fd here became the kernel's
 * (keep.escaped): a process the entry does not list may hold it. Under
 * s->lock. */
static void hand(struct sv_stream *s)
{
	if (!s->keep.ref.t || s->keep.forking)
		return;
	/* A server's child finds the process's own table (sv_holders_get),
	 * not one an exec handed this image (which its owner reads). */
	if ((!s->is_client && (!s->holders || s->holders != sv_holders_get())) || !s->redo.ok ||
	    s->state != SV_CONN_DETACHED ||
	    s->error || s->cl.tx_shut || s->keep.escaped) {
		settle(s, false);
		return;
	}
	struct sv_share_redo r = {.tx = s->redo.tx, .rx = s->redo.rx, .ktx = s->redo.ktx,
				  .krx = s->redo.krx, .server = !s->is_client};
	sv_shares_hand(&s->keep.ref, &r);
	sv_info("fd %d: plain TCP again, handed to the fork's children that hold it: the "
		"last one moves it to RDMA again%s", s->fd,
		s->is_client ? "" : " when the client asks");
	struct sv_share_ref ref = s->keep.ref;
	leave_entry(s);
	atomic_store(&s->parked, false); /* the copies' now, not a successor's */
	if (!s->is_client)
		s->keep.handed = ref;
}

/* Back on plain TCP for a copy's holder, while we still hold it: the
 * entry follows the copies until we hold it alone (sv_stream_keep_service),
 * and the connection then moves to RDMA again (stream_redo.c). Under
 * s->lock. */
static void share(struct sv_stream *s)
{
	if (!s->keep.ref.t || s->keep.forking || s->keep.shared)
		return;
	sv_shares_share(&s->keep.ref);
	s->keep.shared = true;
	s->keep.want_back = false;
	sv_lock(&keep_lock);
	nshared++;
	shared_look_at = 0;
	shared_look_us = SV_SHARED_LOOK_US;
	sv_unlock(&keep_lock);
	if (s->keep.claimed)
		sv_info("fd %d: plain TCP again, given to the fork's child that claimed it; "
			"back to RDMA once we hold it alone", s->fd);
	sv_helper_watch(s); /* its next round sees nshared */
}

bool sv_stream_share_for_fork(struct sv_stream *s)
{
	/* Parked: its one fd is the application's, which a successor may
	 * take over (stream_redo.c). */
	if (!s->is_client || s->state != SV_CONN_DETACHED || !atomic_load(&s->parked) ||
	    !s->redo.ok || s->error || s->keep.letting_go || s->keep.escaped ||
	    (!s->keep.ref.t && !enter_kept(s)))
		return false;
	share(s);
	if (!s->keep.shared)
		return false; /* another fork under way holds it as kept */
	s->keep.alone = false; /* the child will hold it */
	if (!sv_shares_fork_begin(&s->keep.ref)) {
		settle(s, false);
		return false;
	}
	s->keep.forking++;
	return true;
}

/* A reference to the kept stream of entry i, or NULL. */
static struct sv_stream *kept_get(unsigned i)
{
	sv_lock(&keep_lock);
	struct sv_stream *s = kept[i];
	bool got = s && sv_stream_try_get(s);
	sv_unlock(&keep_lock);
	return got ? s : NULL;
}

void sv_stream_keep_forget(struct sv_stream *s)
{
	/* Its last reference went: its fds were closed (which let it go), or
	 * it never got one. */
	if (s->keep.ref.t) {
		s->keep.forking = 0;
		sv_lock(&s->lock);
		settle(s, false);
		sv_unlock(&s->lock);
	}
}

void sv_stream_keep_state(struct sv_stream *s, enum sv_conn_state to)
{
	switch (to) {
	case SV_CONN_RDMA:
		if (s->error)
			settle(s, true);
		break;
	case SV_CONN_DETACHED:
		/* Back on TCP (a copy claimed it, or the peer went back)
		 * while we keep ours: a successor may move it to RDMA again
		 * (stream_redo.c), once we hold it alone; the copies are
		 * followed until then. */
		if (s->keep.letting_go)
			hand(s);
		else if (atomic_load(&s->parked))
			share(s);
		else
			settle(s, false);
		break;
	case SV_CONN_BROKEN:
	case SV_CONN_FALLBACK:
		/* TCP carries both directions now. What the QP brought and the
		 * application has not read is ours, as bytes a read took from
		 * the kernel's socket would be. */
		settle(s, s->error != 0);
		break;
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
	case SV_CONN_SWITCHING:
	case SV_CONN_DETACHING:
	case SV_CONN_RESUMING:
	case SV_CONN_NSTATES:
		break;
	}
}

static void settle_if_due(struct sv_stream *s)
{
	if (s->keep.ref.t)
		sv_stream_keep_state(s, s->state);
}

/* A copy's holder claimed it: the way back starts. Under s->lock. */
static void claimed(struct sv_stream *s)
{
	if (!s->keep.ref.t || !sv_shares_claimed(&s->keep.ref))
		return;
	if (!s->keep.claimed)
		sv_info("fd %d: a fork's child uses its copy: the connection goes back to plain "
			"TCP", s->fd);
	s->keep.claimed = true;
	if (s->error) {
		settle(s, true);
	} else if (s->state == SV_CONN_DETACHED || s->state == SV_CONN_BROKEN ||
		   s->state == SV_CONN_FALLBACK) {
		settle(s, false);
	} else if (s->state == SV_CONN_RDMA && !sv_proto_back_ready(s->proto)) {
		/* No way back any more. With both directions off the QP (the
		 * QP's normal end: our sending goes on over TCP behind our
		 * resume record, which must go before any byte of a copy's)
		 * TCP carries all that is left: what the QP brought and the
		 * application has not read is ours, as after a break. With a
		 * direction still on the QP the copy cannot be given a right
		 * stream. */
		enum sv_tx_state tx = sv_proto_tx_state(s->proto);
		bool off = (tx == SV_TX_TCP || tx == SV_TX_RESET) && !sv_proto_rx_on_qp(s->proto);
		if (off)
			sv_stream_resume_announce(s);
		settle(s, !off);
	} else {
		s->keep.want_back = true; /* sv_stream_back_progress sends it */
	}
}

/* A shared stream we hold alone now: the entry is settled, and a client
 * moves to RDMA again at once (a server's client asks again when it will:
 * stream_redo.c). Without the lock. */
static void alone_again(struct sv_stream *s)
{
	sv_lock(&s->lock);
	struct sv_share_ref ref = s->keep.ref;
	bool shared = s->keep.shared, client = s->is_client;
	sv_unlock(&s->lock);
	/* It looks into /proc: not under the lock the application's calls
	 * take. A fork of ours that begins meanwhile (a client's end stays
	 * ours across it: sv_stream_share_for_fork) counts in the entry's
	 * forks. */
	uint32_t forks = shared ? sv_shares_forks(&ref) : 0;
	if (!shared || sv_shares_others_hold(&ref))
		return;
	sv_lock(&s->lock);
	bool current = s->keep.shared && s->keep.ref.gen == ref.gen && !s->keep.forking &&
		       sv_shares_forks(&ref) == forks;
	if (current) /* until a fork of ours gives a copy again */
		s->keep.alone = true;
	sv_unlock(&s->lock);
	if (!current)
		return;
	int r = client ? sv_stream_revive(s, NULL) : -1;
	sv_lock(&s->lock);
	if (s->keep.shared && s->keep.ref.gen == ref.gen)
		settle(s, false);
	sv_unlock(&s->lock);
	if (r == 1)
		sv_info("fd %d: the fork's children that used it are gone: it moves to RDMA "
			"again", s->fd);
	else if (client)
		sv_info("fd %d: the fork's children that used it are gone, but it stays on TCP",
			s->fd);
	else
		sv_dbg("fd %d: the fork's children that used it are gone: it moves to RDMA "
		       "again if its client asks", s->fd);
}

uint64_t sv_stream_keep_service(uint64_t now)
{
	struct sv_shares *t = sv_shares_own(-1);
	int slots[32];
	int n;
	while (t && (n = sv_shares_take_claims(t, slots, 32)) > 0) {
		for (int i = 0; i < n; i++) {
			struct sv_stream *s = kept_get((unsigned)slots[i]);
			if (!s)
				continue;
			sv_lock(&s->lock);
			claimed(s);
			sv_unlock(&s->lock);
			sv_helper_watch(s);
			sv_stream_put(s);
		}
	}
	sv_lock(&keep_lock);
	bool look = nshared && now >= shared_look_at;
	if (look) {
		shared_look_at = now + shared_look_us;
		if (shared_look_us < SV_SHARED_LOOK_MAX_US)
			shared_look_us *= 2;
	}
	uint64_t next = nshared ? shared_look_at : 0;
	sv_unlock(&keep_lock);
	for (unsigned i = 0; look && i < SV_SHARES_SLOTS; i++) {
		struct sv_stream *s = kept_get(i);
		if (!s)
			continue;
		alone_again(s);
		sv_stream_put(s);
	}
	return next;
}

/* The owner lets go of the connection (its last close, its exit, an
 * exec): copies that others still hold get it back on plain TCP; with none
 * left, it is ours to end. Without the lock. */
static void let_go(struct sv_stream *s, const char *why)
{
	sv_lock(&s->lock);
	struct sv_share_ref ref = s->keep.ref;
	s->keep.letting_go = true;
	if (s->keep.shared) {
		hand(s); /* the copies have it on TCP already */
		ref.t = NULL;
	}
	sv_unlock(&s->lock);
	if (!ref.t)
		return;
	if (sv_shares_others_hold(&ref)) {
		sv_info("fd %d: %s while a fork's child holds a copy: back to plain TCP for it",
			s->fd, why);
		int r = sv_stream_detach_for_copies(s);
		if (r == 0)
			return; /* DETACHED settled it */
	}
	sv_lock(&s->lock);
	if (s->keep.ref.t && s->keep.ref.gen == ref.gen)
		settle(s, sv_shares_others_hold(&ref));
	sv_unlock(&s->lock);
}

void sv_stream_keep_close(struct sv_stream *s)
{
	let_go(s, "closed here");
}

void sv_stream_keep_exit(struct sv_stream *s)
{
	let_go(s, "the process exits");
}

void sv_stream_keep_exec_all(void)
{
	for (unsigned i = 0; i < SV_SHARES_SLOTS; i++) {
		struct sv_stream *s = kept_get(i);
		if (!s)
			continue;
		let_go(s, "an exec replaces this image");
		sv_stream_put(s);
	}
}

void sv_stream_keep_atfork_child(void)
{
	/* The parent's kept streams and their references are the parent's. */
	sv_lock_reinit(&keep_lock);
	for (unsigned i = 0; i < SV_SHARES_SLOTS; i++)
		kept[i] = NULL;
	nshared = 0;
	sv_shares_atfork_child();
}
