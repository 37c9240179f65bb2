/* Copies of a connection across fork, exec and fd passing (docs/design.md,
 * "Copies of a connection"): what the interposer asks of them. The
 * module's state is its own (share_int.h); the stream hears of it only
 * through the events it gives (stream.h, struct sv_stream_copies). */
#ifndef SV_SHARE_H
#define SV_SHARE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct sv_hand;
struct sv_kcalls;
struct sv_listener;
struct sv_share_redo;
struct sv_share_ref;
struct sv_stream;

/* The module's start: the stream (and below it the upgrade) starts too,
 * the stream's events come here, the helper runs the copies' work at each
 * of its rounds, and a request for a connection back on TCP here revives
 * it. Once, before any connection (again: nothing). */
void sv_share_init(void);
/* In a fork's child: the parent's copies' state is the parent's; the
 * modules below forget theirs too. */
void sv_share_atfork_child(void);

/* ---- fork ------------------------------------------------------------------------- */

/* Before a fork: take s back to plain TCP for the child, except where the
 * copies let the parent keep it: a connection settled on RDMA is kept on
 * the parent's QP (SOVIA_FORK_KEEP, a kernel that copies pinned pages at a
 * fork; shares.h), a client's back on TCP is shared with the child and
 * followed, and a server's connection whose upgrade has not begun, or
 * that is back on TCP with known counts, is handed to the child
 * (holders.h), which may take it to RDMA once it holds it alone: *hand
 * says so (hand->h NULL otherwise), with the bytes TCP carried each way.
 * 1: the fd stays the stream's (kept, or shared); 0: it is the kernel's
 * now; -errno as sv_stream_detach. */
int sv_share_detach_for_fork(struct sv_stream *s, struct sv_hand *hand, uint64_t *tx,
			     uint64_t *rx);
/* The keep alone (sv_share_detach_for_fork's first step): true when s is
 * kept, with a copy about to be given. */
bool sv_share_keep_for_fork(struct sv_stream *s);
/* After that fork, in the parent: its outcome (the child's pid, or -1). */
void sv_share_forked(struct sv_stream *s, pid_t pid);
/* In the fork's child, for each of s's fds: true when the fork kept s,
 * whose copy here is then *ref's (the parent's entry). */
bool sv_share_kept_for_child(struct sv_stream *s, struct sv_share_ref *ref);

/* ---- adopt: the child of an accept-then-fork server -------------------------------- */

/* In the fork's child: a server stream on fd for the connection handed to
 * it, TCP having carried tx and rx bytes. Its upgrade starts at its first
 * use (sv_share_start_at_first_use). NULL on ENOMEM. */
struct sv_stream *sv_share_adopt(int fd, const struct sv_hand *hand, uint64_t tx, uint64_t rx);
/* The first use of a stream whose upgrade waits for it
 * (sv_stream_start_pending): an adopted server's, or a client's an exec'd
 * image continues; so a child that only execs or closes it starts no
 * helper nor rdma_cm. */
void sv_share_start_at_first_use(struct sv_stream *s);

/* ---- exec ---------------------------------------------------------------------------- */

/* A copy of adopted stream s goes on fd 0, 1 or 2 (inetd's child before
 * its exec), where glibc's stdio reads and writes past the interposer.
 * True when s may take it: handed to us and untouched, it then never
 * upgrades in this image, and only an exec hands it on
 * (sv_share_exec_hand). False: it must go back to plain TCP. */
bool sv_share_expose_std(struct sv_stream *s);
/* An exec keeps an fd of s: true when s can be handed on to the new image
 * (an adopted connection still untouched, nothing of ours in it), with
 * *hand its entry in the holders' table. The kernel's counts say what TCP
 * carried (sv_tcp_app_counts); the new image adopts it. */
bool sv_share_exec_hand(struct sv_stream *s, struct sv_hand *hand);
/* The process changed its user or group ids and leaves the holders'
 * table (sv_holders_leave_family): a hand of s's is spoiled first, so that
 * the family's port owner sends no client to it and the adopter, if any,
 * stops waiting (the connection stays on TCP). */
void sv_share_leave_family(struct sv_stream *s);
/* A client connection back on plain TCP (sv_stream_detach) that an exec'd
 * image may continue: no other process holds it, nothing of ours in it,
 * its offsets known (*dtx, *drx: what they exceed the kernel's counts by,
 * each way). The caller sees that one fd of the application's survives
 * the exec. */
bool sv_share_exec_client(struct sv_stream *s, uint64_t *dtx, uint64_t *drx);
/* An exec replaces the image: every kept connection is let go (its copies
 * get it back on plain TCP). */
void sv_share_exec_all(void);

/* ---- use of a handed copy, and revive: a second life ------------------------------- */

/* A connection back on plain TCP (the way back) whose application holds
 * one fd for it may move to RDMA again, as a new stream that takes that
 * fd: when this process holds it alone again after a fork's child used it
 * (keep.c), or a server's when its client asks again. The interposer makes
 * it (the hook, true when it did): the fd's entry becomes the stream
 * sv_share_successor gives, started with sv_stream_start_revived (l: the
 * listener a request came to; NULL for a client). sv_share_revive: 1 when
 * it did; 0: not now (a fork's child of ours may still hold it, and we
 * look again, or it is on its way back), ask again; -1: it cannot. */
typedef bool (*sv_revive_fn)(struct sv_stream *s, int fd, struct sv_listener *l);
void sv_share_set_revive(sv_revive_fn fn);
int sv_share_revive(struct sv_stream *s, struct sv_listener *l);
/* s's successor, or NULL (s cannot have one: not back on TCP with its
 * counts known, closed, dup'd, or it has one already): a new stream for
 * s's fd. `entry` is the fd's entry for s, a reference the successor
 * keeps (dropped with put) until its switch is over, asking `idle` whether
 * a call is under way on it. Once the successor is the fd's entry,
 * sv_share_successor_took: the calls that reach s from then on go on to
 * it. */
struct sv_stream *sv_share_successor(struct sv_stream *s, void *entry, bool (*idle)(void *),
				     void (*put)(void *));
void sv_share_successor_took(struct sv_stream *s, struct sv_stream *n);
/* A fork's child holds alone a connection its parent handed to the copies
 * (sv_shares_adopt): a new stream for fd, from where the connection stood
 * then (redo), in the parent's role. `entry`, `idle`, `put` as for
 * sv_share_successor; kc: the entry's kernel calls. NULL on ENOMEM, or
 * for a server's end without a holders' table. */
struct sv_stream *sv_share_adopted(int fd, const struct sv_share_redo *redo, void *entry,
				   bool (*idle)(void *), void (*put)(void *),
				   struct sv_kcalls *kc);
/* s gets no successor, and is not handed to a fork's children: the
 * application has another fd for its socket, which libsovia does not
 * follow (a dup of a connection back on TCP), or its fd became the
 * kernel's (a hand-over: exec, spawn, SCM_RIGHTS, ...; a fork that took
 * it back first). */
void sv_share_unpark(struct sv_stream *s);

#endif
