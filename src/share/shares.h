/* Connections on RDMA that a fork's children hold copies of, while the
 * parent goes on carrying them over its QP (docs/design.md, "Copies of a
 * connection").
 *
 * With a kernel that copies pinned pages at a fork (libibverbs says
 * IBV_FORK_UNNEEDED), a fork needs no way back: the parent keeps its QP and
 * its buffers, and the child gets a copy of the socket it must not use as
 * long as the parent's QP carries the connection. Most children never use
 * it (a snapshot child, a helper that execs, a worker that closes what it
 * inherited). One that does first *claims* it: the owner takes the
 * connection back to plain TCP (BACK/RETURN), then both share an ordinary
 * socket. Until a claim, the owner's connection is as fast as before.
 *
 * The table is the owner's, in memory it shares with its descendants
 * (MAP_SHARED, made before its first such fork). Each entry is one kept
 * connection: its state word (generation and phase), the pids of the
 * other processes that got a copy, and forks under way. A claimer changes
 * the phase and wakes the owner's helper (an eventfd of the owner's that
 * every descendant inherits, its number kept in each process's own
 * memory), then sleeps on the state word (a futex)
 * until the owner released it, or died (the connection is then lost to
 * the copies: what the owner's QP brought is gone with it). */
#ifndef SV_SHARES_H
#define SV_SHARES_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct sv_shares;

/* More kept connections at once than this go back to TCP at the fork. */
#define SV_SHARES_SLOTS 1024u

/* Where a connection handed to the copies stands (sv_shares_hand): the
 * stream offsets where TCP took over from the owner's QP, and the
 * kernel's counts of the socket then (redo.c). */
struct sv_share_redo {
	uint64_t tx, rx;
	uint64_t ktx, krx;
	bool server; /* the owner's end was the server's: its adopter
		      * listens for the client's request (holders.h) */
};

/* One kept connection, as each process names it. */
struct sv_share_ref {
	struct sv_shares *t; /* NULL: none */
	int slot;
	uint32_t gen;
};

/* ---- The owner ------------------------------------------------------------------ */

/* The process's own table, made at the first call; wake_fd is the fd a
 * claim writes to (the owner's helper wakes on it; the table keeps its
 * own copy). NULL when it cannot be had: the caller then takes the
 * connection back to TCP before the fork, as without the table. */
struct sv_shares *sv_shares_own(int wake_fd);
/* The process changed its user or group ids (preload/creds.c): it leaves
 * every table but its own, which its ancestors made, replacing each in
 * place by private zeros. A claim through a reference into one is then
 * -ECONNRESET: its caller claims first what it holds. Its own table stays:
 * its entries are its connections, which it could spoil anyway, and its
 * descendants trust nothing in it but the phases of their claims. 0, or
 * -errno: a table could not be left (it is still shared). */
int sv_shares_leave_family(void);
/* Enter a connection whose socket's inode is ino as kept by this process.
 * 0, or -ENOSPC when the table is full. */
int sv_shares_keep(struct sv_shares *t, uint64_t ino, struct sv_share_ref *out);
/* A fork is about to give a copy (any process that holds the connection,
 * owner or not); then, only when this said true, its outcome: the child's
 * pid, or -1 when the fork failed. Between the two the copy counts as
 * held. False: the entry is settled already (nothing to follow). */
bool sv_shares_fork_begin(const struct sv_share_ref *r);
void sv_shares_fork_end(const struct sv_share_ref *r, pid_t child);
/* Forks begun on the entry, ever: a look at its holders (the next call)
 * saw them all if this did not move meanwhile. */
uint32_t sv_shares_forks(const struct sv_share_ref *r);
/* Has a copy's holder claimed it (the owner must release it)? */
bool sv_shares_claimed(const struct sv_share_ref *r);
/* Does any process but the owner still hold a copy of the socket (a fork
 * under way, a listed pid that is alive and has the socket open, or more
 * copies than the entry lists)? When none does, the owner may end the
 * connection as its own. */
bool sv_shares_others_hold(const struct sv_share_ref *r);
/* The owner is done with it: released (the kernel's socket carries all of
 * it, nothing is held), or lost (the owner could not give it back). Wakes
 * the claimers; the entry is free for another connection. */
void sv_shares_settle(const struct sv_share_ref *r, bool lost);
/* Released to the copies as sv_shares_settle does, but the entry stays
 * the owner's: the copies' forks are still followed, so that the owner
 * learns when it holds the connection alone again
 * (sv_shares_others_hold), then settles it. */
void sv_shares_share(const struct sv_share_ref *r);
/* The owner lets go of a connection it released to the copies, a client
 * whose counts are known: as sv_shares_share, the copies' forks are still
 * followed, until one holder of a copy, alone, takes it to RDMA again
 * (sv_shares_adopt). The entry is no longer the owner's to settle. */
void sv_shares_hand(const struct sv_share_ref *r, const struct sv_share_redo *redo);
/* The entries claimed since the last call (each at most once per call),
 * for the owner's helper: up to max slots into out; returns how many. */
int sv_shares_take_claims(struct sv_shares *t, int *out, int max);

/* ---- A copy's holder (a descendant) ----------------------------------------------- */

/* Block until the owner released the connection, whose kernel's socket
 * then carries all of it: 0; 1 when the owner still follows the copies
 * (sv_shares_share) or handed it on (sv_shares_hand), and this one stays
 * listed while it is held;
 * -ECONNRESET when it was lost (the owner died, or could not give it
 * back). Not interrupted by signals. */
int sv_shares_claim(const struct sv_share_ref *r);
/* Handed (sv_shares_hand), not adopted yet? One load. */
bool sv_shares_handed(const struct sv_share_ref *r);
/* A handed connection whose only holder is this process, on one fd, is
 * this process's now: 1, with its counts; 0: another process (the owner
 * too) or another fd of ours holds it, or a fork is under way (ask again
 * later); -1: not handed. Reads /proc: not for a signal handler. */
int sv_shares_adopt(const struct sv_share_ref *r, struct sv_share_redo *out);
/* A copy released that way is passed on where its holder cannot be
 * followed (spawn, SCM_RIGHTS, ...): the owner is never alone again. */
void sv_shares_unlist(const struct sv_share_ref *r);
/* This process closed its copy (its last fd for it). */
void sv_shares_left(const struct sv_share_ref *r);

/* In a fork's child: the parent's table stays mapped (its copies' entries
 * refer to it), and the child's own table is made afresh if it needs one. */
void sv_shares_atfork_child(void);

#endif
