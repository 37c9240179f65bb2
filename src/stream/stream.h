/* A SOVIA stream: one accelerated TCP connection, as the interposer and
 * the helper thread see it. Its state is private to the stream's files
 * (stream_int.h).
 *
 * The application's fd is always the real kernel TCP socket. Each direction
 * of the byte stream has a medium, TCP at first; once both ends agree over
 * rdma_cm, each direction moves to the RC queue pair at a byte offset the
 * sender announces (TO_RDMA), and can move back the same way (TO_TCP, or
 * BACK for the way back). Every call below takes the stream's lock itself;
 * results are >= 0 or -errno. */
#ifndef SV_STREAM_H
#define SV_STREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "helper.h"
#include "upgrade.h"

struct sv_stream;
struct sv_listener;
struct sv_hand;
struct pollfd;
struct sv_marks;

/* ---- State ------------------------------------------------------------------ */

/* The connection's state. Every change goes through sv_stream_set_state,
 * which checks it against the table of allowed transitions in
 * stream_state.c (docs/design.md has the table). */
enum sv_conn_state {
	SV_CONN_TCP,        /* connected on TCP; no upgrade under way */
	SV_CONN_RESOLVING,  /* client: rdma_cm resolving the peer */
	SV_CONN_REQUESTED,  /* client: rdma_connect sent / server: accepting */
	SV_CONN_SWITCHING,  /* QP up: exchanging TO_RDMA and the challenges */
	SV_CONN_RDMA,       /* both directions moved to the QP */
	SV_CONN_FALLBACK,   /* stays on TCP for good (see the fallback reason) */
	SV_CONN_BROKEN,     /* the QP failed after data moved to it: see error */
	SV_CONN_DETACHING,  /* BACK/RETURN under way: going back to plain TCP */
	SV_CONN_DETACHED,   /* plain TCP again, nothing held: the fd is the kernel's */
	SV_CONN_RESUMING,   /* the QP was lost: the ends agree on TCP where each
			     * direction goes on (stream_resume.c), then broken */
	SV_CONN_NSTATES
};

/* Why a connection stayed on TCP. */
enum sv_fallback {
	SV_FB_NONE,
	SV_FB_DISABLED,     /* SOVIA_DISABLE or no RDMA support in this process */
	SV_FB_NO_ROUTE,     /* rdma_cm could not resolve the peer (no RDMA path) */
	SV_FB_REJECTED,     /* no libsovia listener at the peer, or it refused */
	SV_FB_UNREACHABLE,  /* the request got no answer */
	SV_FB_VERSION,      /* the peer speaks another protocol version */
	SV_FB_TIMEOUT,      /* the upgrade took longer than SOVIA_UPGRADE_TIMEOUT_MS */
	SV_FB_NO_MATCH,     /* server: no accepted TCP connection for the request */
	SV_FB_CHALLENGE,    /* the RDMA peer failed to prove it is the TCP peer */
	SV_FB_RESOURCES,    /* creating the QP or its buffers failed */
	SV_FB_UNSUPPORTED,  /* a call libsovia cannot serve moved it back */
	SV_FB_SHUTDOWN,     /* a sender finished on TCP before it could switch */
	SV_FB_QP_LOST,      /* the QP died before any data went over it */
	SV_FB_CALLED_OFF,   /* the QP was disconnected before any data went over
			     * it: the peer's client had finished on TCP (or
			     * the RDMA device went away) */
	SV_FB_CREDENTIALS,  /* the kernel refuses our RDMA files to this process's
			     * credentials (changed since they were opened, or
			     * opened by the parent before a fork) */
	SV_FB_MEMLOCK,      /* its buffers do not fit the locked-memory budget
			     * (pinned.h) */
	SV_FB_UNPRIVILEGED, /* SOVIA_PRIVILEGED_PORTS, and the server's port is
			     * 1024 or above */
	SV_FB_HANDED,       /* server: handed to a fork's child before its upgrade
			     * (the child may take it to RDMA: holders.h) */
	SV_FB_UNVOUCHED,    /* client: the server host's sovia-warden knows no
			     * libsovia listener for it, or (with
			     * SOVIA_WARDEN_REQUIRED) the host has no warden */
};

/* Why a connection on RDMA resumed over TCP (its statistics say it). */
enum sv_failover {
	SV_FO_NONE,
	SV_FO_QP_ERROR,   /* a work request failed: the QP is in the error state */
	SV_FO_DISCONNECT, /* rdma_cm: the connection was disconnected */
	SV_FO_DEVICE,     /* rdma_cm: the RDMA device was removed */
	SV_FO_PEER,       /* the peer's resume record came first, on TCP */
};

const char *sv_conn_state_name(enum sv_conn_state s);
const char *sv_failover_name(enum sv_failover f);
const char *sv_fallback_name(enum sv_fallback f);

/* Stay on TCP for good, for `why` (kept if a reason was given before),
 * unless the connection is past its upgrade (on RDMA, broken, going back
 * or back). Wakes waiters. */
void sv_stream_fall_back(struct sv_stream *s, enum sv_fallback why);

/* ---- Life ----------------------------------------------------------------- */

/* The module's start: it gives the helper its hooks (helper.h), and the
 * upgrade starts too. Once, before any stream (again: nothing). */
void sv_stream_init(void);

/* A stream for a TCP socket: connected (client), accepted (server), or a
 * client whose non-blocking connect() is in progress. NULL on ENOMEM. */
struct sv_stream *sv_stream_new(int fd, bool is_client);
void sv_stream_get(struct sv_stream *s);
void sv_stream_put(struct sv_stream *s);

/* Start moving it to RDMA: a client once connect() returned (the helper
 * starts after SOVIA_UPGRADE_DELAY_MS), a client whose non-blocking connect
 * is in progress (once it completes), a server's accepted connection (a
 * request may match it). Without RDMA it stays on TCP, with the reason. */
/* From now on this process upgrades no connection (`call`, one that
 * reaches sockets behind libsovia, like io_uring_setup, was made): new
 * ones stay on TCP, with the reason unsupported-call and that call. */
void sv_stream_upgrades_off(const char *call);
void sv_stream_start_client(struct sv_stream *s);
void sv_stream_start_connecting(struct sv_stream *s, const struct sockaddr *to, socklen_t len);
void sv_stream_start_server(struct sv_stream *s, struct sv_listener *l);
/* Its upgrade starts at its first use, not now: a connection an exec'd
 * image continues, or one handed to a fork's child (src/share), so that a
 * process that only execs or closes it starts no helper nor rdma_cm. */
void sv_stream_start_at_use(struct sv_stream *s);

/* ---- What a program or sovia-stat sees of it ---------------------------- */

/* One connection, as include/sovia.h and sovia-stat(8) report it: read
 * under the stream's lock from the counters it keeps anyway. */
void sv_stream_view(struct sv_stream *s, struct sv_conn_view *v);
/* Each live stream's view to fn (on the calling thread, no lock held
 * during fn), but those the application closed. */
void sv_stream_view_all(void (*fn)(const struct sv_conn_view *v, void *arg), void *arg);

/* ---- The application's calls ---------------------------------------------- */

long sv_stream_recvmsg(struct sv_stream *s, struct msghdr *msg, int flags);
long sv_stream_sendmsg(struct sv_stream *s, const struct msghdr *msg, int flags);
int sv_stream_shutdown(struct sv_stream *s, int how);
int sv_stream_setsockopt(struct sv_stream *s, int level, int name, const void *val,
			 socklen_t len);
/* FIONREAD: the bytes readable now (ours, and the kernel's when TCP carries
 * the receive side). */
long sv_stream_inq(struct sv_stream *s);
/* The fd's mode may have changed (fcntl F_SETFL, ioctl FIONBIO): the next
 * call looks at it again. */
void sv_stream_mode_changed(struct sv_stream *s);

/* What the calls that report the connection's state answer, where the
 * kernel's socket knows only TCP's part (stream_report.c). */
/* getsockopt(SO_ERROR): the connection's error (-errno), taken as the
 * kernel's pending error is: reported once, to this or to whichever call
 * comes first. 0: none of ours (the kernel's socket answers). */
int sv_stream_take_error(struct sv_stream *s);
/* ioctl(SIOCOUTQ): the bytes the application wrote that the peer is not
 * known to have: the kernel's for TCP, plus those coalesced, in flight on
 * the QP, or kept or owed after a lost QP or on the way back. */
long sv_stream_outq(struct sv_stream *s);
/* getsockopt(TCP_INFO): correct the kernel's struct tcp_info (the len
 * bytes it filled in) where the connection's state differs: its state
 * after an error or the FINs that went over the QP, and its byte counters
 * with the QP's bytes. */
void sv_stream_tcp_info(struct sv_stream *s, void *info, socklen_t len);

/* The application closed `appfd`, one of its fds for the stream. The last
 * one closed: the helper finishes the connection (lingering close). */
int sv_stream_close(struct sv_stream *s, int appfd);
/* dup: the application is about to have several fds for the stream; the
 * stream moves to a private copy of the socket, so any of them may be
 * closed first. Then sv_stream_opened for each new fd. */
int sv_stream_share(struct sv_stream *s);
void sv_stream_opened(struct sv_stream *s);

/* The way back: make the kernel's socket carry the whole connection again,
 * with nothing held by libsovia, for a call libsovia cannot serve (fork,
 * exec, SCM_RIGHTS, ...). Blocks, bounded by SOVIA_UPGRADE_TIMEOUT_MS, while
 * an upgrade in progress settles and the peer gives back what we sent and
 * it did not read. 0 when the fd is plain TCP now (also when it always
 * was); -EBUSY when bytes libsovia holds cannot be given back (the QP is
 * gone), -ETIMEDOUT, or the connection's error: the stream stays
 * libsovia's. */
int sv_stream_detach(struct sv_stream *s, const char *call);
/* s stays on TCP for `call`, one libsovia cannot serve (fallback
 * unsupported-call; the call named in the log, the statistics and the
 * view). With s's lock; past the upgrade, nothing. */
void sv_stream_unserved(struct sv_stream *s, const char *call);
/* What the application of accepted socket fd has sent and received over
 * TCP in its life, from the kernel's counters; -ENOTCONN past
 * ESTABLISHED, where the kernel counts a FIN too. A connecting socket's
 * tx counts its SYN as well (one more); differences are exact for both. */
int sv_tcp_app_counts(int fd, uint64_t *tx, uint64_t *rx);
/* The application reads, writes, waits on or shuts down the connection
 * (each such call's first step). A server's upgrade request waits for it:
 * an accept-then-fork server's parent never uses its connection, which is
 * then still on TCP, free to hand to the child, at the fork. */
void sv_stream_app_uses(struct sv_stream *s);
bool sv_stream_app_used(const struct sv_stream *s);
/* Does the kernel's socket alone answer for the stream from now on (TCP for
 * good, nothing held by libsovia)? Then the fd may be the kernel's. */
bool sv_stream_kernel_only(struct sv_stream *s);
/* The same as last seen by the stream, without its lock: once true it
 * stays so; false may be late. */
bool sv_stream_kernel_only_seen(const struct sv_stream *s);

/* ---- Calls in the kernel (stream_kcalls.c) ------------------------------------ */

/* Start a second life's upgrade (a successor made by src/share): l is the
 * listener a request came to; NULL for a client, or a server's handed to
 * us. */
void sv_stream_start_revived(struct sv_stream *s, struct sv_listener *l);


/* The data calls of an fd entry that go to the kernel's socket while its
 * connection may get a successor: a successor takes its counts only once
 * none is under way (such a read could take a switch's echo for data),
 * and once it took the fd over, the calls that still reach the old entry
 * go on to it. sv_kcalls_enter: NULL, go to the kernel, then
 * sv_kcalls_leave; or the successor (a reference) serves the call.
 * sv_kcalls_forget drops the successor's reference. */
struct sv_kcalls {
	atomic_uint n;
	_Atomic(struct sv_stream *) next;
};
struct sv_stream *sv_kcalls_enter(struct sv_kcalls *k);
/* The stream's own: the calls of its fd entries in the kernel. */
struct sv_kcalls *sv_stream_kcalls(struct sv_stream *s);
void sv_kcalls_leave(struct sv_kcalls *k);
void sv_kcalls_took(struct sv_kcalls *k, struct sv_stream *n);
void sv_kcalls_forget(struct sv_kcalls *k);
/* ---- For the copies of a connection (src/share) -------------------------------- */

/* What the copies of a connection across fork, exec and fd passing
 * (src/share) hear from it. The stream calls them only through this
 * table, which sv_share_init gives (sv_stream_serve_copies); a stream
 * made without it has no copies. Each is called with the stream's lock
 * held unless it says otherwise. */
struct sv_stream_copies {
	/* Life: a new stream's state for them (NULL: none, e.g. no memory),
	 * and its last reference gone (without the lock). */
	void *(*born)(struct sv_stream *s);
	void (*died)(struct sv_stream *s, void *state);
	/* Every change of its state (sv_stream_set_state). */
	void (*state)(struct sv_stream *s, enum sv_conn_state to);
	/* The owner lets go of it: its last fd closed (the copies hear it
	 * first, without the lock), then closed (with it); its exit
	 * (without). */
	void (*let_go)(struct sv_stream *s, bool exiting);
	void (*closed)(struct sv_stream *s);
	/* fork: a server's connection whose upgrade has not begun is handed
	 * to the child (true), before its way back. */
	bool (*fork_hand)(struct sv_stream *s);
	/* Its upgrade is called off (a call libsovia does not serve). */
	void (*called_off)(struct sv_stream *s);
	/* The way back: our BACK went (peer_first: the peer's came first),
	 * then plain TCP again. */
	void (*back)(struct sv_stream *s, bool peer_first);
	void (*detached)(struct sv_stream *s);
	/* A second life: may its upgrade go on (a successor's counts are
	 * taken once its predecessor's calls are over)? May it read TCP
	 * ahead of the application (no call sleeps on the predecessor's fd
	 * entry)? Back on TCP while a call waited, and it may get a
	 * successor or has one (the call goes on through the kernel's
	 * branch)? */
	bool (*may_upgrade)(struct sv_stream *s);
	bool (*may_pump)(struct sv_stream *s);
	bool (*superseded)(struct sv_stream *s);
	/* Bytes moved on TCP by this process (without the lock): a
	 * connection handed to a fork's child is spoiled for it. */
	void (*moved)(struct sv_stream *s);
	/* Whose an accepted connection is, for the holders' table; is a
	 * connection handed to us still held by another process too? */
	enum sv_conn_holding (*holding)(struct sv_stream *s, struct sv_hand *hand);
	bool (*others_hold)(struct sv_stream *s);
};
void sv_stream_serve_copies(const struct sv_stream_copies *copies);
/* The copies' state of s (what `born` gave; NULL: none). */
void *sv_stream_copies_state(struct sv_stream *s);

/* What the copies decide by, read with the stream's lock held. */
struct sv_stream_facts {
	enum sv_conn_state state;
	enum sv_fallback fallback;
	int fd;
	int error;           /* -errno once broken */
	unsigned opens;      /* the application's fds for it */
	bool is_client;
	bool fd_private;     /* fd is libsovia's own copy */
	bool app_closed, tx_shut;
	bool escaped;        /* the application's fd became the kernel's */
	size_t read_ahead;   /* the peer's TCP bytes read ahead of the application */
	bool has_id, has_core;
	bool room_wait;      /* its buffers wait for room in the budget */
	bool switch_seen;    /* a switch's echo went, or the peer's was read */
	bool switch_pending; /* our data waits for the peer's proof, or our
			      * echo is owed */
	bool core_back_ready; /* the core could take the way back now */
	bool off_qp;         /* neither direction on the QP any more */
	struct sv_holders *holders;
	struct sockaddr_storage local, peer;
	uint64_t tcp_tx, tcp_rx;
};
/* The application's fd (libsovia's own copy after a dup or a close), for
 * what the copies say of it. */
int sv_stream_fd(const struct sv_stream *s);
void sv_stream_lock(struct sv_stream *s);
void sv_stream_unlock(struct sv_stream *s);
void sv_stream_facts(struct sv_stream *s, struct sv_stream_facts *f);
/* What the copies do to it, with its lock held: stay on TCP for good;
 * send our BACK as soon as it may; its fd became the kernel's; our
 * record after the QP's normal end (sv_stream_resume_announce); the
 * offsets where our BACK left each direction (on: or not any more, the
 * copies being settled); its offsets now, and the
 * family's holders' table; a second life (its counts continue another's:
 * it holds nothing first, is used, and asks once more). */
void sv_stream_want_back(struct sv_stream *s, bool on);
void sv_stream_escape(struct sv_stream *s);
void sv_stream_announce_end(struct sv_stream *s);
void sv_stream_back_points(struct sv_stream *s, uint64_t *tx, uint64_t *rx);
void sv_stream_set_offsets(struct sv_stream *s, uint64_t tx, uint64_t rx);
void sv_stream_set_holders(struct sv_stream *s, struct sv_holders *h);
void sv_stream_mark_revived(struct sv_stream *s);
/* A reference to a live stream, unless its last is being dropped right
 * now. */
bool sv_stream_try_get(struct sv_stream *s);
/* The server's stream of this process for (local, peer) that pick()
 * chooses, else any other of them, or NULL: a reference. pick() is called
 * under the list of streams' lock: it reads what it may without the
 * stream's. */
struct sv_stream *sv_stream_find(const struct sockaddr_storage *local,
				 const struct sockaddr_storage *peer,
				 bool (*pick)(struct sv_stream *s));
/* The way back for the copies: the connection is taken back to plain TCP
 * while its fd stays the application's (a copy elsewhere, not a
 * hand-over, gets it); for a fork (away: the fd becomes the kernel's).
 * As sv_stream_detach. */
int sv_stream_detach_for_copies(struct sv_stream *s);
int sv_stream_detach_for_fork(struct sv_stream *s, bool away);
/* Its upgrade starts at its first use (sv_stream_start_at_use), not now:
 * is it to start (one load), and take that start (true once). */
bool sv_stream_start_pending(const struct sv_stream *s);
bool sv_stream_take_start(struct sv_stream *s);
/* Start the upgrade of a server's connection handed to this process: its
 * request comes to a listener of ours, the parent's redirects it. */
void sv_stream_start_handed(struct sv_stream *s);
/* The application used it (a successor's predecessor was): no wait for a
 * first use. */
void sv_stream_mark_used(struct sv_stream *s);

/* ---- Readiness: poll, select, epoll (stream_poll.c) -------------------------- */

/* Which of `events` libsovia answers for this stream (*own gets those that
 * are ready) and which the kernel's socket answers (*kernel); *gen marks the
 * state judged. */
void sv_stream_poll_split(struct sv_stream *s, short events, short *own, short *kernel,
			  uint64_t *gen);
/* After the kernel's poll reported the TCP socket readable, while the
 * kernel answered for reading: `rev` as it stands now. The bytes may be
 * only the peer's switch echo, and then libsovia answers instead. */
short sv_stream_poll_recheck(struct sv_stream *s, short events, short rev);
/* poll() found nothing ready: the application is about to wait, most
 * likely for an answer to what it wrote. Pushes out what it coalesced, as
 * a receive call does. */
void sv_stream_poll_waits(struct sv_stream *s);
/* Before sleeping in poll(): attach w (a watch that kicks the sleeping
 * thread, hub.h) so that any change of the stream wakes the sleep, arm the
 * CQ, and add the fds whose readiness also means a change (at most 1: the
 * TCP socket while a switch is pending). Sets *again when it changed
 * already since `gen`. Every call is paired with sv_stream_poll_done
 * after the sleep. */
struct sv_hub_watch;
struct sv_hub_node;
int sv_stream_poll_sources(struct sv_stream *s, struct sv_hub_watch *w, struct pollfd *out,
			   bool *again, uint64_t gen);
void sv_stream_poll_done(struct sv_stream *s, struct sv_hub_watch *w);
/* For a watch that stays attached (an epoll set's): arm before a sleep.
 * True when the stream changed since `gen` (judge it again); *tcp_events:
 * the TCP socket's events that also mean a change (0 or POLLIN). */
bool sv_stream_poll_arm(struct sv_stream *s, uint64_t gen, short *tcp_events);
/* The stream's node: epoll sets and the helper attach their watches. */
struct sv_hub_node *sv_stream_hub_node(struct sv_stream *s);
/* Adaptive spin: how long a wait on s polls before it sleeps (0: sleep at
 * once), and the length of a wait that ended with something for it. */
uint32_t sv_stream_spin_us(struct sv_stream *s);
void sv_stream_waited(struct sv_stream *s, uint64_t us);
/* epoll: the stream's marks for the edge-triggered rules (readiness.h). */
void sv_stream_marks(struct sv_stream *s, struct sv_marks *m);

/* ---- The helper's part ------------------------------------------------------- */

void sv_stream_service(struct sv_stream *s, struct sv_service *sv);

/* ---- Process events ------------------------------------------------------------ */

/* In a fork's child: the parent's streams are not the child's. */
void sv_stream_atfork_child(void);
/* Exit: push out everything held back and wait (bounded) for delivery,
 * for every live stream. Writes after it (stdio's last flush) complete
 * before they return. */
void sv_stream_exit_flush_all(void);

#endif
