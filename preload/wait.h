/* Waiting over a mix of kernel fds and accelerated streams: poll.c serves
 * poll/ppoll (and select through them), epoll.c serves epoll. */
#ifndef SV_WAIT_H
#define SV_WAIT_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>

/* poll() over fds some of which may be streams. timeout_ms < 0: forever.
 * `mask`: ppoll's signal mask, or NULL. With `return_on_wake`, a wake-up by
 * a stream that leaves nothing ready returns 0 at once instead of judging
 * again (the caller has its own rules to apply). Returns the count of fds
 * with revents, or -errno. */
int sv_poll_mixed(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask,
		  bool return_on_wake);

/* fd's connection became plain TCP: epoll sets libsovia watched it for
 * hand it to the kernel's epoll. */
void sv_epoll_fd_plain(int fd);
/* fd is being closed (by close, dup2 or dup3): forget it in every set, and
 * the set it is, if it is one. */
void sv_epoll_on_close(int fd);
/* In a fork's child: the parent's streams are not the child's. */
void sv_epoll_atfork_child(void);

#endif
