/* libsovia's own descriptors (a stream's wake-up eventfd, a connection's
 * completion channel, the helper's, a lingering connection's copy of its
 * socket) are numbered above the application's range: a program's own fds
 * stay low, where select's FD_SETSIZE and fd-indexed tables expect them. */
#ifndef SV_OWNFD_H
#define SV_OWNFD_H

/* The lowest number for libsovia's own fds: 1000, or 64 below the soft
 * RLIMIT_NOFILE when that is lower. */
int sv_ownfd_base(void);

/* A close-on-exec copy of fd at or above sv_ownfd_base(), or at any free
 * number when none is free up there. The copy or -errno. */
int sv_ownfd_dup(int fd);

/* Move fd (libsovia's, not the application's) to a number at or above
 * sv_ownfd_base(), close-on-exec. Returns the new number, or fd itself
 * (unmoved, still valid) when no such number is free. */
int sv_ownfd_move(int fd);

#endif
