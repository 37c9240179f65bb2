/* The kernel's operations for a managed TCP socket: plain passthrough, and
 * the hooks that may make it libsovia's (a listener, a stream). A socket
 * that is no longer accelerated uses these too, and a listening socket
 * with an RDMA listener beside it is the kernel's in every call. */
#include "real.h"
#include "sovia_ops.h"

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

int sv_kernel_setsockopt(struct sv_fd *f, int level, int name, const void *val, socklen_t len)
{
	return sv_real.setsockopt(f->fd, level, name, val, len) < 0 ? -errno : 0;
}

int sv_kernel_getsockopt(struct sv_fd *f, int level, int name, void *val, socklen_t *len)
{
	return sv_real.getsockopt(f->fd, level, name, val, len) < 0 ? -errno : 0;
}

int sv_kernel_close(struct sv_fd *f)
{
	return sv_real.close(f->fd) < 0 ? -errno : 0;
}

/* Every call the kernel's. */
#define KERNEL_CALLS                                                                        \
	.recvmsg = k_recvmsg, .sendmsg = k_sendmsg, .shutdown = k_shutdown,                 \
	.setsockopt = sv_kernel_setsockopt, .getsockopt = sv_kernel_getsockopt,          \
	.close = sv_kernel_close

const struct sv_fd_ops sv_kernel_ops = {
	.name = "kernel",
	KERNEL_CALLS,
	.listened = sv_socket_listened,
	.connected = sv_socket_connected,
	/* ftpd fdopen()s its active-mode data socket before connect(): its
	 * FILE must close through libsovia once the socket is a stream. */
	.stdio_cookie = true,
};

const struct sv_fd_ops sv_listen_ops = {
	.name = "listen",
	KERNEL_CALLS,
	.release = sv_listen_release,
	.accepted = sv_listen_accepted,
	.will_accept = sv_listen_will_accept,
	.atfork_child = sv_listen_atfork_child,
};
