/* Receiving one fd over a Unix socket (SCM_RIGHTS), for the tests that
 * play a warden (sending: src/fdpass.h). */
#ifndef SV_TEST_FDRECV_H
#define SV_TEST_FDRECV_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Receive up to len bytes into buf, and the fd that came with them in
 * *fd (-1: none): what recvmsg returns. */
static inline ssize_t fdpass_recv(int sock, void *buf, size_t len, int *fd, int flags)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} cb;
	struct iovec iov = {buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
			    .msg_controllen = sizeof(cb.b)};
	ssize_t n = recvmsg(sock, &mh, flags);
	struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL;
	*fd = -1;
	if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
		memcpy(fd, CMSG_DATA(cm), sizeof(int));
	return n;
}

#endif
