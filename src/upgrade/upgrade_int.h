/* Shared by the upgrade's files: upgrade.c (the start, the lock, the
 * events' dispatch, the ids' end), upgrade_listen.c (listeners) and
 * upgrade_server.c (requests and the accepted connections they wait for).
 *
 * Every rdma_cm event is handled on the helper thread with up_lock held,
 * and a connection's id is destroyed under the same lock: an event never
 * sees a freed connection, and rdma_destroy_id never waits for an
 * unacknowledged event. */
#ifndef SV_UPGRADE_INT_H
#define SV_UPGRADE_INT_H

#include "upgrade.h"

#include "cm.h"
#include "cmdata.h"
#include "holders.h"
#include "lock.h"

#include <stdatomic.h>

extern struct sv_lock sv_up_lock;
/* The connections' side (sv_upgrade_serve_conns). */
extern struct sv_upgrade_conns sv_up_conns;

/* Context pointers of listeners carry this tag, so an event tells a
 * listener's id from a connection's. */
#define SV_LISTENER_TAG ((uintptr_t)1)

/* A listening socket's RDMA listener (upgrade_listen.c), also a fork
 * child's for the connections handed to it (upgrade_server.c). */
struct sv_listener {
	struct rdma_cm_id *id;
	struct sockaddr_storage addr;
	int fd;
	/* An IPv6 listening socket with IPV6_V6ONLY: its RDMA listener on
	 * the IPv6 wildcard takes no IPv4 client (another socket may serve
	 * IPv4 on the port: nginx's "listen 80; listen [::]:80"). */
	bool v6only;
	/* Holders, under up_lock: the application's listening fd, a queued
	 * creation job, and each accepted connection still waiting for its
	 * upgrade request. The application may close its listening socket
	 * right after accept() (nc -l does): like TCP's, the connections it
	 * accepted must not suffer, so the RDMA listener outlives the fd. */
	int refs;
	bool failed; /* no RDMA listener could be had on its address */
	struct sv_holders *holders; /* the family's table (NULL: none) */
	/* sv_holders_era when the table was had: another now, and this
	 * process left that family (its entries are told, not added). */
	unsigned holders_era;
	/* A fork child's, for a listening socket it inherited: its RDMA
	 * listener is on the same address, at side_port (once open). */
	bool inherited;
	atomic_bool side_started; /* its opening was asked for */
	uint16_t side_port;
	/* A fork child's for the connections handed to it (no listening
	 * socket: fd -1), one per address, in `adopters`. */
	bool adopter;
	struct sv_listener *next_adopter;
};

/* Drop a hold on a listener (the last frees it, its id and its warden
 * registration). With up_lock. */
void sv_up_listener_put(struct sv_listener *l);
/* upgrade_server.c: an inherited listener's accepted connections go into
 * the holders' table once its RDMA listener is open. With up_lock. */
void sv_up_enter_holders(struct sv_listener *l);
/* upgrade_server.c: a connect request arrived on a listener. A refused id
 * is left in *destroy: it may not be destroyed while its own event is not
 * acknowledged yet. */
void sv_up_connect_request(struct rdma_cm_event *ev, struct rdma_cm_id **destroy);
/* upgrade_server.c: the releases of entries finished with up_lock held,
 * done without it. */
void sv_up_run_releases(void);
/* Take and handle every pending event of the channel (the helper's, when
 * it is readable). */
void sv_upgrade_events(struct rdma_event_channel *ch);
/* Expire pending requests (every wake-up of the helper): the next
 * deadline (0 = none). */
uint64_t sv_upgrade_timers(uint64_t now);

#endif
