/* Shared by the helper's files: helper.c (the thread, rdma_cm, jobs) and
 * helper_watch.c (the streams it watches, and when it looks at them). */
#ifndef SV_HELPER_INT_H
#define SV_HELPER_INT_H

#include "helper.h"

#include <stdint.h>

/* Wake the thread from its epoll_wait. */
void sv_helper_wake(void);

/* helper_watch.c: the epoll set the thread sleeps in (channel copies join
 * it), set once the thread's fds exist. */
void sv_watch_init(int epfd);
/* Look at every watched stream that is due; drop those that are done.
 * Returns the next deadline (0 = none). */
uint64_t sv_watch_service_all(uint64_t now);
/* epoll said a watch's channel copy is readable (its epoll data). */
void sv_watch_fired(void *watch);
/* The fd table's epoll data of the thread's own fds; anything else is a
 * watch. */
#define SV_EV_WAKE 1u
#define SV_EV_CM 2u
/* In a fork's child: the parent's watches are the parent's. */
void sv_watch_atfork_child(void);

#endif
