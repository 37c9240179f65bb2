/* The operations of fds libsovia accelerates: a listening socket (with its
 * RDMA listener) and a connected stream. Every op runs libsovia's code
 * under the re-entry guard, so the libc calls it makes go straight through. */
#include "sovia_ops.h"

#include "guard.h"
#include "helper.h"
#include "log.h"
#include "real.h"
#include "stream.h"
#include "verbs.h"
#include "wait.h"

#include <errno.h>

/* ---- Connected streams -------------------------------------------------- */

static ssize_t st_recvmsg(struct sv_fd *f, struct msghdr *msg, int flags)
{
	sv_enter();
	long r = sv_stream_recvmsg(f->priv, msg, flags);
	sv_leave();
	if (r == -EAGAIN)
		atomic_fetch_add_explicit(&((struct sv_stream *)f->priv)->rx_eagain, 1,
					  memory_order_relaxed);
	return r;
}

static ssize_t st_sendmsg(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	sv_enter();
	long r = sv_stream_sendmsg(f->priv, msg, flags);
	sv_leave();
	if (r == -EAGAIN)
		atomic_fetch_add_explicit(&((struct sv_stream *)f->priv)->tx_eagain, 1,
					  memory_order_relaxed);
	return r;
}

static int st_shutdown(struct sv_fd *f, int how)
{
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	sv_enter();
	int r = sv_stream_shutdown(f->priv, how);
	sv_leave();
	return r;
}

static int st_setsockopt(struct sv_fd *f, int level, int name, const void *val, socklen_t len)
{
	sv_enter();
	int r = sv_stream_setsockopt(f->priv, level, name, val, len);
	sv_leave();
	return r;
}


static int st_close(struct sv_fd *f)
{
	sv_enter();
	int r = sv_stream_close(f->priv, f->fd);
	sv_leave();
	return r;
}

static void st_release(struct sv_fd *f)
{
	sv_enter();
	sv_stream_put(f->priv);
	sv_leave();
}

struct sv_fd_ops sv_stream_ops = {
	.name = "sovia-stream",
	.recvmsg = st_recvmsg,
	.sendmsg = st_sendmsg,
	.shutdown = st_shutdown,
	.setsockopt = st_setsockopt,
	.getsockopt = NULL, /* the kernel's: set by sv_ops_init */
	.close = st_close,
	.release = st_release,
};

/* ---- Listening sockets --------------------------------------------------- */

static void ls_release(struct sv_fd *f)
{
	sv_enter();
	sv_upgrade_unlisten(f->priv);
	sv_leave();
}

/* A listening socket behaves as the kernel's in every call; only its
 * release also ends the RDMA listener. Filled in by sv_ops_init. */
static struct sv_fd_ops listen_ops;

void sv_ops_init(void)
{
	/* Options are read from the kernel's socket, which gets every one. */
	sv_stream_ops.getsockopt = sv_kernel_ops.getsockopt;
	listen_ops = sv_kernel_ops;
	listen_ops.name = "sovia-listen";
	listen_ops.release = ls_release;
}

/* ---- Hooks from the interposed calls -------------------------------------- */

/* Make (ops, priv) fd's entry. On failure priv is released and the fd
 * stays as it was: the caller must not go on with priv. */
static bool replace_entry(int fd, const struct sv_fd_ops *ops, void *priv)
{
	struct sv_fd *f = sv_fd_new(fd, ops, priv);
	if (!f) {
		struct sv_fd tmp = {.fd = fd, .priv = priv};
		if (ops->release)
			ops->release(&tmp);
		return false;
	}
	bool ok = sv_fd_install(f) == 0;
	if (!ok)
		sv_dbg("fd %d is beyond the fd table: it stays on the kernel", fd);
	sv_fd_put(f);
	return ok;
}

void sv_on_listen(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return;
	bool plain = f->ops == &sv_kernel_ops;
	sv_fd_put(f);
	if (!plain)
		return; /* listening already (a second listen() changes the backlog) */
	sv_enter();
	struct sv_listener *l = sv_upgrade_listen(fd);
	sv_leave();
	if (l)
		(void)replace_entry(fd, &listen_ops, l);
}

void sv_on_accepted(int lfd, int fd)
{
	struct sv_fd *lf = sv_fd_get(lfd);
	if (!lf)
		return;
	bool rdma = lf->ops == &listen_ops;
	sv_enter();
	if (rdma)
		rdma = sv_upgrade_listener_usable(lf->priv);
	if (rdma) {
		/* The listener entry (and so its priv) lives while we hold lf. */
		struct sv_stream *s = sv_stream_new(fd, false);
		if (s) {
			sv_stream_get(s); /* for the upgrade, past the entry's reference */
			if (replace_entry(fd, &sv_stream_ops, s))
				sv_upgrade_accepted(s, lf->priv);
			sv_stream_put(s);
		}
	}
	sv_leave();
	sv_fd_put(lf);
}

/* A client socket becomes a stream; then `start` begins its upgrade (at
 * once, or when a non-blocking connect completes). */
static void client_stream(int fd, void (*start)(struct sv_stream *s))
{
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return;
	bool plain = f->ops == &sv_kernel_ops;
	bool watched = atomic_load(&f->in_epoll);
	sv_fd_put(f);
	if (!plain)
		return; /* a stream already (connect() called again to poll it) */
	if (watched) {
		/* The kernel's epoll watches the fd already and would not see
		 * data that moved to the QP. */
		sv_info("fd %d: in an epoll set before its connect(): stays on TCP", fd);
		return;
	}
	sv_enter();
	struct sv_stream *s = sv_stream_new(fd, true);
	if (s) {
		sv_stream_get(s);
		if (replace_entry(fd, &sv_stream_ops, s))
			start(s);
		sv_stream_put(s);
	}
	sv_leave();
}

void sv_on_connected(int fd)
{
	client_stream(fd, sv_upgrade_connect);
}

void sv_on_connecting(int fd)
{
	client_stream(fd, sv_stream_connecting);
}

void sv_on_exit(void)
{
	sv_enter();
	sv_helper_exit_flush();
	sv_leave();
}

bool sv_ops_add_copy(int nfd, struct sv_stream *s)
{
	sv_stream_get(s); /* the new entry's; released by replace_entry on failure */
	if (!replace_entry(nfd, &sv_stream_ops, s))
		return false;
	sv_stream_opened(s);
	return true;
}

void sv_fd_make_plain_all(struct sv_stream *s)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool copy = f->ops == &sv_stream_ops && f->priv == s;
		sv_fd_put(f);
		if (copy)
			sv_fd_make_plain(fd);
	}
}

void sv_fd_make_plain(int fd)
{
	(void)replace_entry(fd, &sv_kernel_ops, NULL);
	sv_epoll_fd_plain(fd);
}

void sv_ops_atfork_child(void)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool ours = f->ops != &sv_kernel_ops;
		if (ours) {
			/* The parent's objects stay the parent's: never released here. */
			struct sv_fd *nf = sv_fd_new(fd, &sv_kernel_ops, NULL);
			if (nf) {
				struct sv_fd *old = sv_fd_remove(fd);
				(void)old; /* leaked on purpose: its release would touch the parent's QP */
				sv_fd_install(nf);
				sv_fd_put(nf);
			}
		}
		sv_fd_put(f);
	}
	sv_epoll_atfork_child();
	sv_helper_atfork_child();
	sv_upgrade_atfork_child();
	sv_verbs_atfork_child();
	sv_stream_atfork_child();
}
