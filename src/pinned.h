/* The process's budget of locked memory for its connections' buffers.
 *
 * Registering memory pins it, and the kernel counts what a process pins
 * against RLIMIT_MEMLOCK unless it has CAP_IPC_LOCK. Debian's default (and
 * many containers') is 8 MiB, and each RDMA connection pins its receive and
 * send buffers: past the limit, registration fails. So a connection takes
 * its buffers' share of the budget before it makes its QP; one that does
 * not fit stays on TCP (fallback "memlock"), and the first such connection
 * says so on stderr, with the fix. A quarter of the limit is left for the
 * zero-copy sends' registrations. */
#ifndef SV_PINNED_H
#define SV_PINNED_H

#include <stdbool.h>
#include <stddef.h>

/* Take `bytes` of the budget: 0, or -ENOBUFS when they do not fit (said
 * once per process on stderr). */
int sv_pinned_take(size_t bytes);
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
