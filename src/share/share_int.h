/* The share module's state, private to src/share: what a connection's
 * copies across fork, exec and fd passing need to know of it. The stream
 * holds one pointer to it (made by the `born` event) and speaks to it
 * only through its events (stream.h, struct sv_stream_copies); this
 * module reads and moves the stream through stream.h's calls for it.
 *
 * Locking: a connection's sv_share is read and changed under its
 * stream's lock (sv_stream_lock), but for the atomics, read without it. */
#ifndef SV_SHARE_INT_H
#define SV_SHARE_INT_H

#include "share.h"

#include "holders.h"
#include "shares.h"
#include "stream.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Kept across a fork on the parent's QP (keep.c, shares.h). */
struct sv_keep {
	struct sv_share_ref ref; /* .t NULL: not kept */
	unsigned forking;        /* forks under way that give a copy */
	bool claimed;            /* a copy's holder wants it: going back */
	bool shared;             /* back on TCP for the copies, which the entry
				  * still follows: alone again, we upgrade anew */
	bool letting_go;         /* our last close, exit or exec takes it back */
	bool alone;              /* shared, and no copy is held any more */
	/* A server's end handed on (.t NULL: not): while its entry waits
	 * for an adopter, its client's requests hear "later". */
	struct sv_share_ref handed;
};

/* A connection back on plain TCP may move to RDMA again, as a new stream
 * (redo.c): where each direction stood on TCP when our BACK went, and the
 * kernel's counts then (sv_tcp_app_counts). Every byte the socket carried
 * since is the stream's next, whichever process moved it. */
struct sv_redo {
	bool ok;            /* the counts below are known */
	bool peer_first;    /* the peer's BACK came before ours: it went back
			     * (a fork's child of its used its copy), and its
			     * end may move to RDMA again: a client asks */
	uint64_t tx, rx;    /* stream offsets where TCP took over */
	uint64_t ktx, krx;  /* the kernel's counts at our BACK */
};

/* A stream made from one back on TCP, its predecessor: its counts are
 * taken, and its upgrade goes on, only once no data call of the
 * predecessor's is in the kernel (such a read could take a switch's echo
 * for data). Calls that reach the predecessor later go on to its
 * successor. A poll or select that began on the predecessor's fd entry
 * sleeps in the kernel: it must see the peer's bytes and echo arrive on
 * TCP, so nothing of ours reads them ahead (the pump) while one may
 * sleep there. Both are held until the switch is over (or the upgrade). */
struct sv_pred {
	struct sv_stream *s;        /* held until done */
	void *entry;                /* the preload layer's, held until done */
	bool (*idle)(void *entry);  /* no call of any kind under way on it */
	void (*put)(void *entry);
	struct sv_kcalls *kc;       /* the predecessor's (or the entry's) calls */
	void *node;                 /* to let them go later, without a lock */
	bool pending;               /* counts not taken yet */
};

/* Where a connection stands for a second life (redo.c). Every change goes
 * through sv_share_set_life, which checks it against its table. */
enum sv_life {
	SV_LIFE_NONE,      /* none in view: on its first way, or back on TCP
			    * where no successor can take it */
	SV_LIFE_GOING,     /* on its way back (our BACK went, not detached
			    * yet): a request for it hears "later" */
	SV_LIFE_PARKED,    /* back on TCP with known counts, on the
			    * application's one fd, a successor not made yet:
			    * a request (or we) may revive it */
	SV_LIFE_SUCCEEDED, /* a successor was made: a call of ours that wakes
			    * on plain TCP goes on through the kernel's
			    * branch, counted or passed to it */
	SV_LIFE_N
};

/* Whose the connection is, among the processes of a server's family
 * (holders.h). */
enum sv_hand_role {
	SV_HAND_NONE,    /* not handed */
	SV_HAND_GIVEN,   /* we handed it to a fork's child before the fork: the
			  * bytes we move spoil the hand */
	SV_HAND_ADOPTED, /* handed to us by our parent: hand is our entry */
};

struct sv_share {
	struct sv_stream *s;  /* whose: not a reference (the stream holds us) */
	struct sv_hand hand;
	_Atomic(enum sv_hand_role) role;
	/* A fork took it back to TCP (it may be handed to the child). */
	bool fork_back;
	/* A copy of it is on fd 0, 1 or 2 of this image, where glibc's stdio
	 * may move bytes past us: it never upgrades here; only an exec may
	 * hand it on (sv_share_expose_std). */
	bool std_exposed;
	struct sv_keep keep;
	struct sv_redo redo;
	struct sv_pred pred;
	_Atomic(enum sv_life) life; /* read without the lock */
};

/* The connection's share, or NULL (no copies module: never for a stream
 * made after sv_share_init). */
static inline struct sv_share *sv_share_of(struct sv_stream *s)
{
	return (struct sv_share *)sv_stream_copies_state(s);
}

/* Move the second life to `to` (a no-op when there already). A transition
 * the table does not allow is a bug: fatal in checked builds. With the
 * stream's lock. */
void sv_share_set_life(struct sv_share *c, enum sv_life to);
static inline enum sv_life sv_share_life(const struct sv_share *c)
{
	return atomic_load_explicit(&((struct sv_share *)c)->life, memory_order_acquire);
}

/* ---- keep.c: kept across a fork on our QP ------------------------------------------ */

/* The stream's state changed (with its lock). */
void sv_keep_state(struct sv_stream *s, struct sv_share *c, enum sv_conn_state to);
/* Its last reference is going (without the lock). */
void sv_keep_forget(struct sv_stream *s, struct sv_share *c);
/* The owner lets go: its last close, its exit (without the lock). */
void sv_keep_let_go(struct sv_stream *s, const char *why);
/* A client's connection the fork took back to TCP, shared with the child
 * (with the lock): true when the fd stays the stream's. */
bool sv_keep_share_for_fork(struct sv_stream *s, struct sv_share *c);
/* The helper's round: claims, and shared streams alone again. */
uint64_t sv_keep_service(uint64_t now);
void sv_keep_atfork_child(void);

/* ---- redo.c: a second life ---------------------------------------------------------- */

/* Our BACK went (peer_first: the peer's came first): the kernel's counts
 * now; plain TCP again: where each direction went on TCP. With the lock. */
void sv_redo_snapshot(struct sv_stream *s, struct sv_share *c, bool peer_first);
void sv_redo_detached(struct sv_stream *s, struct sv_share *c);
/* A successor may go on with its upgrade (its counts are taken). */
bool sv_redo_ready(struct sv_stream *s, struct sv_share *c);
bool sv_redo_pred_busy(const struct sv_share *c);
void sv_redo_pred_done(struct sv_share *c);
void sv_redo_pred_forget(struct sv_share *c);
/* The helper's round: asks and predecessors let go. */
void sv_redo_reap(void);
void sv_redo_atfork_child(void);
/* The request for (local, peer) that came to l found no accepted
 * connection: one back on TCP here revives (struct sv_upgrade_conns). */
int sv_redo_revive_parked(const struct sockaddr_storage *local,
			  const struct sockaddr_storage *peer, struct sv_listener *l);

/* ---- hand.c: handed to a fork's child, adopted, exec -------------------------------- */

/* Before a fork, a server's connection not upgraded yet: handed to the
 * child (with the lock): true when it was. */
bool sv_hand_before_upgrade(struct sv_stream *s, struct sv_share *c);
/* The connection's upgrade is called off: a hand of ours leaves the
 * holders' table. */
void sv_hand_called_off(struct sv_share *c);
/* Bytes this process moved on a connection it handed to a fork's child
 * (a call that was under way at the fork): the child's counts miss them,
 * so it must stay on TCP. */
void sv_hand_moved(struct sv_share *c);
enum sv_conn_holding sv_hand_holding(struct sv_share *c, struct sv_hand *hand);
/* Our entry is handed and another holder may still use it: a request
 * came too soon. */
bool sv_hand_others_hold(struct sv_share *c);

#endif
