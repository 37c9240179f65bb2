/* Passing one fd over a Unix socket (SCM_RIGHTS), for the tests that play
 * a warden or its registrant. */
#ifndef SV_TEST_FDPASS_H
#define SV_TEST_FDPASS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Send len bytes of buf with fd: what sendmsg returns. */
static inline ssize_t fdpass_send(int sock, const void *buf, size_t len, int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} cb;
	memset(&cb, 0, sizeof(cb));
	struct iovec iov = {(void *)buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
			    .msg_controllen = sizeof(cb.b)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &mh, 0);
}

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
