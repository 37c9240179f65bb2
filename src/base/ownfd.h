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
 * fds they are not. Lock-free: close is async-signal-safe, and so is the
 * check. At most SV_OWNFD_SLOTS at once; beyond that an fd is simply not
 * protected. */
#define SV_OWNFD_SLOTS 256
void sv_ownfd_add(int fd);
void sv_ownfd_del(int fd);
bool sv_ownfd_is(int fd);
/* Close one of ours (out of the registry first). */
int sv_ownfd_close(int fd);
/* Up to max of our fds in [first, last], ascending; returns how many. */
int sv_ownfd_in(unsigned first, unsigned last, int *out, int max);

/* A close-on-exec copy of fd at or above sv_ownfd_base(), or at any free
 * number when none is free up there; registered. The copy or -errno. */
int sv_ownfd_dup(int fd);

/* Move fd (libsovia's, not the application's) to a number at or above
 * sv_ownfd_base(), close-on-exec, and register it. Returns the new
 * number, or fd itself (unmoved, still valid) when no such number is
 * free. */
int sv_ownfd_move(int fd);

#endif
