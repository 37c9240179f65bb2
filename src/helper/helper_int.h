/* Shared by the helper's files: helper.c (the thread, rdma_cm, jobs) and
 * helper_watch.c (the streams it watches, and when it looks at them). */
#ifndef SV_HELPER_INT_H
#define SV_HELPER_INT_H

#include "helper.h"

#include <stdbool.h>
#include <stdint.h>

/* Wake the thread from its sleep. */
void sv_helper_wake(void);

/* What the modules above gave (helper.h): read-only once the thread runs. */
extern struct sv_helper_hooks sv_helper_hooks;

/* helper_watch.c: look at every watched stream that is due; drop those
 * that are done. Returns the next deadline (0 = none); *on_hub when some
 * stream's CQ is armed for the helper, which must then sleep on the hub. */
uint64_t sv_watch_service_all(uint64_t now, bool *on_hub);
/* In a fork's child: the parent's watches are the parent's. */
void sv_watch_atfork_child(void);
/* The TCP sockets of idle streams on RDMA, watched for a peer's resume
 * record (at most max); a readable one gets its stream looked at. */
struct pollfd;
int sv_watch_tcp_fds(struct pollfd *out, int max);
void sv_watch_kick_fd(int fd);

/* helper_stat.c: the listening socket sovia-stat asks (an fd, or -errno),
 * and the answers to whoever connected. */
int sv_stat_open(void);
void sv_stat_serve(int lfd);
/* listen() again: the credentials askers see become the process's now. */
void sv_stat_listen_again(int lfd);

#endif
