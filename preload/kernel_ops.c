/* The kernel's operations for a managed fd: plain passthrough. A TCP socket
 * that is not (or no longer) accelerated uses these. */
#include "preload.h"
#include "real.h"

static ssize_t k_recvmsg(struct sv_fd *f, struct msghdr *msg, int flags)
{
	ssize_t r = sv_real.recvmsg(f->fd, msg, flags);
	return r < 0 ? -errno : r;
}

static ssize_t k_sendmsg(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	ssize_t r = sv_real.sendmsg(f->fd, msg, flags);
	return r < 0 ? -errno : r;
}

static int k_shutdown(struct sv_fd *f, int how)
{
	return sv_real.shutdown(f->fd, how) < 0 ? -errno : 0;
}

static int k_setsockopt(struct sv_fd *f, int level, int name, const void *val, socklen_t len)
{
	return sv_real.setsockopt(f->fd, level, name, val, len) < 0 ? -errno : 0;
}

static int k_getsockopt(struct sv_fd *f, int level, int name, void *val, socklen_t *len)
{
	return sv_real.getsockopt(f->fd, level, name, val, len) < 0 ? -errno : 0;
}

static int k_close(struct sv_fd *f)
{
	return sv_real.close(f->fd) < 0 ? -errno : 0;
}

const struct sv_fd_ops sv_kernel_ops = {
	.name = "kernel",
	.recvmsg = k_recvmsg,
	.sendmsg = k_sendmsg,
	.shutdown = k_shutdown,
	.setsockopt = k_setsockopt,
	.getsockopt = k_getsockopt,
	.close = k_close,
	.release = NULL,
};
