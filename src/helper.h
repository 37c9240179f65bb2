/* The helper thread (SOVIA's connection/close thread): rdma_cm events for
 * upgrades and listeners, timers of connections nobody is calling into, the
 * TCP pump during a switch, and lingering closes. It sleeps in epoll_wait
 * when nothing needs it: no busy polling. */
#ifndef SV_HELPER_H
#define SV_HELPER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct rdma_cm_id;
struct rdma_event_channel;
struct sv_stream;
struct sv_listener;

/* Start the thread and the rdma_cm event channel (once). 0 or -errno. */
int sv_helper_start(void);

/* The shared rdma_cm event channel (after sv_helper_start). */
struct rdma_event_channel *sv_helper_channel(void);

/* Service this stream until it says it is done (takes a reference). */
void sv_helper_watch(struct sv_stream *s);

/* The stream is being freed: destroy its QP and rdma_cm id (upgrade.c). */
void sv_upgrade_forget(struct sv_stream *s);

/* Process exit: flush every stream. */
void sv_helper_exit_flush(void);

/* Set once exit has begun: later writes complete before they return. */
extern atomic_bool sv_exiting;

/* ---- The upgrade (upgrade.c), on top of the helper ---------------------- */

/* Client: the TCP connection is up; try to move it to RDMA (asynchronous). */
void sv_upgrade_connect(struct sv_stream *s);

/* Server: the application accepted this connection; a request may match it. */
void sv_upgrade_accepted(struct sv_stream *s);

/* Server: the application listens on fd; listen for upgrades on the same
 * address and port. NULL when RDMA is not available there (not an error). */
struct sv_listener *sv_upgrade_listen(int fd);
void sv_upgrade_unlisten(struct sv_listener *l);

/* Called by the helper for every rdma_cm event. */
struct rdma_cm_event;
void sv_upgrade_event(struct rdma_cm_event *ev);
/* Called by the helper on every wake-up: expire pending requests. Returns
 * the next deadline (0 = none). */
uint64_t sv_upgrade_timers(uint64_t now);

#endif
