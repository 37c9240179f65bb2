/* The library's side of sovia-warden (warden.h): a server's RDMA listener
 * registered with the warden of its host, for as long as it lives. */
#include "warden.h"

#include "fdpass.h"
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

/* The registrations' connections, by handle (-1: free). A fork's child
 * closes its copies at once (sv_warden_atfork_child), so every one here
 * is this process's. */
static int *regs;
static int nregs;

static int new_handle(int fd)
{
	for (int i = 0; i < nregs; i++) {
		if (regs[i] < 0) {
			regs[i] = fd;
			return i;
		}
	}
	int *more = realloc(regs, (size_t)(nregs + 16) * sizeof(*more));
	if (!more)
		return -ENOMEM;
	regs = more;
	for (int i = nregs; i < nregs + 16; i++)
		regs[i] = -1;
	int h = nregs;
	nregs += 16;
	regs[h] = fd;
	return h;
}

/* Send the registration with listen_fd and wait for the answer. */
static int ask(int fd, int listen_fd, uint16_t rdma_port, int timeout_ms)
{
	uint8_t msg[SV_WARDEN_MSG_LEN];
	sv_warden_msg_encode(rdma_port, msg);
	ssize_t w = sv_fd_send(fd, msg, sizeof(msg), listen_fd, MSG_NOSIGNAL);
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
	if (handle < 0 || handle >= nregs || regs[handle] < 0)
		return;
	sv_ownfd_close(regs[handle]);
	regs[handle] = -1;
}

void sv_warden_atfork_child(void)
{
	for (int i = 0; i < nregs; i++) {
		if (regs[i] >= 0)
			sv_ownfd_close(regs[i]);
		regs[i] = -1;
	}
}
