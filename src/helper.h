/* The helper thread (SOVIA's connection/close thread): rdma_cm events for
 * upgrades and listeners, timers of connections nobody is calling into, the
 * TCP pump during a switch, and lingering closes. It sleeps in epoll_wait
 * when nothing needs it: no busy polling. */
#ifndef SV_HELPER_H
#define SV_HELPER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "stream.h"

struct rdma_cm_id;
struct rdma_event_channel;
struct sv_stream;
struct sv_listener;

/* Start the thread (once); it then sets up rdma_cm by itself. 0 or -errno. */
int sv_helper_start(void);

/* rdma_cm on the helper: 0 still starting, 1 ready, -errno unavailable. */
int sv_helper_rdma_state(void);
/* The process changed its credentials (`call`, e.g. "seteuid"). Once the
 * helper runs, RDMA files opened before are unusable (preload/creds.c):
 * sv_helper_rdma_state() reports -EACCES from then on. */
void sv_helper_creds_changed(const char *call);
/* Why a connection cannot be upgraded while sv_helper_rdma_state() < 0. */
enum sv_fallback sv_helper_no_rdma_reason(void);

/* Run fn(arg, rdma_err) on the helper once rdma_cm is ready (rdma_err 0) or
 * known to be unavailable (-errno). Returns 0 when queued; 1 when it is
 * ready already and -errno when unavailable (the caller goes on itself, fn
 * is not called). */
int sv_helper_when_ready(void (*fn)(void *arg, int rdma_err), void *arg);

/* The shared rdma_cm event channel (after sv_helper_start). */
struct rdma_event_channel *sv_helper_channel(void);

/* Service this stream until it says it is done (takes a reference). */
void sv_helper_watch(struct sv_stream *s);

/* The stream is being freed: destroy its QP and rdma_cm id (upgrade.c). */
void sv_upgrade_forget(struct sv_stream *s);
/* rdma_disconnect on the stream's id, and our QP to the error state so that
 * everything posted is flushed (librdmacm does that only for its own QPs). */
void sv_upgrade_disconnect(struct sv_stream *s);

/* In a fork's child: no helper thread runs there; forget the parent's
 * state so that the child's first connection starts its own. */
void sv_helper_atfork_child(void);
void sv_upgrade_atfork_child(void);

/* Process exit: flush every stream. */
void sv_helper_exit_flush(void);

/* Set once exit has begun: later writes complete before they return. */
extern atomic_bool sv_exiting;

/* ---- The upgrade (upgrade.c), on top of the helper ---------------------- */

/* Client: the TCP connection is up; try to move it to RDMA (asynchronous). */
void sv_upgrade_connect(struct sv_stream *s);
/* The same, at once (sv_upgrade_connect waits SOVIA_UPGRADE_DELAY_MS). */
void sv_upgrade_connect_now(struct sv_stream *s);

/* Server: the application accepted this connection; a request may match it. */
void sv_upgrade_accepted(struct sv_stream *s, struct sv_listener *l);

/* Server: the application listens on fd; listen for upgrades on the same
 * address and port. NULL when RDMA is not available there (not an error). */
struct sv_listener *sv_upgrade_listen(int fd);
/* False once it is known that no RDMA listener could be opened. */
bool sv_upgrade_listener_usable(struct sv_listener *l);
void sv_upgrade_unlisten(struct sv_listener *l);

/* Called by the helper when the rdma_cm channel is readable: takes and
 * handles every pending event. */
void sv_upgrade_events(struct rdma_event_channel *ch);
/* Called by the helper on every wake-up: expire pending requests. Returns
 * the next deadline (0 = none). */
uint64_t sv_upgrade_timers(uint64_t now);

#endif
