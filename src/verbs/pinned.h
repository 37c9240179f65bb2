/* The process's budget of locked memory for its connections' buffers.
 *
 * Registering memory pins it, and the kernel counts what a process pins
 * against RLIMIT_MEMLOCK unless it has CAP_IPC_LOCK. Debian's default (and
 * many containers') is 8 MiB, and each RDMA connection pins its receive and
 * send buffers: past the limit, registration fails. So a connection takes
 * its buffers' share of the budget before it makes its QP. One that does
 * not fit waits for room (on TCP meanwhile: the connections closed a
 * moment ago still hold theirs until their QPs are gone) until its upgrade
 * times out; then, or at once if it could never fit, it stays on TCP
 * (fallback "memlock"), and the first such connection says so on stderr,
 * with the fix. A quarter of the limit is left for the zero-copy sends'
 * registrations. */
#ifndef SV_PINNED_H
#define SV_PINNED_H

#include <stdbool.h>
#include <stddef.h>

/* Take `bytes` of the budget for a new connection: 0, or -ENOBUFS when
 * they do not fit now. The next give-back after a refusal calls the room
 * hook (sv_pinned_on_room), so the connection may ask again then. */
int sv_pinned_take(size_t bytes);
/* Could `bytes` ever fit (the whole budget free)? */
bool sv_pinned_fits_ever(size_t bytes);
/* A connection stays on TCP for want of `bytes`: said once per process on
 * stderr, with the fix. */
void sv_pinned_tell(size_t bytes);
/* Called after a give-back that followed a refused sv_pinned_take (any
 * thread, any lock held: it must only wake someone). */
void sv_pinned_on_room(void (*fn)(void));
/* Take `bytes` for buffers that grow (verbs.c): only while a quarter of
 * the budget stays free for new connections; -ENOBUFS, silently, if not. */
int sv_pinned_take_growth(size_t bytes);
/* What pinning `bytes` from a page boundary takes: whole pages. */
size_t sv_pinned_pages(size_t bytes);
/* Give back what sv_pinned_take or sv_pinned_take_growth took. */
void sv_pinned_give(size_t bytes);
/* Bytes taken now. */
size_t sv_pinned_taken(void);

/* The budget: from RLIMIT_MEMLOCK at first use; none (SIZE_MAX) with
 * CAP_IPC_LOCK or no limit. A test sets its own. */
size_t sv_pinned_budget(void);
void sv_pinned_set_budget(size_t bytes);

/* In a fork's child: nothing of the parent's is pinned for it. */
void sv_pinned_atfork_child(void);

#endif
