/* The library's side of sovia-warden (warden.h): a server's RDMA listener
 * registered with the warden of its host, for as long as it lives. */
#include "warden.h"

#include "log.h"
#include "ownfd.h"
#include "real.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

const char *sv_warden_path = SV_WARDEN_SOCKET;

/* The registrations' connections, by handle. Each remembers the process
 * that made it: a fork's child holds copies of its parent's, which only
 * the parent may end. */
struct reg {
	int fd; /* -1: free */
	pid_t pid;
};
static struct reg *regs;
static int nregs;

static int new_handle(int fd)
{
	for (int i = 0; i < nregs; i++) {
		if (regs[i].fd < 0) {
			regs[i] = (struct reg){fd, getpid()};
			return i;
		}
	}
	struct reg *more = realloc(regs, (size_t)(nregs + 16) * sizeof(*more));
	if (!more)
		return -ENOMEM;
	regs = more;
	for (int i = nregs; i < nregs + 16; i++)
		regs[i].fd = -1;
	int h = nregs;
	nregs += 16;
	regs[h] = (struct reg){fd, getpid()};
	return h;
}

/* Send the registration with listen_fd and wait for the answer. */
static int ask(int fd, int listen_fd, uint16_t rdma_port, int timeout_ms)
{
	uint8_t msg[SV_WARDEN_MSG_LEN];
	sv_warden_msg_encode(rdma_port, msg);
	struct iovec iov = {msg, sizeof(msg)};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} c;
	memset(&c, 0, sizeof(c));
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
			    .msg_controllen = sizeof(c.buf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &listen_fd, sizeof(int));
	ssize_t w = SV_REAL(sendmsg)(fd, &mh, MSG_NOSIGNAL);
	if (w != (ssize_t)sizeof(msg))
		return w < 0 ? -errno : -EIO;
	if (timeout_ms == 0)
		return 0; /* a refusal closes the connection: the warden forgets it */
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int n;
	do
		n = SV_REAL(poll)(&p, 1, timeout_ms);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n < 0 ? -errno : -ETIMEDOUT;
	char yes = 0;
	ssize_t k;
	do
		k = SV_REAL(recv)(fd, &yes, 1, MSG_DONTWAIT);
	while (k < 0 && errno == EINTR);
	return k == 1 && yes == 'y' ? 0 : -EACCES;
}

int sv_warden_register(const char *path, int listen_fd, uint16_t rdma_port, int timeout_ms)
{
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(un.sun_path))
		return -ENAMETOOLONG;
	strcpy(un.sun_path, path);
	int fd = SV_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r;
	if (SV_REAL(connect)(fd, (struct sockaddr *)&un, sizeof(un)) < 0) {
		/* No warden on this host (or not reachable from here): the
		 * listener is asked directly, as without one. */
		r = errno == ECONNREFUSED || errno == ENOTDIR ? -ENOENT : -errno;
		goto close_fd;
	}
	/* The listening socket goes only to root (or to ourselves: a test's
	 * warden), whoever holds the path. */
	struct ucred uc;
	socklen_t len = sizeof(uc);
	if (SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
		r = -errno;
		goto close_fd;
	}
	if (uc.uid != 0 && uc.uid != geteuid()) {
		sv_warn("%s is not root's (uid %u): no listener is registered there", path,
			(unsigned)uc.uid);
		r = -EPERM;
		goto close_fd;
	}
	r = ask(fd, listen_fd, rdma_port, timeout_ms);
	if (r < 0) {
		sv_info("sovia-warden did not take our listener at port %u: %s", rdma_port,
			strerror(-r));
		goto close_fd;
	}
	fd = sv_ownfd_move(fd); /* out of the application's range, kept from close-all loops */
	r = new_handle(fd);
	if (r < 0)
		goto close_fd;
	return r;

close_fd:
	sv_ownfd_close(fd);
	return r;
}

void sv_warden_unregister(int handle)
{
	if (handle < 0 || handle >= nregs || regs[handle].fd < 0)
		return;
	if (regs[handle].pid == getpid())
		sv_ownfd_close(regs[handle].fd);
	regs[handle].fd = -1;
}

void sv_warden_atfork_child(void)
{
	for (int i = 0; i < nregs; i++) {
		if (regs[i].fd >= 0)
			sv_ownfd_close(regs[i].fd);
		regs[i].fd = -1;
	}
}
