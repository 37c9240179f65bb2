/* The helper thread (SOVIA's connection and close thread): rdma_cm events
 * for upgrades and listeners, timers of connections nobody is calling
 * into, the TCP pump during a switch, and lingering closes. It sleeps in
 * poll() when nothing needs it: no busy polling. */
#ifndef SV_HELPER_H
#define SV_HELPER_H

#include <stdbool.h>
#include <stdint.h>

struct rdma_event_channel;
struct sv_stream;

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
