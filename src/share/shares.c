/* The table of kept connections: see shares.h.
 *
 * Processes of one family share it without a lock. Each entry's state
 * word is its generation and its phase; every change of phase is a
 * compare-and-swap on the whole word, so a change meant for one
 * connection never lands on the next one to use the entry. Only the owner
 * takes an entry, releases it and reuses it; its copies' holders only
 * claim it and list or unlist themselves. */
#include "shares.h"

#include "ownfd.h"
#include "procfd.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The copies an entry lists by pid; past that it counts them only, and
 * the owner then never ends the connection as its own (it goes back to
 * TCP at the owner's close instead). */
#define SV_SHARES_PIDS 6

/* SHARED: released to the copies, which the owner still follows (their
 * forks list the new holders) to take the connection to RDMA again once
 * it holds it alone. HANDED: released to the copies by an owner that let
 * go of it, with the counts a copy's holder needs to take it to RDMA
 * again once it holds it alone (sv_shares_adopt); followed until then. */
enum {
	PH_FREE = 0,
	PH_KEPT = 1,
	PH_CLAIMED = 2,
	PH_RELEASED = 3,
	PH_LOST = 4,
	PH_SHARED = 5,
	PH_HANDED = 6,
};
#define PHASE(st) ((st) & 7u)
#define GEN(st) ((st) >> 3)
#define MAKE(gen, ph) ((uint32_t)(gen) << 3 | (uint32_t)(ph))

struct slot {
	_Atomic uint32_t state;   /* the futex word */
	_Atomic uint32_t pending; /* forks under way that give a copy */
	_Atomic uint32_t unlisted; /* copies given that have no pid below */
	_Atomic uint32_t forks;   /* forks begun, ever: an adopter's look saw
				   * them all if it did not move meanwhile */
	_Atomic int32_t pid[SV_SHARES_PIDS];
	_Atomic uint64_t ino;
	_Atomic bool taken; /* a claim the owner's helper has not seen yet */
	struct sv_share_redo redo; /* HANDED: written before the phase */
};

struct sv_shares {
	_Atomic int32_t owner;
	_Atomic uint32_t claims; /* claims made: the owner looks when it moved */
	struct slot slot[SV_SHARES_SLOTS];
};

static _Atomic(struct sv_shares *) own;
/* The claims counter of `own` as its helper last took them. */
static uint32_t claims_seen;

/* The tables a copy's reference may name: this process's own and those
 * its ancestors made before they forked it, each with its owner's wake
 * fd (an own fd every descendant inherits). Kept in the process's own
 * memory, which a fork copies: the tables are writable by the whole
 * family, and a number read from them is nobody's word. A process that
 * changes credentials leaves every table but its own (their references
 * then read lost). Past this depth of owners, a new owner makes no table
 * (its connection goes back to TCP at the fork, as without one). */
#define SV_SHARES_KNOWN 16u
static struct known {
	_Atomic(struct sv_shares *) t;
	atomic_int wake_fd1; /* the fd + 1: 0, none (yet) */
} known[SV_SHARES_KNOWN];

static struct known *known_of(const struct sv_shares *t)
{
	for (unsigned i = 0; t && i < SV_SHARES_KNOWN; i++)
		if (atomic_load(&known[i].t) == t)
			return &known[i];
	return NULL;
}

/* A free place in known[] for the table being made, claimed with its fd. */
static struct known *known_add(struct sv_shares *t, int fd)
{
	for (unsigned i = 0; i < SV_SHARES_KNOWN; i++) {
		struct sv_shares *none = NULL;
		if (atomic_compare_exchange_strong(&known[i].t, &none, t)) {
			atomic_store(&known[i].wake_fd1, fd + 1);
			return &known[i];
		}
	}
	return NULL;
}

static void known_drop(struct known *k)
{
	int fd = atomic_exchange(&k->wake_fd1, 0) - 1;
	if (fd >= 0)
		sv_ownfd_close(fd);
	atomic_store(&k->t, NULL);
}

static struct sv_shares *make_table(int wake_fd)
{
	int fd = sv_ownfd_dup(wake_fd);
	if (fd < 0)
		return NULL;
	/* Shared with every descendant through the fork, never unmapped: a
	 * copy's entry may be looked at until its holder ends. */
	void *m = mmap(NULL, sizeof(struct sv_shares), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		sv_ownfd_close(fd);
		return NULL;
	}
	struct sv_shares *t = m;
	atomic_store(&t->owner, (int32_t)getpid());
	if (!known_add(t, fd)) {
		sv_ownfd_close(fd);
		munmap(m, sizeof(struct sv_shares));
		return NULL;
	}
	return t;
}

struct sv_shares *sv_shares_own(int wake_fd)
{
	struct sv_shares *t = atomic_load_explicit(&own, memory_order_acquire);
	if (t || wake_fd < 0)
		return t;
	struct sv_shares *made = make_table(wake_fd);
	if (!made)
		return NULL;
	struct sv_shares *expected = NULL;
	if (!atomic_compare_exchange_strong(&own, &expected, made)) {
		/* Another thread was first: ours goes unused (never by a fork,
		 * which waits for every call before it). */
		known_drop(known_of(made));
		munmap(made, sizeof(*made));
		return expected;
	}
	return made;
}

int sv_shares_leave_family(void)
{
	int r = 0;
	struct sv_shares *mine = atomic_load(&own);
	for (unsigned i = 0; i < SV_SHARES_KNOWN; i++) {
		struct sv_shares *t = atomic_load(&known[i].t);
		if (!t || t == mine)
			continue;
		/* In place: a reference to it stays a valid address, and
		 * reads zeros, which known_of() no longer names. */
		if (mmap(t, sizeof(*t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
			 -1, 0) == MAP_FAILED) {
			r = -errno;
			continue;
		}
		known_drop(&known[i]);
	}
	return r;
}

static bool slot_others_hold(struct slot *sl);

int sv_shares_keep(struct sv_shares *t, uint64_t ino, struct sv_share_ref *out)
{
	for (unsigned i = 0; i < SV_SHARES_SLOTS; i++) {
		struct slot *sl = &t->slot[i];
		uint32_t st = atomic_load(&sl->state);
		/* A released entry is free once its claimers were woken: they
		 * compare generations, and a new one reads as released. A lost
		 * one must go on reading lost as long as a copy is held. */
		if (PHASE(st) != PH_FREE && PHASE(st) != PH_RELEASED &&
		    ((PHASE(st) != PH_LOST && PHASE(st) != PH_HANDED) || slot_others_hold(sl)))
			continue;
		atomic_store(&sl->pending, 0);
		atomic_store(&sl->unlisted, 0);
		for (int k = 0; k < SV_SHARES_PIDS; k++)
			atomic_store(&sl->pid[k], 0);
		atomic_store(&sl->ino, ino);
		atomic_store(&sl->taken, false);
		uint32_t gen = GEN(st) + 1;
		atomic_store(&sl->state, MAKE(gen, PH_KEPT));
		*out = (struct sv_share_ref){.t = t, .slot = (int)i, .gen = GEN(MAKE(gen, 0))};
		return 0;
	}
	return -ENOSPC;
}

static struct slot *slot_of(const struct sv_share_ref *r)
{
	return r && r->t && r->slot >= 0 && (unsigned)r->slot < SV_SHARES_SLOTS
		       ? &r->t->slot[r->slot]
		       : NULL;
}

/* Is the entry still r's connection (not settled and reused)? */
static bool current(const struct slot *sl, const struct sv_share_ref *r, uint32_t *st)
{
	*st = atomic_load(&((struct slot *)sl)->state);
	return GEN(*st) == r->gen;
}

/* A settled entry's copies need not be followed: they claim at once. */
static bool open_entry(struct slot *sl, const struct sv_share_ref *r)
{
	uint32_t st;
	return current(sl, r, &st) &&
	       (PHASE(st) == PH_KEPT || PHASE(st) == PH_CLAIMED || PHASE(st) == PH_SHARED ||
		PHASE(st) == PH_HANDED);
}

bool sv_shares_fork_begin(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	if (!sl || !open_entry(sl, r))
		return false;
	atomic_fetch_add(&sl->forks, 1);
	atomic_fetch_add(&sl->pending, 1);
	return true;
}

void sv_shares_fork_end(const struct sv_share_ref *r, pid_t child)
{
	struct slot *sl = slot_of(r);
	if (!sl)
		return;
	if (child > 0) {
		bool listed = false;
		for (int k = 0; k < SV_SHARES_PIDS && !listed; k++) {
			int32_t zero = 0;
			listed = atomic_compare_exchange_strong(&sl->pid[k], &zero, (int32_t)child);
		}
		if (!listed)
			atomic_fetch_add(&sl->unlisted, 1);
	}
	atomic_fetch_sub(&sl->pending, 1);
}

uint32_t sv_shares_forks(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	return sl ? atomic_load(&sl->forks) : 0;
}

bool sv_shares_claimed(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	return sl && current(sl, r, &st) && PHASE(st) == PH_CLAIMED;
}

bool sv_shares_others_hold(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	return sl && current(sl, r, &st) && slot_others_hold(sl);
}

static bool slot_others_hold(struct slot *sl)
{
	if (atomic_load(&sl->pending) || atomic_load(&sl->unlisted))
		return true;
	uint64_t ino = atomic_load(&sl->ino);
	bool any = false;
	for (int k = 0; k < SV_SHARES_PIDS; k++) {
		int32_t pid = atomic_load(&sl->pid[k]);
		if (pid <= 0)
			continue;
		if (sv_pid_holds(pid, ino))
			any = true;
		else
			atomic_compare_exchange_strong(&sl->pid[k], &pid, 0);
	}
	return any;
}

static void futex_wake_all(_Atomic uint32_t *w)
{
	sv_real_syscall()(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void move_to(const struct sv_share_ref *r, uint32_t ph)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	if (!sl || !current(sl, r, &st))
		return;
	while (PHASE(st) == PH_KEPT || PHASE(st) == PH_CLAIMED || PHASE(st) == PH_SHARED) {
		if (atomic_compare_exchange_weak(&sl->state, &st, MAKE(r->gen, ph)))
			break;
	}
	futex_wake_all(&sl->state);
}

void sv_shares_settle(const struct sv_share_ref *r, bool lost)
{
	move_to(r, lost ? PH_LOST : PH_RELEASED);
}

void sv_shares_share(const struct sv_share_ref *r)
{
	move_to(r, PH_SHARED);
}

void sv_shares_hand(const struct sv_share_ref *r, const struct sv_share_redo *redo)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	if (!sl || !current(sl, r, &st))
		return;
	sl->redo = *redo; /* the phase's store below publishes it */
	move_to(r, PH_HANDED);
}

bool sv_shares_handed(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	return sl && current(sl, r, &st) && PHASE(st) == PH_HANDED;
}

int sv_shares_adopt(const struct sv_share_ref *r, struct sv_share_redo *out)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	if (!sl || !current(sl, r, &st) || PHASE(st) != PH_HANDED)
		return -1;
	int32_t me = (int32_t)getpid();
	uint64_t ino = atomic_load(&sl->ino);
	/* A holder that forks during our look may list its child in a slot
	 * we looked at already, then close its own copy: the count of forks
	 * tells. (A holder forks only while it holds its copy, which our look
	 * at it then sees.) */
	uint32_t forks = atomic_load(&sl->forks);
	if (atomic_load(&sl->pending) || atomic_load(&sl->unlisted) ||
	    sv_pid_holds(atomic_load(&r->t->owner), ino) || sv_pid_fds(me, ino, 2) != 1)
		return 0;
	for (int k = 0; k < SV_SHARES_PIDS; k++) {
		int32_t pid = atomic_load(&sl->pid[k]);
		if (pid <= 0 || pid == me)
			continue;
		if (sv_pid_holds(pid, ino))
			return 0;
		atomic_compare_exchange_strong(&sl->pid[k], &pid, 0);
	}
	*out = sl->redo;
	/* One adopter. */
	if (atomic_load(&sl->pending) || atomic_load(&sl->unlisted) ||
	    atomic_load(&sl->forks) != forks ||
	    !atomic_compare_exchange_strong(&sl->state, &st, MAKE(r->gen, PH_RELEASED)))
		return 0;
	futex_wake_all(&sl->state);
	return 1;
}

void sv_shares_unlist(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	if (sl && current(sl, r, &st) && (PHASE(st) == PH_SHARED || PHASE(st) == PH_HANDED))
		atomic_fetch_add(&sl->unlisted, 1);
}

int sv_shares_take_claims(struct sv_shares *t, int *out, int max)
{
	/* The owner's helper alone calls it: every round, so it costs one
	 * load until a claim comes. */
	uint32_t now = t ? atomic_load(&t->claims) : claims_seen;
	if (now == claims_seen)
		return 0;
	int n = 0;
	for (unsigned i = 0; t && i < SV_SHARES_SLOTS && n < max; i++)
		if (atomic_load_explicit(&t->slot[i].taken, memory_order_relaxed) &&
		    atomic_exchange(&t->slot[i].taken, false))
			out[n++] = (int)i;
	if (n < max)
		claims_seen = now; /* every claim up to `now` was taken */
	return n;
}

static void wake_owner(struct sv_shares *t)
{
	struct known *k = known_of(t);
	int fd = k ? atomic_load(&k->wake_fd1) - 1 : -1;
	uint64_t one = 1;
	if (fd < 0)
		return;
	ssize_t w = SV_REAL(write)(fd, &one, sizeof(one));
	(void)w; /* a full counter wakes it all the same */
}

int sv_shares_claim(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	if (!sl)
		return 0;
	if (!known_of(r->t))
		return -ECONNRESET; /* a table this process left (its zeros read released) */
	pid_t owner = atomic_load(&r->t->owner);
	for (;;) {
		uint32_t st;
		if (!current(sl, r, &st))
			return 0; /* settled and reused: released first */
		switch (PHASE(st)) {
		case PH_FREE:
		case PH_RELEASED:
			return 0;
		case PH_SHARED:
		case PH_HANDED:
			return 1;
		case PH_LOST:
			return -ECONNRESET;
		case PH_KEPT:
			if (atomic_compare_exchange_strong(&sl->state, &st,
							   MAKE(r->gen, PH_CLAIMED))) {
				atomic_store(&sl->taken, true);
				atomic_fetch_add(&r->t->claims, 1);
				wake_owner(r->t);
			}
			continue;
		default:
			break;
		}
		if ((kill(owner, 0) < 0 && errno == ESRCH) || sv_pid_zombie(owner))
			return -ECONNRESET;
		/* Claimed: sleep until the owner settles it, looking now and
		 * then whether it still lives. */
		struct timespec ts = {0, 100 * 1000 * 1000};
		sv_real_syscall()(SYS_futex, (uint32_t *)&sl->state, FUTEX_WAIT, st, &ts, NULL, 0);
	}
}

void sv_shares_left(const struct sv_share_ref *r)
{
	struct slot *sl = slot_of(r);
	uint32_t st;
	if (!sl || !current(sl, r, &st))
		return;
	int32_t me = (int32_t)getpid();
	for (int k = 0; k < SV_SHARES_PIDS; k++) {
		int32_t pid = me;
		if (atomic_compare_exchange_strong(&sl->pid[k], &pid, 0))
			return;
	}
}

void sv_shares_atfork_child(void)
{
	atomic_store(&own, NULL);
	claims_seen = 0; /* the child's own table counts from 0 */
}
