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
/* fd's connection is plain TCP now: its entry becomes the kernel's. */
void sv_fd_make_plain(int fd);
/* ... and so for every fd of the stream (its dup copies). */
struct sv_stream;
void sv_fd_make_plain_all(struct sv_stream *s);
/* nfd is the kernel's dup of one of stream s's fds: it becomes the same
 * stream. false: it could not (nfd stays plain; the stream must go back). */
bool sv_ops_add_copy(int nfd, struct sv_stream *s);
/* In a fork's child: every entry of ours becomes the kernel's (the child
 * has none of the parent's threads, RDMA listeners or queue pairs). */
void sv_ops_atfork_child(void);
/* The process is exiting. */
void sv_on_exit(void);

#endif
