/* A SOVIA stream: one accelerated TCP connection.
 *
 * The application's fd is always the real kernel TCP socket. Each direction
 * of the byte stream has a medium, TCP at first; once both ends agree over
 * rdma_cm, each direction moves to the RC queue pair at a byte offset the
 * sender announces (TO_RDMA), and can move back the same way (TO_TCP).
 *
 * Locking: `lock` serialises everything below, the protocol core and the
 * transport included. Nobody sleeps holding it: waits drop it and sleep in
 * poll() on the completion channel, the TCP socket and the wake eventfd. */
#ifndef SV_STREAM_H
#define SV_STREAM_H

#include "proto.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct rdma_cm_id;
struct sv_verbs;

/* The connection's state, as the upgrade moves it. */
enum sv_conn_state {
	SV_CONN_TCP,        /* connected on TCP; no upgrade tried yet */
	SV_CONN_RESOLVING,  /* client: rdma_cm resolving the peer */
	SV_CONN_REQUESTED,  /* client: rdma_connect sent / server: waiting to accept */
	SV_CONN_SWITCHING,  /* QP up: exchanging TO_RDMA and the challenges */
	SV_CONN_RDMA,       /* both directions moved to the QP at least once */
	SV_CONN_FALLBACK,   /* stays on TCP for good (see fallback reason) */
	SV_CONN_BROKEN,     /* the QP failed after data moved to it: see error */
	SV_CONN_DETACHING,  /* BACK/RETURN under way: going back to plain TCP */
	SV_CONN_DETACHED,   /* plain TCP again, nothing held: the fd is the kernel's */
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
	SV_FB_SHUTDOWN,     /* the sender shut down before the QP was up */
	SV_FB_QP_LOST,      /* the QP died before any data went over it */
	SV_FB_CALLED_OFF,   /* the QP was disconnected before any data went over
			     * it: the peer's client had finished on TCP (or
			     * the RDMA device went away) */
	SV_FB_CREDENTIALS,  /* the kernel refuses our RDMA files to this process's
			     * credentials (changed since they were opened, or
			     * opened by the parent before a fork) */
};

const char *sv_conn_state_name(enum sv_conn_state s);
const char *sv_fallback_name(enum sv_fallback f);

/* The four-tuple, seen from this end. */
struct sv_tuple {
	struct sockaddr_storage local, peer;
};

struct sv_stream_stats {
	uint64_t tcp_tx_bytes, tcp_rx_bytes; /* application bytes over TCP */
	uint64_t switches_to_rdma, switches_to_tcp;
	/* The application's blocking waits in libsovia (sv_stream_wait): ended
	 * by the spin, or slept and then woken by the completion channel, a
	 * kick (sv_stream_wake) or the timeout; and the helper's looks that
	 * took completions itself. Telling why a connection runs slow. */
	uint64_t waits_spun, waits_slept, slept_us, slept_max_us;
	uint64_t woken_chan, woken_kick, woken_timeout, helper_polls;
};

struct sv_stream {
	pthread_mutex_t lock;
	atomic_int refs;
	int fd;              /* the kernel TCP socket */
	bool fd_private;     /* fd is libsovia's own copy (dup, lingering close) */
	unsigned opens;      /* the application's fds for this stream (dup) */
	bool is_client;
	bool connecting;     /* a non-blocking connect() has not completed yet */
	enum sv_conn_state state;
	enum sv_fallback fallback;
	struct sv_tuple tuple;

	/* Bytes of each direction's stream carried by TCP so far. With the
	 * core's counters they give every switch offset. */
	uint64_t tcp_tx; /* application bytes we wrote on TCP */
	uint64_t tcp_rx; /* application bytes we read from TCP */

	/* The upgrade. */
	struct rdma_cm_id *id;
	struct sv_verbs *verbs;
	struct sv_proto proto;
	bool proto_ready;                     /* proto initialised */
	uint8_t my_challenge[SV_CHALLENGE_SIZE];   /* the peer must echo it on TCP */
	uint8_t peer_challenge[SV_CHALLENGE_SIZE]; /* we echo it on TCP */
	bool tx_held;        /* TO_RDMA sent; data waits until we verified the peer */
	bool echo_owed;      /* the echo must be written on TCP once TO_RDMA completed */
	uint32_t echo_sent;  /* bytes of the echo written */
	uint8_t chal_got[SV_CHALLENGE_SIZE]; /* the peer's echo as read from TCP */
	uint32_t chal_len;
	uint64_t deadline_us; /* upgrade deadline */
	uint64_t upgrade_at;  /* client: when the helper starts the upgrade
			       * (SOVIA_UPGRADE_DELAY_MS, or a retry after
			       * "no listener"); 0 = not waiting */
	uint8_t connect_retries; /* client: requests asked again after "no listener" */
	bool qp_lost;        /* the QP died while a switch waited for its echo */

	/* TCP bytes read by the pump before the application asked for them. */
	uint8_t *tcpbuf;
	size_t tcpbuf_len, tcpbuf_off, tcpbuf_cap;

	/* Waiting. */
	int wake_fd;         /* eventfd: state changes other waiters must see */
	unsigned waiters;
	uint64_t wake_gen;   /* counts sv_stream_wake: changes a poll must not miss */
	/* How long the application's waits on this stream lasted lately, in
	 * microseconds (a moving average; read without the lock by poll). */
	atomic_uint wait_avg_us;
	/* Writes that moved bytes, and their count at the last read that
	 * returned bytes: a wait with no write since that read is a
	 * reader's, not a wait for a reply (sv_spin_reader). */
	atomic_uint writes, writes_seen;
	/* The fd was in blocking mode when last looked at (fcntl F_GETFL).
	 * Only "blocking" is remembered: a wait checks it again before it
	 * sleeps in the kernel, so a mode changed behind our back (another
	 * process sharing the open file) costs at most a spin. */
	atomic_bool seen_blocking;
	uint64_t app_calls;  /* the application's calls that may poll the CQ */
	/* Writes that found a coalesced buffer pending and did not look at
	 * its timer (sv_stream_progress_before_send). */
	uint32_t tx_unclocked;
	/* Receive and send calls that returned EAGAIN (epoll's edge rules,
	 * src/readiness.h). */
	atomic_uint_least64_t rx_eagain, tx_eagain;
	uint64_t helper_seen; /* app_calls when the helper last looked */
	/* The helper's watch (under the helper's lock, helper.c). */
	bool helper_watched;
	atomic_bool helper_kick;

	/* Socket options that shape the protocol. */
	bool nodelay, cork;
	uint64_t rcvtimeo_us, sndtimeo_us; /* SO_RCVTIMEO, SO_SNDTIMEO (0: none) */

	/* Close. */
	bool app_closed;     /* the application closed its fd; the helper lingers */
	bool tx_shut;        /* shutdown(SHUT_WR) done */
	bool shut_deferred;  /* TCP's shutdown waits for the echo to go out first */
	uint64_t linger_deadline_us;

	int error; /* -errno when broken */
	bool error_told; /* the application was given `error` once */
	bool stats_printed;
	struct sv_stream_stats st;

	struct sv_stream *next_all; /* the helper's list of live streams */
};

/* Monotonic microseconds. */
uint64_t sv_now_us(void);

/* A stream for a connected TCP socket. NULL on ENOMEM. */
struct sv_stream *sv_stream_new(int fd, bool is_client);
void sv_stream_get(struct sv_stream *s);
void sv_stream_put(struct sv_stream *s);

/* The application's calls. Results are >= 0 or -errno. */
long sv_stream_recvmsg(struct sv_stream *s, struct msghdr *msg, int flags);
long sv_stream_sendmsg(struct sv_stream *s, const struct msghdr *msg, int flags);
int sv_stream_shutdown(struct sv_stream *s, int how);
int sv_stream_setsockopt(struct sv_stream *s, int level, int name, const void *val,
			 socklen_t len);
/* The application closed `appfd`, one of its fds for the stream. The last
 * one closed: the helper finishes the connection. */
int sv_stream_close(struct sv_stream *s, int appfd);
/* dup: the application is about to have several fds for the stream; the
 * stream moves to a private copy of the socket, so any of them may be
 * closed first. Then sv_stream_opened for each new fd. */
int sv_stream_share(struct sv_stream *s);
void sv_stream_opened(struct sv_stream *s);

/* Upgrade steps, run by the helper thread (each takes the lock). */
void sv_stream_fallback(struct sv_stream *s, enum sv_fallback why);
/* The QP is connected: start moving our sending to it. */
void sv_stream_established(struct sv_stream *s);
/* How the helper watches a stream on RDMA whose application drives it
 * (sv_stream_service fills it in; see docs/design.md, "the helper"). */
struct sv_watch_io {
	bool fired;  /* in: the helper's copy of the completion channel woke it */
	bool kicked; /* in: sv_helper_watch asked for this service */
	bool idle;   /* out: on RDMA: look again only at the deadline, on a channel
		      * event or when kicked (sv_helper_watch) */
	bool armed;  /* out: the CQ is armed: sleep on the channel copy */
	int chan;    /* in/out: the helper's copy (dup) of the stream's completion
		      * channel fd, -1 none; replaced here (under the stream's lock,
		      * so it is a copy of the live channel) when it is stale */
	int chan_of; /* in/out: the stream's fd that chan copies */
	uint32_t look_us; /* in/out: the interval of the helper's looks while the
			   * application stays active; 0 after it was found idle */
};

/* Make progress on whatever the stream waits for (completions, the
 * challenge, the echo, timers, lingering close). Returns the next deadline
 * (0 = none) and sets *done when the stream needs the helper no more. */
uint64_t sv_stream_service(struct sv_stream *s, uint64_t now, bool *done, struct sv_watch_io *io);
/* The QP or rdma_cm reported the connection gone. */
void sv_stream_qp_down(struct sv_stream *s, int err);

/* poll(): which of `events` libsovia answers for this stream (*own gets
 * those that are ready) and which the kernel's socket answers (*kernel). */
void sv_stream_poll_split(struct sv_stream *s, short events, short *own, short *kernel,
			  uint64_t *gen);
/* After the kernel's poll reported the TCP socket readable, while the kernel
 * answered for reading: `rev` as it stands now. The bytes may be only the
 * peer's switch echo, and then libsovia answers for reading instead. */
short sv_stream_poll_recheck(struct sv_stream *s, short events, short rev);
/* poll() found nothing ready: the application is about to wait, most
 * likely for an answer to what it wrote. Pushes out what it coalesced, as
 * a receive call does. */
void sv_stream_poll_waits(struct sv_stream *s);
/* Adaptive spin: how long a wait on s polls before it sleeps (0: sleep at
 * once), and the length of a wait that ended with something for it. */
uint32_t sv_stream_spin_us(struct sv_stream *s);
void sv_stream_waited(struct sv_stream *s, uint64_t us);
/* Before sleeping in poll(): arm, and add the fds whose readiness means the
 * stream may have changed (at most 3). Sets *again when it changed already.
 * Every call is paired with sv_stream_poll_done after the sleep. */
struct pollfd;
int sv_stream_poll_sources(struct sv_stream *s, struct pollfd *out, bool *again, uint64_t gen);
void sv_stream_poll_done(struct sv_stream *s, const struct pollfd *src, int n);

/* epoll: the stream's marks for the edge-triggered rules (readiness.h). */
struct sv_marks;
void sv_stream_marks(struct sv_stream *s, struct sv_marks *m);
/* Does the kernel's socket alone answer for the stream from now on (TCP for
 * good and nothing held by libsovia)? Then an epoll set may watch the fd
 * itself. */
bool sv_stream_kernel_only(struct sv_stream *s);

/* Non-blocking connect: the helper starts the upgrade once it completes. */
void sv_stream_connecting(struct sv_stream *s);

/* The way back (stream_back.c): make the kernel's socket carry the whole
 * connection again, with nothing held by libsovia, for a call libsovia
 * cannot serve (fork, exec, epoll, dup, sendfile, ...). Blocks, bounded by
 * SOVIA_UPGRADE_TIMEOUT_MS, while an upgrade in progress settles and the
 * peer gives back what we sent and it did not read. Returns 0 when the fd
 * is plain TCP now (also when it always was); -EBUSY when bytes libsovia
 * holds cannot be given back (the QP is gone), -ETIMEDOUT, or the
 * connection's error: then the stream stays libsovia's. */
int sv_stream_detach(struct sv_stream *s);
/* FIONREAD: the bytes readable now (ours, and the kernel's when TCP carries
 * the receive side). */
long sv_stream_inq(struct sv_stream *s);
/* The fd's mode may have changed (fcntl F_SETFL, ioctl FIONBIO): the next
 * call looks at it again. */
void sv_stream_mode_changed(struct sv_stream *s);
/* In a fork's child: the parent's streams are not the child's. */
void sv_stream_atfork_child(void);

/* Exit: push out everything held back and wait (bounded) for delivery. */
void sv_stream_exit_flush(struct sv_stream *s);
void sv_stream_exit_flush_all(void);

/* SOVIA_STATS: one line per connection on stderr. */
void sv_stream_print_stats(struct sv_stream *s, const char *when);

#endif
