/* The helper thread (SOVIA's connection and close thread): rdma_cm events
 * for upgrades and listeners, timers of connections nobody is calling
 * into, the TCP pump during a switch, and lingering closes. It sleeps in
 * poll() when nothing needs it: no busy polling. */
#ifndef SV_HELPER_H
#define SV_HELPER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct rdma_event_channel;
struct sv_stream;
struct sv_watch;
struct sv_hub_node;

/* ---- What the modules above it give the helper ------------------------------ */

/* A look at a watched stream (its hooks' service fills it in; the policy
 * of when to look again is the helper's, helper_watch.c). */
struct sv_service {
	/* in */
	uint64_t now;
	bool fired;    /* its armed CQ fired since the helper armed it */
	bool try_only; /* the application drove it at the last look: if it holds
			* the lock now it is inside libsovia and runs the
			* timers itself, so do not queue behind it */
	/* out */
	bool done;     /* the stream needs the helper no more */
	bool driven;   /* on RDMA, its application drives it: the helper only
			* looks now and then (or sleeps on the channel) */
	bool active;   /* ... and it called in since the last look (or holds
			* the lock now) */
	bool armed;    /* idle: the CQ is armed, the helper sleeps on the hub */
	bool timed;    /* only its clock moves it (the upgrade's steps, a switch,
			* a lingering close): look at `next` or when kicked,
			* not at every wake-up of the helper */
	uint64_t next; /* the stream's own next deadline (0 = none) */
	uint64_t flush_deadline; /* coalesced bytes wait for this (0 = none) */
	int tcp_fd;    /* idle on RDMA: its TCP socket, to watch for the peer's
			* resume record (a look when readable); -1: none */
};
/* One connection, as sovia-stat(8) (the helper's view, helper_stat.c) and
 * include/sovia.h report it. */
enum sv_view_medium { SV_VIEW_NONE, SV_VIEW_TCP, SV_VIEW_RDMA };
struct sv_conn_view {
	int fd;       /* the application's fd, -1: libsovia's own copy (after a dup) */
	bool closing; /* the application closed it; libsovia lingers */
	bool is_client;
	enum sv_view_medium tx, rx;
	const char *state, *fallback; /* static names */
	const char *call; /* fallback unsupported-call: the call (one word), else NULL */
	struct sockaddr_storage local, peer;
	uint64_t rdma_tx_bytes, rdma_rx_bytes, tcp_tx_bytes, tcp_rx_bytes;
	uint64_t credit_stalls, time_to_rdma_us;
};
/* The helper serves the modules above it through these, which they give
 * it at their start (sv_upgrade_init, sv_stream_init, sv_share_init):
 * its calls up go through them, never by name. */
struct sv_helper_hooks {
	/* The streams it watches (sv_helper_watch): a reference, the node
	 * their wake-ups go to (hub.h), a look, and where each keeps the
	 * helper's record of its watch (read and set under the helper's
	 * lock only). */
	void (*get)(struct sv_stream *s);
	void (*put)(struct sv_stream *s);
	struct sv_hub_node *(*node)(struct sv_stream *s);
	void (*service)(struct sv_stream *s, struct sv_service *sv);
	struct sv_watch **(*watch_slot)(struct sv_stream *s);
	/* Every connection's view, for sovia-stat. */
	void (*view_all)(void (*fn)(const struct sv_conn_view *v, void *arg), void *arg);
};
void sv_helper_serve_streams(const struct sv_helper_hooks *hooks);
/* rdma_cm's events on the channel, taken and handled under the lock that
 * lock/unlock take (the ids move to a new channel under it too). */
void sv_helper_serve_cm(void (*events)(struct rdma_event_channel *ch), void (*lock)(void),
			void (*unlock)(void));
/* Work of every round, before the streams' looks (a copy's claim is
 * answered before its stream is looked at) or after them (requests that
 * wait): the next deadline, or 0. At most a few of each. */
enum sv_helper_phase { SV_HELPER_BEFORE_LOOKS, SV_HELPER_AFTER_LOOKS };
void sv_helper_each_round(enum sv_helper_phase phase, uint64_t (*fn)(uint64_t now));

/* ---- Its calls ------------------------------------------------------------------- */

/* Where each process answers sovia-stat (helper_stat.c): a unix socket
 * SV_STAT_DIR.EUID/PID, in a directory of that user's alone. */
#define SV_STAT_DIR "/dev/shm/libsovia-stat"


/* Start the thread (once); it then sets up rdma_cm by itself. 0 or -errno. */
int sv_helper_start(void);

/* rdma_cm on the helper: 0 still starting, 1 ready, -errno unavailable. */
int sv_helper_rdma_state(void);
/* When rdma_cm became ready (sv_now_us), 0 while it is not. */
uint64_t sv_helper_rdma_ready_us(void);
/* The process changed its credentials (`call`, e.g. "seteuid"). The
 * kernel then refuses every rdma_cm call on a channel opened before
 * (preload/creds.c): the helper opens a new one and moves the ids to it,
 * and from then on only the helper calls rdma_cm. */
void sv_helper_creds_changed(const char *call);
/* rdma_cm could not follow a credential change: RDMA is over for new
 * connections (sv_helper_rdma_state() reports -EACCES; else, while it is
 * < 0, there is no RDMA here). */
bool sv_helper_creds_stale(void);
/* May this thread call rdma_cm now: the helper always, any thread until
 * the first credential change. */
bool sv_helper_may_call_cm(void);
/* Run fn(arg, 0) on the helper, soon, after the work queued before it
 * (rdma_cm calls of a thread that may not make them). 0, or -errno (no
 * helper: fn is not called). */
int sv_helper_defer(void (*fn)(void *arg, int rdma_err), void *arg);

/* Run fn(arg, rdma_err) on the helper once rdma_cm is ready (rdma_err 0) or
 * known to be unavailable (-errno). Returns 0 when queued; 1 when it is
 * ready already and -errno when unavailable (the caller goes on itself, fn
 * is not called). */
int sv_helper_when_ready(void (*fn)(void *arg, int rdma_err), void *arg);

/* The shared rdma_cm event channel (after sv_helper_start). */
struct rdma_event_channel *sv_helper_channel(void);

/* Service this stream until it says it is done (takes a reference); if it
 * is watched already, have it looked at now. */
void sv_helper_watch(struct sv_stream *s);

/* The eventfd that wakes the helper (-1 before it started). A fork's
 * children that get a copy of it wake this process's helper
 * (sv_shares_claim). */
int sv_helper_wake_fd(void);

/* In a fork's child: no helper thread runs there; forget the parent's
 * state so that the child's first connection starts its own. */
void sv_helper_atfork_child(void);

#endif
