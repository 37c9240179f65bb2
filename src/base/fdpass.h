/* Passing one of our fds to another process over a Unix socket
 * (SCM_RIGHTS): sovia-stat's view (helper_stat.c), a listener's
 * registration with sovia-warden (warden.c). */
#ifndef SV_FDPASS_H
#define SV_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* Send len bytes of buf with fd, through the real sendmsg: what it
 * returns. */
ssize_t sv_fd_send(int sock, const void *buf, size_t len, int fd, int flags);

#endif
