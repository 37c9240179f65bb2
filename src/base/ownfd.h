/* libsovia's own descriptors (a sleeping thread's eventfd, a device's
 * completion channel, the helper's, a lingering connection's copy of its
 * socket) are numbered above the application's range: a program's own fds
 * stay low, where select's FD_SETSIZE and fd-indexed tables expect them. */
#ifndef SV_OWNFD_H
#define SV_OWNFD_H

#include <stdbool.h>

/* The lowest number for libsovia's own fds: 1000, or 64 below the soft
 * RLIMIT_NOFILE when that is lower. */
int sv_ownfd_base(void);

/* The registry of libsovia's own fds (its copies, channels, eventfds, the
 * verbs context's files): the close wrappers refuse them to the
 * application (a daemon's close-all loop, close_range, closefrom), whose
 * fds they are not. A bit per fd number, in pages made as fds need them:
 * no bound below the kernel's own (fs.nr_open: up to SV_OWNFD_MAX; one
 * above that, said once, is not protected). Lock-free: close is
 * async-signal-safe, and so is the check. */
#define SV_OWNFD_MAX (1 << 23)
void sv_ownfd_add(int fd);
void sv_ownfd_del(int fd);
bool sv_ownfd_is(int fd);
/* Close one of ours (out of the registry first). */
int sv_ownfd_close(int fd);
/* The lowest of our fds at or above `from`, or -1. */
int sv_ownfd_next(unsigned from);

/* A close-on-exec copy of fd at or above sv_ownfd_base(), or at any free
 * number when none is free up there; registered. The copy or -errno. */
int sv_ownfd_dup(int fd);

/* The same, only at or above sv_ownfd_base(): -EMFILE when none is free
 * there. */
int sv_ownfd_dup_above(int fd);

/* Move fd (libsovia's, not the application's) to a number at or above
 * sv_ownfd_base(), close-on-exec, and register it. Returns the new
 * number, or fd itself (unmoved, still valid) when no such number is
 * free. */
int sv_ownfd_move(int fd);

#endif
