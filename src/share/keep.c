/* A connection on RDMA kept across a fork (shares.h): the parent's QP goes
 * on carrying it while children hold copies of its socket, until one of
 * them claims its copy or the parent lets go of the connection (its close,
 * its exit, an exec). Then the connection takes the way back (BACK/RETURN,
 * the stream's), and the copies share the kernel's socket. */
#include "share_int.h"

#include "cm.h"
#include "config.h"
#include "helper.h"
#include "lock.h"
#include "log.h"

#include <sys/stat.h>

/* The owner's kept streams, by their entry in its table. No reference:
 * a stream leaves it before it is freed (sv_keep_forget), and a look takes
 * one only while the stream still has some. Ranked below a stream's lock:
 * settling takes it under that. */
static struct sv_lock keep_lock = SV_LOCK_INIT(SV_RANK_STREAMS);
static struct sv_stream *kept[SV_SHARES_SLOTS];

static bool fork_keeps_qp(void)
{
	return sv_cfg.fork_keep && sv_cm->fork_keeps_qp && sv_cm->fork_keeps_qp();
}

/* Under the stream's lock. */
static bool enter_kept(struct sv_stream *s, struct sv_share *c, int fd)
{
	struct sv_shares *t = sv_shares_own(sv_helper_wake_fd());
	struct stat st;
	if (!t || fstat(fd, &st) < 0)
		return false;
	if (sv_shares_keep(t, (uint64_t)st.st_ino, &c->keep.ref) < 0) {
		sv_info("fd %d: too many connections kept across forks: this one goes back to "
			"TCP first", fd);
		return false;
	}
	sv_lock(&keep_lock);
	kept[c->keep.ref.slot] = s;
	sv_unlock(&keep_lock);
	return true;
}

bool sv_share_keep_for_fork(struct sv_stream *s)
{
	struct sv_share *c = sv_share_of(s);
	if (!c || !fork_keeps_qp())
		return false;
	sv_stream_lock(s);
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	/* Only a connection settled on RDMA (any other state's bytes may sit
	 * in the TCP stream, a switch's echo, which the child shares) that
	 * can still take the way back when a copy claims it (not after the
	 * QP's normal end, nor with the peer's sending moved to TCP). */
	bool ok = f.state == SV_CONN_RDMA && f.has_core && !f.error && f.fd >= 0 &&
		  !f.app_closed && !f.switch_pending && !f.read_ahead && f.core_back_ready &&
		  (c->keep.ref.t || enter_kept(s, c, f.fd)) && sv_shares_fork_begin(&c->keep.ref);
	if (ok)
		c->keep.forking++;
	sv_stream_unlock(s);
	return ok;
}

static void settle_if_due(struct sv_stream *s, struct sv_share *c);

void sv_share_forked(struct sv_stream *s, pid_t pid)
{
	struct sv_share *c = sv_share_of(s);
	if (!c)
		return;
	sv_stream_lock(s);
	if (c->keep.forking) {
		c->keep.forking--;
		sv_shares_fork_end(&c->keep.ref, pid);
		/* It may have left the QP meanwhile (a claim answered while
		 * this fork was under way): settled now. */
		settle_if_due(s, c);
	}
	sv_stream_unlock(s);
}

bool sv_share_kept_for_child(struct sv_stream *s, struct sv_share_ref *ref)
{
	/* In the child, without the lock (the parent's, not ours): the fork
	 * happened between sv_share_keep_for_fork and sv_share_forked. */
	struct sv_share *c = sv_share_of(s);
	if (!c || !c->keep.forking || !c->keep.ref.t)
		return false;
	*ref = c->keep.ref;
	return true;
}

/* Shared streams (keep.shared): looked at now and then, whether the
 * copies' holders are all gone (each look reads their /proc/PID/fd): soon
 * after a stream is shared, then less and less often. */
static unsigned nshared;
static uint64_t shared_look_at, shared_look_us;
#define SV_SHARED_LOOK_US 200000u
#define SV_SHARED_LOOK_MAX_US 3200000u

/* The entry is no longer ours to follow. Under the stream's lock. */
static void leave_entry(struct sv_share *c)
{
	struct sv_share_ref ref = c->keep.ref;
	c->keep.ref.t = NULL;
	sv_stream_want_back(c->s, false);
	sv_lock(&keep_lock);
	if (kept[ref.slot] == c->s)
		kept[ref.slot] = NULL;
	if (c->keep.shared)
		nshared--;
	sv_unlock(&keep_lock);
	c->keep.shared = c->keep.alone = false;
}

/* The owner is done with the entry: released or lost. Under the stream's
 * lock. */
static void settle(struct sv_share *c, bool lost)
{
	struct sv_share_ref ref = c->keep.ref;
	if (!ref.t || c->keep.forking)
		return; /* a fork under way still counts on it */
	sv_shares_settle(&ref, lost);
	if (c->keep.claimed && !c->keep.shared)
		sv_info("fd %d: %s to the fork's child that claimed it", sv_stream_fd(c->s),
			lost ? "lost (the connection failed)" : "plain TCP again, given");
	leave_entry(c);
}

/* We let go of a connection back on plain TCP that copies may still
 * hold: when its counts are known, it is handed to them, so that the one
 * holder left takes it to RDMA again (shares.h, sv_shares_adopt). A
 * server's end goes only where a holder can be found by its client: the
 * accepting listener has a holders' table (our listener then redirects
 * the client's request to the adopter's; until it adopts, "later"). Not
 * one shut down, nor one whose fd here became the kernel's (escaped): a
 * process the entry does not list may hold it. Under the stream's lock. */
static void hand(struct sv_stream *s, struct sv_share *c)
{
	if (!c->keep.ref.t || c->keep.forking)
		return;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	/* A server's child finds the process's own table (sv_holders_get),
	 * not one an exec handed this image (which its owner reads). */
	if ((!f.is_client && (!f.holders || f.holders != sv_holders_get())) || !c->redo.ok ||
	    f.state != SV_CONN_DETACHED || f.error || f.tx_shut || f.escaped) {
		settle(c, false);
		return;
	}
	struct sv_share_redo r = {.tx = c->redo.tx, .rx = c->redo.rx, .ktx = c->redo.ktx,
				  .krx = c->redo.krx, .server = !f.is_client};
	sv_shares_hand(&c->keep.ref, &r);
	sv_info("fd %d: plain TCP again, handed to the fork's children that hold it: the "
		"last one moves it to RDMA again%s", f.fd,
		f.is_client ? "" : " when the client asks");
	struct sv_share_ref ref = c->keep.ref;
	leave_entry(c);
	if (sv_share_life(c) == SV_LIFE_PARKED)
		sv_share_set_life(c, SV_LIFE_NONE); /* the copies' now, not a successor's */
	if (!f.is_client)
		c->keep.handed = ref;
}

/* Back on plain TCP for a copy's holder, while we still hold it: the
 * entry follows the copies until we hold it alone (sv_keep_service), and
 * the connection then moves to RDMA again (redo.c). Under the stream's
 * lock. */
static void share(struct sv_stream *s, struct sv_share *c)
{
	if (!c->keep.ref.t || c->keep.forking || c->keep.shared)
		return;
	sv_shares_share(&c->keep.ref);
	c->keep.shared = true;
	sv_stream_want_back(s, false);
	sv_lock(&keep_lock);
	nshared++;
	shared_look_at = 0;
	shared_look_us = SV_SHARED_LOOK_US;
	sv_unlock(&keep_lock);
	if (c->keep.claimed)
		sv_info("fd %d: plain TCP again, given to the fork's child that claimed it; "
			"back to RDMA once we hold it alone", sv_stream_fd(s));
	sv_helper_watch(s); /* its next round sees nshared */
}

bool sv_keep_share_for_fork(struct sv_stream *s, struct sv_share *c)
{
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	/* Parked: its one fd is the application's, which a successor may
	 * take over (redo.c). */
	if (!f.is_client || f.state != SV_CONN_DETACHED ||
	    sv_share_life(c) != SV_LIFE_PARKED || !c->redo.ok || f.error ||
	    c->keep.letting_go || f.escaped || (!c->keep.ref.t && !enter_kept(s, c, f.fd)))
		return false;
	share(s, c);
	if (!c->keep.shared)
		return false; /* another fork under way holds it as kept */
	c->keep.alone = false; /* the child will hold it */
	if (!sv_shares_fork_begin(&c->keep.ref)) {
		settle(c, false);
		return false;
	}
	c->keep.forking++;
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

void sv_keep_forget(struct sv_stream *s, struct sv_share *c)
{
	/* Its last reference went: its fds were closed (which let it go), or
	 * it never got one. */
	if (c->keep.ref.t) {
		c->keep.forking = 0;
		sv_stream_lock(s);
		settle(c, false);
		sv_stream_unlock(s);
	}
}

void sv_keep_state(struct sv_stream *s, struct sv_share *c, enum sv_conn_state to)
{
	if (!c->keep.ref.t)
		return;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	switch (to) {
	case SV_CONN_RDMA:
		if (f.error)
			settle(c, true);
		break;
	case SV_CONN_DETACHED:
		/* Back on TCP (a copy claimed it, or the peer went back)
		 * while we keep ours: a successor may move it to RDMA again
		 * (redo.c), once we hold it alone; the copies are followed
		 * until then. */
		if (c->keep.letting_go)
			hand(s, c);
		else if (sv_share_life(c) == SV_LIFE_PARKED)
			share(s, c);
		else
			settle(c, false);
		break;
	case SV_CONN_BROKEN:
	case SV_CONN_FALLBACK:
		/* TCP carries both directions now. What the QP brought and the
		 * application has not read is ours, as bytes a read took from
		 * the kernel's socket would be. */
		settle(c, f.error != 0);
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

static void settle_if_due(struct sv_stream *s, struct sv_share *c)
{
	if (!c->keep.ref.t)
		return;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	sv_keep_state(s, c, f.state);
}

/* A copy's holder claimed it: the way back starts. Under the stream's
 * lock. */
static void claimed(struct sv_stream *s, struct sv_share *c)
{
	if (!c->keep.ref.t || !sv_shares_claimed(&c->keep.ref))
		return;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	if (!c->keep.claimed)
		sv_info("fd %d: a fork's child uses its copy: the connection goes back to plain "
			"TCP", f.fd);
	c->keep.claimed = true;
	if (f.error) {
		settle(c, true);
	} else if (f.state == SV_CONN_DETACHED || f.state == SV_CONN_BROKEN ||
		   f.state == SV_CONN_FALLBACK) {
		settle(c, false);
	} else if (f.state == SV_CONN_RDMA && !f.core_back_ready) {
		/* No way back any more. With both directions off the QP (the
		 * QP's normal end: our sending goes on over TCP behind our
		 * resume record, which must go before any byte of a copy's)
		 * TCP carries all that is left: what the QP brought and the
		 * application has not read is ours, as after a break. With a
		 * direction still on the QP the copy cannot be given a right
		 * stream. */
		if (f.off_qp)
			sv_stream_announce_end(s);
		settle(c, !f.off_qp);
	} else {
		sv_stream_want_back(s, true); /* the way back sends it */
	}
}

/* A shared stream we hold alone now: the entry is settled, and a client
 * moves to RDMA again at once (a server's client asks again when it will:
 * redo.c). Without the lock. */
static void alone_again(struct sv_stream *s, struct sv_share *c)
{
	sv_stream_lock(s);
	struct sv_share_ref ref = c->keep.ref;
	bool shared = c->keep.shared;
	struct sv_stream_facts f;
	sv_stream_facts(s, &f);
	sv_stream_unlock(s);
	/* It looks into /proc: not under the lock the application's calls
	 * take. A fork of ours that begins meanwhile (a client's end stays
	 * ours across it: sv_keep_share_for_fork) counts in the entry's
	 * forks. */
	uint32_t forks = shared ? sv_shares_forks(&ref) : 0;
	if (!shared || sv_shares_others_hold(&ref))
		return;
	sv_stream_lock(s);
	bool current = c->keep.shared && c->keep.ref.gen == ref.gen && !c->keep.forking &&
		       sv_shares_forks(&ref) == forks;
	if (current) /* until a fork of ours gives a copy again */
		c->keep.alone = true;
	sv_stream_unlock(s);
	if (!current)
		return;
	int r = f.is_client ? sv_share_revive(s, NULL) : -1;
	sv_stream_lock(s);
	if (c->keep.shared && c->keep.ref.gen == ref.gen)
		settle(c, false);
	sv_stream_unlock(s);
	if (r == 1)
		sv_info("fd %d: the fork's children that used it are gone: it moves to RDMA "
			"again", f.fd);
	else if (f.is_client)
		sv_info("fd %d: the fork's children that used it are gone, but it stays on TCP",
			f.fd);
	else
		sv_dbg("fd %d: the fork's children that used it are gone: it moves to RDMA "
		       "again if its client asks", f.fd);
}

uint64_t sv_keep_service(uint64_t now)
{
	struct sv_shares *t = sv_shares_own(-1);
	int slots[32];
	int n;
	while (t && (n = sv_shares_take_claims(t, slots, 32)) > 0) {
		for (int i = 0; i < n; i++) {
			struct sv_stream *s = kept_get((unsigned)slots[i]);
			if (!s)
				continue;
			sv_stream_lock(s);
			claimed(s, sv_share_of(s));
			sv_stream_unlock(s);
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
		alone_again(s, sv_share_of(s));
		sv_stream_put(s);
	}
	return next;
}

/* The owner lets go of the connection (its last close, its exit, an
 * exec): copies that others still hold get it back on plain TCP; with none
 * left, it is ours to end. Without the lock. */
void sv_keep_let_go(struct sv_stream *s, const char *why)
{
	struct sv_share *c = sv_share_of(s);
	sv_stream_lock(s);
	struct sv_share_ref ref = c->keep.ref;
	c->keep.letting_go = true;
	if (c->keep.shared) {
		hand(s, c); /* the copies have it on TCP already */
		ref.t = NULL;
	}
	sv_stream_unlock(s);
	if (!ref.t)
		return;
	if (sv_shares_others_hold(&ref)) {
		sv_info("fd %d: %s while a fork's child holds a copy: back to plain TCP for it",
			sv_stream_fd(s), why);
		int r = sv_stream_detach_for_copies(s);
		if (r == 0)
			return; /* DETACHED settled it */
	}
	sv_stream_lock(s);
	if (c->keep.ref.t && c->keep.ref.gen == ref.gen)
		settle(c, sv_shares_others_hold(&ref));
	sv_stream_unlock(s);
}

void sv_share_exec_all(void)
{
	for (unsigned i = 0; i < SV_SHARES_SLOTS; i++) {
		struct sv_stream *s = kept_get(i);
		if (!s)
			continue;
		sv_keep_let_go(s, "an exec replaces this image");
		sv_stream_put(s);
	}
}

void sv_keep_atfork_child(void)
{
	/* The parent's kept streams and their references are the parent's. */
	sv_lock_reinit(&keep_lock);
	for (unsigned i = 0; i < SV_SHARES_SLOTS; i++)
		kept[i] = NULL;
	nshared = 0;
	sv_shares_atfork_child();
}
