/* The upgrade's rdma_cm side, as the modules above use it: the listeners
 * beside listening sockets, the requests they take and the connections
 * those wait for, the lock every rdma_cm event is handled under, and what
 * the connections give it (struct sv_upgrade_conns). A connection's own
 * part (asking the server, its id's events, its QP) is the stream's
 * (src/stream/stream_cm.c). */
#ifndef SV_UPGRADE_H
#define SV_UPGRADE_H

#include "cmdata.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct rdma_cm_event;
struct rdma_cm_id;
struct sv_hand;
struct sv_holders;
struct sv_listener;
struct sv_stream;

/* ---- The module ----------------------------------------------------------------- */

/* What becomes of a request the connection it is for was asked to take. */
enum sv_accept_result {
	SV_ACCEPTED,     /* or rejected: the id is the connection's now */
	SV_REFUSED,      /* it cannot take it: the request is rejected */
	SV_ACCEPT_LATER, /* not used yet, or its buffers wait for room: ask again */
	SV_NOT_HERE      /* handed to a fork's child: the request is the child's */
};

/* Where an accepted connection stands while its request may still come. */
enum sv_conn_wait {
	SV_WAIT_ON,     /* waiting, in this process */
	SV_WAIT_HANDED, /* handed to a fork's child: its request is redirected there */
	SV_WAIT_GONE    /* upgrading, fallen back or closed: no more waiting */
};

/* Whose an accepted connection is, for the holders' table (holders.h). */
enum sv_conn_holding {
	SV_HOLD_OWN,     /* this process's, accepted here */
	SV_HOLD_ADOPTED, /* handed to this process by its parent: *hand is its entry */
	SV_HOLD_GIVEN    /* handed on to a fork's child of ours, which claims it */
};

/* The connections' side, which the stream module gives at its start
 * (sv_upgrade_serve_conns): the upgrade's calls up go through these. */
struct sv_upgrade_conns {
	void (*get)(struct sv_stream *s);
	void (*put)(struct sv_stream *s);
	/* An event on the connection's own id; *destroy: an id to destroy
	 * once the event is acknowledged. With the upgrade's lock. */
	void (*event)(struct sv_stream *s, struct rdma_cm_event *ev,
		      struct rdma_cm_id **destroy);
	/* A request matched the accepted connection: attach its QP and
	 * accept. With the upgrade's lock. */
	enum sv_accept_result (*take_request)(struct sv_stream *s, struct rdma_cm_id *id,
					      const struct sv_cm_req *req);
	/* Where the accepted connection stands at `now`; *use_wait: until
	 * when its request waits for the application's first use (0: not). */
	enum sv_conn_wait (*waiting)(struct sv_stream *s, uint64_t now, uint64_t *use_wait);
	enum sv_conn_holding (*holding)(struct sv_stream *s, struct sv_hand *hand);
	/* A request that found no accepted connection: one back on TCP here
	 * for (local, peer) moves to RDMA again for it (share's: 1 revived,
	 * 0 later, -1 none, -2 back on TCP for good). Without the lock. */
	int (*revive)(const struct sockaddr_storage *local, const struct sockaddr_storage *peer,
		      struct sv_listener *l);
};

/* The module's start: the helper hands it rdma_cm's events and runs its
 * timers (the requests that wait) at every wake-up. */
void sv_upgrade_init(void);
void sv_upgrade_serve_conns(const struct sv_upgrade_conns *conns);
/* ... and a second life's revive (share's), set apart. */
void sv_upgrade_serve_revive(int (*revive)(const struct sockaddr_storage *local,
					   const struct sockaddr_storage *peer,
					   struct sv_listener *l));

/* Every rdma_cm event is handled under this lock, on the helper, and a
 * connection's id is destroyed under it too: an event never sees a freed
 * connection, and rdma_destroy_id never waits for an event not yet
 * acknowledged. */
void sv_upgrade_lock(void);
void sv_upgrade_unlock(void);

/* Reject a request (the id is the caller's to destroy); with `say`, the
 * rejection says that it is ours, our version and why. */
void sv_upgrade_reject(struct rdma_cm_id *id, bool say, enum sv_cm_rej why);
/* Destroy id (a connection's or a listener's; its context cleared first):
 * at once, or on the helper when this thread may not call rdma_cm
 * (helper.h). With the lock. */
void sv_upgrade_destroy_id(struct rdma_cm_id *id);

/* Hosts whose warden's port had no listener, remembered for a while: a
 * process's next connections there ask the server's port at once. With
 * the lock. */
bool sv_upgrade_no_warden_known(const struct sockaddr_storage *host, uint64_t now);
void sv_upgrade_no_warden_learn(const struct sockaddr_storage *host, uint64_t now);

/* ---- Listeners ------------------------------------------------------------------ */

/* Server: the application listens on fd; listen for upgrades on the same
 * address and port. NULL when RDMA is not available there (not an error). */
struct sv_listener *sv_upgrade_listen(int fd);
/* In a fork's child, for the parent's listener `parent` on the inherited
 * listening socket fd: a listener of the child's, whose RDMA listener opens
 * at its first accept, on any port, and to which the parent redirects the
 * requests for the connections the child accepts (holders.h). NULL when
 * the parent had none. Only reads the parent's object. */
struct sv_listener *sv_upgrade_listen_inherited(const struct sv_listener *parent, int fd);
/* The application is about to accept on l's socket: an inherited
 * listener opens its RDMA listener now, before the first connection needs
 * it (rdma_cm's start in a fresh process is slow). */
void sv_upgrade_will_accept(struct sv_listener *l);
/* False once it is known that no RDMA listener could be opened. */
bool sv_upgrade_listener_usable(struct sv_listener *l);
void sv_upgrade_unlisten(struct sv_listener *l);
/* The family's holders' table of l (NULL: none). */
struct sv_holders *sv_upgrade_listener_holders(const struct sv_listener *l);

/* ---- Accepted connections ---------------------------------------------------------- */

/* How long a request waits for the application's first use of a
 * connection accepted on a listener of the family whose holders' table is
 * h (NULL: none), from now (microseconds). */
uint64_t sv_upgrade_first_use_wait(const struct sv_holders *h);
/* Server: the application accepted s, the connection (local, peer), on
 * l's socket: a request may match it until `deadline`. False: no memory
 * (it stays on TCP). */
bool sv_upgrade_accepted(struct sv_listener *l, struct sv_stream *s,
			 const struct sockaddr_storage *local,
			 const struct sockaddr_storage *peer, uint64_t deadline);
/* A fork's child took s, a connection handed to it (local, peer; the
 * family's table h): it waits for its request at an RDMA listener of the
 * child's on its address, whose port it claims in the holders' table. */
bool sv_upgrade_adopted(struct sv_stream *s, const struct sockaddr_storage *local,
			const struct sockaddr_storage *peer, struct sv_holders *h,
			uint64_t deadline);

/* In a fork's child: the parent's requests and connections are the
 * parent's. */
void sv_upgrade_atfork_child(void);

#endif
