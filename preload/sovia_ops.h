/* The accelerated fds' operations and the hooks the interposed calls use. */
#ifndef SV_SOVIA_OPS_H
#define SV_SOVIA_OPS_H

#include "preload.h"

extern struct sv_fd_ops sv_stream_ops; /* completed by sv_ops_init */

/* Once, at initialisation. */
void sv_ops_init(void);

/* listen() succeeded on fd: open the RDMA listener beside it. */
void sv_on_listen(int fd);
/* accept() on listening lfd returned fd. */
void sv_on_accepted(int lfd, int fd);
/* connect() on fd succeeded. */
void sv_on_connected(int fd);
/* A non-blocking connect() on fd is in progress. */
void sv_on_connecting(int fd);
/* The process is exiting. */
void sv_on_exit(void);

#endif
