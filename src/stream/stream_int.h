/* The stream's state, private to its files: src/stream/stream*.c, its
 * rdma_cm half (stream_cm.c, stream_ask.c, stream_accept.c) included.
 * Every function here is called with s->lock held unless it says
 * otherwise.
 *
 * Locking: `lock` serialises everything in the stream, the protocol core
 * and the queue pair included. Nobody sleeps holding it: waits drop it and
 * sleep in poll() on the completion channel, the TCP socket and the wake
 * eventfd. The lock order is in docs/design.md ("Locks"). */
#ifndef SV_STREAM_INT_H
#define SV_STREAM_INT_H

#include "stream.h"

#include "bytebuf.h"
#include "clock.h"
#include "holders.h"
#include "hub.h"
#include "lock.h"
#include "proto.h"
#include "qp.h"
#include "upgrade.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct rdma_cm_id;
struct rdma_cm_event;
struct rdma_conn_param;

/* ---- State ---------------------------------------------------------------- */

/* Move to state `to` (a no-op when already there). A transition the table
 * does not allow is a bug: fatal in checked builds (SOVIA_CHECKS). */
void sv_stream_set_state(struct sv_stream *s, enum sv_conn_state to);
/* Is an upgrade or a switch still possible, so TCP reads must watch for a
 * TO_RDMA? */
bool sv_stream_may_switch(const struct sv_stream *s);
/* TCP carries both directions for good and nothing of ours is in between:
 * fallback with no QP part, or back from the way back. */
bool sv_stream_tcp_for_good(const struct sv_stream *s);
/* ... and nothing read ahead is held either: then remember it
 * (kernel_only, sv_stream_kernel_only_seen). Where a call looks at the
 * stream, never in the middle of a change. */
void sv_stream_note_kernel_only(struct sv_stream *s);

/* Where a direction's next bytes go (or come from). Derived here and only
 * here, from the state, the core and the switch. */
enum sv_medium {
	SV_MEDIUM_KERNEL, /* TCP for good: the kernel's own call, blocking as it likes */
	SV_MEDIUM_TCP,    /* TCP, through libsovia (a switch may come: watched) */
	SV_MEDIUM_HELD,   /* sending waits: the peer has not proven itself yet,
			   * or the bytes given back go first */
	SV_MEDIUM_QP,     /* the queue pair, through the core */
};
enum sv_medium sv_stream_rx_medium(const struct sv_stream *s);
enum sv_medium sv_stream_tx_medium(const struct sv_stream *s);

/* ---- The stream ------------------------------------------------------------- */

/* The four-tuple, seen from this end. */
struct sv_tuple {
	struct sockaddr_storage local, peer;
};

/* The upgrade and its switch (docs/protocol.md, section 3). */
struct sv_switch {
	uint8_t my_challenge[SV_CHALLENGE_SIZE];   /* the peer must echo it on TCP */
	uint8_t peer_challenge[SV_CHALLENGE_SIZE]; /* we echo it on TCP */
	uint8_t chal_got[SV_CHALLENGE_SIZE];       /* the peer's echo as read from TCP */
	uint32_t chal_len;   /* bytes of it read */
	uint32_t echo_sent;  /* bytes of our echo written */
	bool echo_owed;      /* our echo goes on TCP once our TO_RDMA completed */
	bool tx_held;        /* client: TO_RDMA sent; our data waits until the
			      * server proved itself */
	bool qp_lost;        /* the QP died while the peer's switch waited for
			      * its echo: a real echo ends it on TCP */
	bool point_near;     /* point_seq, a switch point the peer announced, was
			      * found within what TCP can hold
			      * (sv_stream_switch_point_ok) */
	uint64_t point_seq;
};

/* The upgrade's request and its retries (stream_ask.c, stream_accept.c;
 * docs/protocol.md, section 3, steps 1 to 3). */
struct sv_asking {
	uint64_t deadline_us; /* the upgrade gives up at this time */
	uint64_t upgrade_at;  /* client: when the helper starts the upgrade
			       * (SOVIA_UPGRADE_DELAY_MS, or a retry after "no
			       * listener"); 0: not waiting */
	uint8_t connect_retries; /* client: requests asked again after "no listener" */
	uint8_t later_retries;   /* client: asked again after "later" */
	uint16_t redirect_port;  /* client: the server's RDMA port to ask at instead
				  * of the TCP one (SV_CM_REJ_REDIRECT), 0: none */
	bool at_warden;          /* client: this request went to the server host's
				  * sovia-warden (warden.h) */
	bool no_warden;          /* client: the server's host has none: asked at
				  * the server's port */
	/* Its buffers (these bytes) did not fit the locked-memory budget
	 * (pinned.h): it asks again when some is given back, until
	 * deadline_us; then it stays on TCP with fallback "memlock". The
	 * client waits with its route resolved, the server with the request
	 * unanswered. 0: not waiting. */
	size_t room_wait;
	/* Server: until then a request waits for the application's first
	 * use of the connection (stream_accept.c). */
	uint64_t use_wait_until;
	bool use_wait_told; /* a request waited for it (logged once) */
	/* Client: its non-blocking connect() was in progress when the stream
	 * was made. The connection is plain TCP meanwhile (bytes may move);
	 * the helper schedules the upgrade once the connect is done. */
	bool connect_pending;
};

/* Our first writes held for the QP (stream_switch.c). */
struct sv_hold {
	/* The peer's host is known to speak libsovia (peers.h): our first
	 * writes wait for the QP until this time rather than go on TCP
	 * (0: no hold). Only while nothing of ours went on TCP. */
	uint64_t until;
	/* What a hold lasts (until's distance from its start), and the
	 * latest it may end (SOVIA_PEER_HOLD_MS from its start): a hold whose
	 * peer could not ask yet is moved on by that span (sv_stream_end_hold,
	 * sv_stream_hold_past). */
	uint64_t span_us, cap_at;
	/* Server: that hold is a first contact's (an unknown client on an
	 * RDMA link): if no request came in it, the client is plain. */
	bool first_contact;
	/* A write was refused (EAGAIN) or waited for that hold: from then on
	 * poll says "not writable" until it ends. Until then the kernel
	 * answers, so that a program that polls for POLLOUT to learn that its
	 * non-blocking connect completed is told at once. */
	bool refused;
};

/* Waiting: what a wait and the readiness calls share with other threads
 * (the atomics are read without the lock). */
struct sv_waiting {
	/* Who to wake when the stream changes or its CQ fires: the threads
	 * asleep on it, the epoll sets and the helper watching it (hub.h). */
	struct sv_hub_node node;
	unsigned waiters;    /* threads asleep on this stream */
	uint64_t wake_gen;   /* counts sv_stream_wake: changes a poll must not miss */
	/* How long the application's waits lasted lately (a moving average,
	 * microseconds): it sizes the spin (spin.h). */
	atomic_uint wait_avg_us;
	/* Writes that moved bytes, and their count at the last read that
	 * returned bytes: a wait with no write since that read is a reader's,
	 * not a wait for a reply (sv_spin_reader). */
	atomic_uint writes, writes_seen;
	/* The fd was in blocking mode when last looked at (fcntl F_GETFL).
	 * Only "blocking" is remembered: a wait checks it again before it
	 * sleeps in the kernel, so a mode changed behind our back costs at
	 * most a spin. */
	atomic_bool seen_blocking;
	/* Receive and send calls that returned EAGAIN (epoll's edge rules,
	 * readiness.h). */
	atomic_uint_least64_t rx_eagain, tx_eagain;
	/* The application's calls that may poll the CQ, and their count when
	 * the helper last looked (the helper's watch policy). */
	uint64_t app_calls, helper_seen;
	/* Writes that found a coalesced buffer and did not look at its timer
	 * (SV_PROGRESS_SEND). */
	uint32_t tx_unclocked;
};

/* Closing and shutting down. */
struct sv_closing {
	bool app_closed;     /* the application closed its last fd; the helper lingers */
	bool tx_shut;        /* shutdown(SHUT_WR) done */
	bool shut_deferred;  /* TCP's shutdown waits until TCP can carry no more of ours */
	uint64_t linger_deadline_us;
	uint64_t back_deadline_us; /* detaching: the peer has given back all by then */
	bool low_fd;         /* lingering on an fd of the application's range */
};

/* How long a peer that must answer (its resume record, its BACK and the
 * bytes it gives back) may stay silent before its connection is given
 * up: long enough for a stopped process that is continued, finite for one
 * that never answers. TCP's own flow control is not silence. */
#define SV_PEER_SILENCE_US 60000000u

/* Resuming over TCP after the QP is lost (docs/protocol.md, section 11). */
#define SV_RESUME_SIZE 24
struct sv_resume {
	enum sv_failover cause; /* SV_FO_NONE: never lost */
	uint8_t out[SV_RESUME_SIZE]; /* our record */
	uint32_t out_sent;
	uint8_t in[SV_RESUME_SIZE];  /* the peer's, as read */
	uint32_t in_got;
	bool fin;            /* our sending had ended (FIN): TCP ends after the owed bytes */
	bool tcp_ended;      /* on RDMA: TCP said end or error; it is not watched
			      * for a record any more */
	int tcp_error;       /* ... the error it said (-errno), 0: none */
	bool started;        /* the exchange began (sv_stream_resume_start) */
	bool announce_due;   /* the QP's normal end with our sending open: our
			      * record goes before our next TCP byte, or in
			      * answer to the peer's */
	bool announced;      /* our record went after the QP's normal end */
	bool fin_owed;       /* ... with our FIN in flight: TCP's FIN follows
			      * our record (sv_proto_fin_unsure) */
	uint64_t deadline_us;
	int outcome;         /* 0 while resuming or resumed; -errno when it failed */
};

/* Socket options that shape the protocol or the waits. */
struct sv_options {
	bool nodelay, cork;
	uint64_t rcvtimeo_us, sndtimeo_us; /* SO_RCVTIMEO, SO_SNDTIMEO (0: none) */
};

struct sv_stream_stats {
	uint64_t tcp_tx_bytes, tcp_rx_bytes; /* application bytes over TCP */
	uint64_t qp_taken; /* application bytes the core took to send (SIOCOUTQ) */
	uint64_t switches_to_rdma, switches_to_tcp;
	/* The application's blocking waits in libsovia: ended by the spin, or
	 * slept and then woken by the completion channel, a kick
	 * (sv_stream_wake) or the timeout; and the helper's looks that took
	 * completions itself. They tell why a connection runs slow. */
	uint64_t waits_spun, waits_slept, slept_us, slept_max_us;
	uint64_t woken_chan, woken_kick, woken_timeout, helper_polls;
	uint64_t helper_looks; /* the helper's looks of any kind */
	/* When the connection was made (connect or accept), and how long
	 * after that its first application byte went on, or came off, the QP
	 * (0: none yet). */
	uint64_t born_us, to_rdma_us;
	bool printed; /* its SOVIA_STATS line went out */
};

struct sv_stream {
	struct sv_lock lock;
	atomic_int refs;
	int fd;              /* the kernel TCP socket */
	bool fd_private;     /* fd is libsovia's own copy (dup, lingering close) */
	unsigned opens;      /* the application's fds for this stream (dup) */
	bool is_client;
	enum sv_conn_state state;
	enum sv_fallback fallback;
	const char *unserved; /* fallback unsupported-call: the call's name */
	struct sv_tuple tuple;
	int error;           /* -errno once broken */
	bool error_told;     /* the application was given `error` once */

	/* Server: the holders' table of the listener family that accepted
	 * it (holders.h; NULL: none). */
	struct sv_holders *holders;
	atomic_bool app_used;      /* sv_stream_app_uses */
	/* Its upgrade starts at its first use (sv_stream_start_at_use). */
	atomic_bool start_pending;
	/* A second life: its offsets continue a connection that went back
	 * to TCP (its predecessor's, or its parent's). */
	bool revived;
	/* Its copies across fork, exec and fd passing: src/share's own,
	 * spoken to through its events only (sv_stream_copies; NULL: none). */
	struct sv_share *share;
	/* The application's fd for it became the kernel's (a dup, a
	 * hand-over, a fork that took it back): a process nobody follows may
	 * hold it. */
	bool escaped;
	/* Our BACK goes as soon as it may (a fork's child claimed its copy). */
	bool back_wanted;

	/* The media. tcp_tx and tcp_rx count each direction's bytes TCP
	 * carried; with the core's offsets they give every switch point. */
	uint64_t tcp_tx, tcp_rx;
	struct rdma_cm_id *id;
	struct sv_qp *qp;        /* once the upgrade made one */
	struct sv_proto *proto;  /* the core on it */
	size_t pinned;           /* the QP's buffers' share of the budget (pinned.h) */
	/* The peer's TCP bytes read before the application asked for them
	 * (the pump, or a failed challenge's would-be echo). */
	struct sv_bytebuf tcpbuf;

	struct sv_switch sw;
	struct sv_asking up;
	struct sv_hold hold;
	struct sv_waiting wt;
	struct sv_closing cl;
	struct sv_resume fo;
	struct sv_options opt;
	/* Our calls in the kernel, and the stream that took the
	 * application's fd over (a successor: src/share/redo.c). */
	struct sv_kcalls kc;
	struct sv_watch *watch; /* the helper's, under its lock */

	/* A call saw it TCP for good with nothing held, which it stays
	 * (sv_stream_note_kernel_only): read without the lock. */
	atomic_bool kernel_only;
	struct sv_stream_stats st;
	/* Every live stream, under stream.c's list lock. */
	struct {
		struct sv_stream *next;
		bool exit_listed; /* taken by the exit flush */
	} all;
};



/* ---- Waiting (stream_wait.c) --------------------------------------------------- */

/* Wake every thread sleeping on this stream, and move the mark a poll
 * compares (wake_gen). */
void sv_stream_wake(struct sv_stream *s);
/* Is the fd in blocking mode for this call? As last seen: no fcntl for a
 * blocking fd's calls (the waits check again before they sleep). */
bool sv_stream_blocking(struct sv_stream *s, int flags);

/* sv_stream_wait's flags. */
enum {
	SV_WAIT_APP = 1, /* the application's own blocking call: before sleeping
			  * in the kernel, check that the fd is still blocking
			  * (else -EAGAIN) */
};
/* Wait until a completion, TCP readiness (tcp_events), a wake-up or the
 * deadline (0 = none). Without tcp_events it first spins on the CQ for
 * sv_stream_spin_us. Lets go of the lock while it spins or sleeps. The
 * clock is read if unread; on return it holds the time the wait ended.
 * Returns 0; 1 when it ended by taking completions and emptying the CQ
 * (lock held since: SV_PROGRESS_DRAINED may skip the next poll); -EINTR;
 * -EAGAIN (SV_WAIT_APP, the fd went non-blocking). */
int sv_stream_wait(struct sv_stream *s, struct sv_clock *clk, short tcp_events,
		   uint64_t deadline, unsigned flags);

/* SO_RCVTIMEO/SO_SNDTIMEO as the kernel's socket has them. */
void sv_stream_load_timeouts(struct sv_stream *s);
/* A blocking call's timeout (timeo_us, 0 = none), counted from its first
 * wait: *at is set on the first call; true once it has passed. */
bool sv_stream_timed_out(uint64_t timeo_us, struct sv_clock *clk, uint64_t *at);
/* The connection's error as the application sees it, like the kernel's
 * sk_err: reported once (by whichever call comes first); after that a
 * send gets EPIPE and a receive the end of the stream. */
long sv_stream_app_error(struct sv_stream *s, bool sending);

/* ---- The queue pair (stream_qp.c) ---------------------------------------------- */

/* sv_stream_progress's flags. */
enum {
	SV_PROGRESS_DRAINED = 1, /* a wait that returned 1 emptied the CQ under
				  * the lock a moment ago: do not poll it again */
	SV_PROGRESS_SEND = 2,    /* before a send: the timers run only for a
				  * coalesced buffer, and without a clock reading
				  * only in one send of SV_TX_TIMER_EVERY (the data
				  * posted carries the ACK a timer would send) */
};
#define SV_TX_TIMER_EVERY 16
/* Take the CQ's completions into the core. Whoever takes them wakes the
 * stream's other threads: a reader's completions may be the credits a
 * writer spins or sleeps for (a spin watches wake_gen; a sleep on the same
 * channel may have lost the event). A failure breaks the stream. The
 * completions taken, or -errno. */
int sv_stream_poll_cq(struct sv_stream *s, struct sv_clock *clk);
/* Poll the CQ into the core and make whatever progress that allows: the
 * timers, the echo, a finished switch, the way back. 0 or the error. */
int sv_stream_progress(struct sv_stream *s, struct sv_clock *clk, unsigned flags);
/* The QP is unusable: deliver what it already carried, then TCP carries
 * on (or the connection fails with err when bytes may be lost). */
void sv_stream_break(struct sv_stream *s, int err);
/* rdma_cm reported the connection gone (takes the lock): -ENODEV when its
 * device was removed. */
void sv_stream_qp_down(struct sv_stream *s, int err);
/* The connection fails: the peer's TCP is reset, the application gets err. */
void sv_stream_fail(struct sv_stream *s, int err);
/* Wait (bounded) until everything sent over the QP has left this process:
 * nothing coalesced, every send completed. */
void sv_stream_drain(struct sv_stream *s);

/* ---- The switch (stream_switch.c) ------------------------------------------------- */

/* The QP is connected (rdma_cm ESTABLISHED, or the client's
 * CONNECT_RESPONSE): start moving our sending to it. */
void sv_stream_established(struct sv_stream *s);
/* Client: give up waiting for the server's proof; sending goes back to TCP
 * and the connection stays there, for the reason fb. */
void sv_stream_unhold(struct sv_stream *s, const char *why, enum sv_fallback fb);
/* Client, held: the server's TCP FIN arrived and no switch of its came
 * before it, so it can never prove itself: unhold at once ("shut down
 * before the upgrade") rather than at the upgrade's deadline. A system
 * call; the helper asks at each look during the switch. With the lock. */
void sv_stream_hold_check_peer(struct sv_stream *s, struct sv_clock *clk);
/* Detaching, and the peer has not given back everything by its deadline
 * (SV_PEER_SILENCE_US after our BACK): the connection is reset, true. With
 * the lock. */
bool sv_stream_back_overdue(struct sv_stream *s, uint64_t now);
/* The RDMA peer is not the TCP peer (or announced something the TCP stream
 * contradicts): the QP is reset, TCP carries on untouched. */
void sv_stream_challenge_failed(struct sv_stream *s, const char *why);
/* The peer announced its switch at offset seq of its TCP stream: can the
 * TCP peer have sent that much? If not (behind what we read, or further
 * ahead than socket buffers can hold), the challenge fails here and it is
 * false. With the lock. */
bool sv_stream_switch_point_ok(struct sv_stream *s, uint64_t seq);
/* The peer's echo is complete: is it our challenge? */
void sv_stream_check_echo(struct sv_stream *s);
/* Write the echo of the peer's challenge once our TO_RDMA completed. 1 when
 * it is out, -EAGAIN while it cannot go yet, or -errno. */
int sv_stream_write_echo(struct sv_stream *s);
/* Both directions settled on the QP: the connection is "rdma" (and its
 * peer is remembered as one that speaks libsovia). */
void sv_stream_maybe_rdma(struct sv_stream *s);
/* A new connection whose peer is known to speak libsovia (peers.h), or a
 * server's first contact with a client on an RDMA link, holds its first
 * writes for the QP, within SOVIA_PEER_HOLD_MS: true when it does. With
 * the lock, before any byte went on TCP. */
bool sv_stream_hold_first(struct sv_stream *s);
/* Is sending held for the QP that way now (not past the switch, nothing
 * written on TCP, not fallen back)? */
bool sv_stream_holding_first(const struct sv_stream *s);
/* The upgrade asks again at `at` (its server had no RDMA listener yet, or
 * another of its processes holds the connection): a hold lasts until its
 * span after that, within SOVIA_PEER_HOLD_MS. With the lock. */
void sv_stream_hold_past(struct sv_stream *s, uint64_t at);
/* End a hold that is over (the switch came or failed) or whose time is up
 * at `now`, waking the writers it held. */
void sv_stream_end_hold(struct sv_stream *s, uint64_t now);
/* The same, as a call's check: the clock is read only while a hold is on. */
void sv_stream_hold_due(struct sv_stream *s, struct sv_clock *clk);
/* Read the peer's TCP bytes up to its announced switch point into tcpbuf,
 * then its echo, so a switch completes while the application is not
 * reading (or has closed). */
void sv_stream_pump_tcp(struct sv_stream *s);

/* ---- The data paths (stream_rx.c, stream_tx.c) -------------------------------------- */

/* The first application bytes went on, or came off, the QP: the time to
 * RDMA is now. */
void sv_stream_first_on_qp(struct sv_stream *s, struct sv_clock *clk);
/* Read TCP (never blocking) into iov, never past the peer's switch point;
 * bytes past it are its challenge echo. Returns bytes of application data
 * (> 0), 0 at TCP's end, -EAGAIN, or -errno. */
long sv_stream_tcp_read(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags);
/* Append bytes to the TCP bytes waiting for the application. */
int sv_stream_tcpbuf_append(struct sv_stream *s, const void *data, size_t len);
static inline size_t sv_stream_tcpbuf_held(const struct sv_stream *s)
{
	return s->tcpbuf.len - s->tcpbuf.off;
}

/* ---- Resuming over TCP (stream_resume.c) ----------------------------------------------- */

/* The QP broke (sv_stream_break): if the connection can resume, start it
 * (state resuming) and return true; false leaves the break to the old
 * rules. */
bool sv_stream_resume_start(struct sv_stream *s, int err);
/* Move the exchange on: our record out, the peer's in, then our bytes the
 * peer lacks; then the connection is TCP's (state broken, no error). */
void sv_stream_resume_progress(struct sv_stream *s);
/* The QP ended normally from our side (the peer's FIN came, nothing of
 * ours in flight) while our sending is open: a peer that is still there
 * resumes, and needs our record before our next TCP bytes. It goes then
 * (sv_stream_resume_announce, before any TCP write), or in answer to the
 * peer's record; never unprompted, or a peer that closed would answer it
 * with a reset the application would see. No answer is needed from the
 * peer: it holds every byte we sent. */
void sv_stream_resume_normal_end(struct sv_stream *s);
void sv_stream_resume_announce(struct sv_stream *s);
/* The QP was lost and the connection resumes (or resumed) over TCP: a
 * call that met the core's error looks again instead of failing. */
static inline bool sv_stream_resuming(const struct sv_stream *s)
{
	return s->fo.started && !s->error;
}
/* After the QP's normal end a peer that resumes sends its record, which
 * our reader never reads (its stream ended with its FIN): before the close
 * it is answered (ours, if not sent yet) and read, or the kernel would
 * answer the unread bytes with a reset. True once it is read or TCP
 * ended (the peer closed: nothing to answer). */
bool sv_stream_resume_settled(struct sv_stream *s);
/* Has the peer's record been read (TCP bytes after it are its stream)? */
bool sv_stream_resume_heard(const struct sv_stream *s);
/* The TCP events a wait watches for the exchange: on RDMA, POLLIN (the
 * peer's record, should its QP go first); while resuming, what the
 * exchange waits for. */
short sv_stream_resume_events(const struct sv_stream *s);
/* On RDMA: the TCP socket was readable; if bytes wait there, the peer lost
 * its QP and resumes: so do we. */
void sv_stream_resume_peek(struct sv_stream *s);

/* ---- The way back and closing (stream_back.c, stream_close.c) ------------------------ */


/* Detaching: answer the peer's BACK, give back, write what came back. */
void sv_stream_back_progress(struct sv_stream *s);
/* TCP's shutdown(SHUT_WR), held back while TCP may still have to carry
 * bytes of ours (the echo, bytes given back): done once it may go. */
void sv_stream_kernel_shut(struct sv_stream *s);
/* Write the core's owed bytes on TCP (never blocking). True when none is
 * left; false when some wait for room (or it failed: s->error). */
bool sv_stream_write_owed(struct sv_stream *s);
/* The helper's part of a detached stream: end the QP after a grace period. */
uint64_t sv_stream_detached_service(struct sv_stream *s, uint64_t now, bool *done);
/* The application closed its fd: finish the connection (helper thread).
 * Returns the next deadline; sets *done when the stream is finished. */
uint64_t sv_stream_linger(struct sv_stream *s, uint64_t now, bool *done);
/* At exit: push out what this stream holds (takes the lock). */
void sv_stream_exit_flush(struct sv_stream *s);
/* exit began (stream.c): writes complete before they return. */
extern atomic_bool sv_stream_exit_begun;

/* ---- Statistics (stream_stats.c) ----------------------------------------------------- */

/* SOVIA_STATS: one line on stderr, once per connection. */
void sv_stream_print_stats(struct sv_stream *s, const char *when);
/* A wait slept from `from` to `to`, ended by a timeout, the channel or a kick. */
void sv_stream_count_sleep(struct sv_stream *s, uint64_t from, uint64_t to, bool timeout,
			   bool chan, bool kick);

/* ---- The copies' events (src/share; stream.h) ------------------------------------------ */

/* The table sv_stream_serve_copies gave (NULL: none). A stream whose
 * `share` is set has it. */
extern const struct sv_stream_copies *sv_copies;

static inline void sv_copies_state(struct sv_stream *s, enum sv_conn_state to)
{
	if (s->share)
		sv_copies->state(s, to);
}
static inline bool sv_copies_may_upgrade(struct sv_stream *s)
{
	return !s->share || sv_copies->may_upgrade(s);
}
static inline bool sv_copies_may_pump(struct sv_stream *s)
{
	return !s->share || sv_copies->may_pump(s);
}
static inline bool sv_copies_superseded(struct sv_stream *s)
{
	return s->share && sv_copies->superseded(s);
}
static inline void sv_copies_moved(struct sv_stream *s)
{
	if (s->share)
		sv_copies->moved(s);
}

/* ---- The stream's rdma_cm half (stream_cm.c) ------------------------------------------ */

/* Its part of the upgrade's start (sv_stream_init): the connections' hooks. */
void sv_stream_cm_init(void);
/* Client: try to move it to RDMA now (sv_stream_start_client waits
 * SOVIA_UPGRADE_DELAY_MS first). Without the lock. */
void sv_stream_cm_connect_now(struct sv_stream *s);
/* Client: a stream waiting for room in the locked-memory budget
 * (up.room_wait) asks again. Without the lock. */
void sv_stream_cm_retry_room(struct sv_stream *s);
/* Server: the application accepted this connection on l's socket; a
 * request may match it. Without the lock. */
void sv_stream_cm_accepted(struct sv_stream *s, struct sv_listener *l);
/* A fork's child took s, a connection handed to it (by its parent before
 * the fork, or a server's end its parent handed on as it let go:
 * src/share/hand.c, src/share/keep.c): it waits for
 * its request at an RDMA listener of the child's on its address, whose
 * port it claims in the holders' table. Without the lock. */
void sv_stream_cm_adopted(struct sv_stream *s);
/* rdma_disconnect, and the QP to the error state so that everything posted
 * is flushed (librdmacm does that only for its own QPs). */
void sv_stream_cm_disconnect(struct sv_stream *s);
/* The stream is being freed: its QP and id go (without the lock). */
void sv_stream_cm_forget(struct sv_stream *s);

/* Between stream_cm.c, stream_ask.c (the client's) and stream_accept.c
 * (the server's). Create the QP, its buffers and the core on s->id
 * (receives are posted before the connection is established) and a
 * challenge. With s->lock. -EAGAIN: the buffers do not fit the
 * locked-memory budget now, but may later (s->up.room_wait set: ask
 * again); -ENOBUFS: they never could (said on stderr). */
int sv_stream_cm_attach_qp(struct sv_stream *s);
/* Free the core and the QP of an attempt that is over. With s->lock. */
void sv_stream_cm_release_qp(struct sv_stream *s);
/* The stream stays on TCP: its QP and core go. With the upgrade's lock,
 * without s->lock. */
void sv_stream_cm_drop_qp(struct sv_stream *s, enum sv_fallback why);
/* The QP on rdma_cm's side is connected (ESTABLISHED, or the client's
 * CONNECT_RESPONSE): the switch starts. Without s->lock. */
void sv_stream_cm_established(struct sv_stream *s);
/* sv_stream_cm_disconnect and sv_stream_fall_back, taking s->lock. */
void sv_stream_cm_disconnect_locked(struct sv_stream *s);
void sv_stream_cm_fall_back(struct sv_stream *s, enum sv_fallback why);
/* The client's events: the route resolved, the server's reply (our QP
 * made ready, or ESTABLISHED with its private data), a rejection (asked
 * again, or the end). With the upgrade's lock. */
void sv_stream_cm_route_resolved(struct sv_stream *s);
void sv_stream_cm_connect_response(struct sv_stream *s, struct rdma_cm_event *ev);
void sv_stream_cm_client_established(struct sv_stream *s, const struct rdma_conn_param *cp);
void sv_stream_cm_rejected(struct sv_stream *s, struct rdma_cm_event *ev,
			   struct rdma_cm_id **destroy);
/* The server's side of the upgrade's hooks (struct sv_upgrade_conns). */
enum sv_accept_result sv_stream_cm_accept(struct sv_stream *s, struct rdma_cm_id *id,
					  const struct sv_cm_req *req);
enum sv_conn_wait sv_stream_cm_waiting(struct sv_stream *s, uint64_t now, uint64_t *use_wait);
enum sv_conn_holding sv_stream_cm_holding(struct sv_stream *s, struct sv_hand *hand);

#endif
