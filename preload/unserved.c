/* Calls libsovia does not serve on an accelerated connection: the
 * connection first goes back to plain TCP (BACK/RETURN, src/stream_back.c),
 * with nothing held by libsovia, and the call then goes to the kernel,
 * which is right about the socket again. Correctness wins over
 * acceleration:
 *
 *   fork, vfork            every accelerated connection, before the fork
 *   exec*, fexecve         those that survive the exec (no FD_CLOEXEC)
 *   posix_spawn[p]         every one (file actions may hand any fd over)
 *   sendfile, splice       the socket(s) involved
 *
 * dup, dup2, dup3 and fcntl(F_DUPFD*) are served: every copy is the same
 * stream, which lives until the last copy is closed (src/close.c).
 * select/pselect are served (through poll), epoll in epoll.c, and ioctl FIONREAD/
 * SIOCINQ and recvmmsg/sendmmsg; other ioctls go to the kernel unchanged. */
#include "guard.h"
#include "log.h"
#include "preload.h"
#include "real.h"
#include "sovia_ops.h"
#include "stream.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <unistd.h>

/* ---- Going back to plain TCP ---------------------------------------------- */

/* fd's stream goes back to plain TCP and its entry becomes the kernel's. */
static void detach_fd(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return;
	if (f->ops == &sv_stream_ops) {
		sv_enter();
		sv_dbg("fd %d: going back to plain TCP", fd);
		int r = sv_stream_detach(f->priv);
		sv_leave();
		if (r == 0)
			sv_fd_make_plain_all(f->priv);
	}
	sv_fd_put(f);
}

/* Every accelerated connection (only those without FD_CLOEXEC when
 * `surviving_exec`). */
static void detach_all(bool surviving_exec)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool stream = f->ops == &sv_stream_ops;
		sv_fd_put(f);
		if (!stream)
			continue;
		if (surviving_exec) {
			int fl = sv_real.fcntl(fd, F_GETFD, 0);
			if (fl >= 0 && (fl & FD_CLOEXEC))
				continue;
		}
		detach_fd(fd);
	}
}

/* Run `detach` before passing the call through, keeping errno, unless the
 * call comes from libsovia itself (or before initialisation). */
#define ENTER_DETACHING(detach)                                                             \
	do {                                                                                \
		if (!sv_passthrough()) {                                                    \
			int saved_ = errno;                                                 \
			detach;                                                             \
			errno = saved_;                                                     \
		}                                                                           \
	} while (0)
#define ENTER_DETACH_ALL(surviving_exec) ENTER_DETACHING(detach_all(surviving_exec))
#define ENTER_DETACH(fd) ENTER_DETACHING(detach_fd(fd))

/* ---- Processes ------------------------------------------------------------ */

SV_EXPORT pid_t fork(void)
{
	ENTER_DETACH_ALL(false);
	return SV_REAL(fork)();
}

/* A vfork child may only exec or _exit; a fork does the same job, with our
 * fork handlers run. */
SV_EXPORT pid_t vfork(void)
{
	return fork();
}

SV_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	ENTER_DETACH_ALL(true);
	return SV_REAL(execve)(path, argv, envp);
}

SV_EXPORT int execv(const char *path, char *const argv[])
{
	ENTER_DETACH_ALL(true);
	return SV_REAL(execv)(path, argv);
}

SV_EXPORT int execvp(const char *file, char *const argv[])
{
	ENTER_DETACH_ALL(true);
	return SV_REAL(execvp)(file, argv);
}

SV_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	ENTER_DETACH_ALL(true);
	return SV_REAL(execvpe)(file, argv, envp);
}

SV_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	ENTER_DETACH_ALL(true);
	return SV_REAL(fexecve)(fd, argv, envp);
}

/* execl, execlp, execle: the list becomes an argv for execv, execvp or
 * execve (which detach). */
enum exec_kind { EXEC_PATH, EXEC_SEARCH, EXEC_ENV };

static int exec_list(enum exec_kind kind, const char *file, const char *arg0, va_list ap)
{
	va_list cp;
	va_copy(cp, ap);
	size_t n = 1;
	while (va_arg(cp, char *))
		n++;
	va_end(cp);
	char **argv = malloc((n + 1) * sizeof(*argv));
	if (!argv) {
		errno = ENOMEM;
		return -1;
	}
	argv[0] = (char *)arg0;
	for (size_t i = 1; i <= n; i++)
		argv[i] = va_arg(ap, char *); /* argv[n] is the terminating NULL */
	int r;
	switch (kind) {
	case EXEC_PATH:
		r = execv(file, argv);
		break;
	case EXEC_SEARCH:
		r = execvp(file, argv);
		break;
	case EXEC_ENV:
		r = execve(file, argv, va_arg(ap, char *const *));
		break;
	}
	int e = errno;
	free(argv);
	errno = e;
	return r;
}

#define EXEC_LIST(kind, file, arg)                                                          \
	do {                                                                                \
		va_list ap;                                                                 \
		va_start(ap, arg);                                                          \
		int r_ = exec_list(kind, file, arg, ap);                                    \
		va_end(ap);                                                                 \
		return r_;                                                                  \
	} while (0)

SV_EXPORT int execl(const char *path, const char *arg, ...)
{
	EXEC_LIST(EXEC_PATH, path, arg);
}

SV_EXPORT int execlp(const char *file, const char *arg, ...)
{
	EXEC_LIST(EXEC_SEARCH, file, arg);
}

SV_EXPORT int execle(const char *path, const char *arg, ...)
{
	EXEC_LIST(EXEC_ENV, path, arg);
}

SV_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
			  const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENTER_DETACH_ALL(false);
	return SV_REAL(posix_spawn)(pid, path, fa, attr, argv, envp);
}

SV_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			   const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENTER_DETACH_ALL(false);
	return SV_REAL(posix_spawnp)(pid, file, fa, attr, argv, envp);
}

/* ---- Descriptors ------------------------------------------------------------ */

/* dup of an accelerated stream: the copy is the same stream. Returns fd's
 * entry, held, when the copy must become the stream's; NULL when the
 * kernel's dup is all (not a stream, plain TCP for good, or it could not be
 * shared and went back to TCP). */
static struct sv_fd *share_begin(int fd)
{
	if (sv_passthrough())
		return NULL;
	struct sv_fd *f = sv_fd_get(fd);
	if (f && f->ops == &sv_stream_ops) {
		int saved = errno;
		sv_enter();
		int r = sv_stream_kernel_only(f->priv) ? 1 : sv_stream_share(f->priv);
		sv_leave();
		errno = saved;
		if (r == 0)
			return f;
		if (r < 0) {
			sv_fd_put(f);
			ENTER_DETACH(fd);
			return NULL;
		}
	}
	if (f)
		sv_fd_put(f);
	return NULL;
}

/* The kernel's dup of fd gave nfd (or failed). */
static int share_end(struct sv_fd *f, int fd, int nfd)
{
	if (!f)
		return nfd;
	if (nfd >= 0 && nfd != fd) {
		int saved = errno;
		sv_enter();
		bool ok = sv_ops_add_copy(nfd, f->priv);
		sv_leave();
		if (!ok)
			detach_fd(fd); /* nfd is the kernel's: the stream must be too */
		errno = saved;
	}
	sv_fd_put(f);
	return nfd;
}

/* dup2/dup3 onto another fd close it first, the way the kernel would. */
static void dup_target(int fd, int fd2)
{
	if (fd == fd2 || sv_passthrough() || fcntl(fd, F_GETFD) < 0)
		return; /* an invalid fd leaves fd2 alone */
	sv_epoll_on_close(fd2);
	struct sv_fd *f = sv_fd_remove(fd2);
	if (!f)
		return;
	int saved = errno;
	f->ops->close(f);
	sv_fd_put(f);
	errno = saved;
}

SV_EXPORT int dup(int fd)
{
	struct sv_fd *f = share_begin(fd);
	return share_end(f, fd, SV_REAL(dup)(fd));
}

SV_EXPORT int dup2(int fd, int fd2)
{
	struct sv_fd *f = share_begin(fd);
	dup_target(fd, fd2);
	return share_end(f, fd, SV_REAL(dup2)(fd, fd2));
}

SV_EXPORT int dup3(int fd, int fd2, int flags)
{
	struct sv_fd *f = share_begin(fd);
	dup_target(fd, fd2);
	return share_end(f, fd, SV_REAL(dup3)(fd, fd2, flags));
}

/* O_NONBLOCK set or cleared on a stream's fd: the stream remembers only
 * "blocking" and checks before it sleeps, so this is for promptness (a
 * call on a fd made non-blocking returns EAGAIN without spinning first). */
static void mode_changed(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	if (!f)
		return;
	if (f->ops == &sv_stream_ops)
		sv_stream_mode_changed(f->priv);
	sv_fd_put(f);
}

/* The result r of a call that may have changed fd's mode, passed on. */
static int mode_call_done(int fd, int r)
{
	int saved = errno;
	if (r == 0)
		mode_changed(fd);
	errno = saved;
	return r;
}

static int fcntl_common(int (*real)(int, int, ...), int fd, int cmd, void *arg)
{
	if (cmd == F_SETFL && !sv_passthrough())
		return mode_call_done(fd, real(fd, cmd, arg));
	if (cmd != F_DUPFD && cmd != F_DUPFD_CLOEXEC)
		return real(fd, cmd, arg);
	struct sv_fd *f = share_begin(fd);
	return share_end(f, fd, real(fd, cmd, arg));
}

SV_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(SV_REAL(fcntl), fd, cmd, arg);
}

SV_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(SV_REAL(fcntl64), fd, cmd, arg);
}

SV_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	ENTER_DETACH(out);
	return SV_REAL(sendfile)(out, in, off, count);
}

SV_EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	ENTER_DETACH(out);
	return SV_REAL(sendfile64)(out, in, off, count);
}

SV_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
			 unsigned int flags)
{
	ENTER_DETACH(in);
	ENTER_DETACH(out);
	return SV_REAL(splice)(in, off_in, out, off_out, len, flags);
}

/* ---- Served here ------------------------------------------------------------ */

/* FIONREAD/SIOCINQ count what libsovia holds as well. */
SV_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (req == FIONBIO && !sv_passthrough())
		return mode_call_done(fd, SV_REAL(ioctl)(fd, req, arg));
	if (sv_passthrough() || (req != FIONREAD && req != SIOCINQ))
		return SV_REAL(ioctl)(fd, req, arg);
	struct sv_fd *f = sv_fd_get(fd);
	if (!f || f->ops != &sv_stream_ops) {
		if (f)
			sv_fd_put(f);
		return SV_REAL(ioctl)(fd, req, arg);
	}
	int saved = errno;
	sv_enter();
	long r = sv_stream_inq(f->priv);
	sv_leave();
	sv_fd_put(f);
	if (r >= 0 && arg)
		*(int *)arg = r > INT_MAX ? INT_MAX : (int)r;
	return (int)sv_ret(r < 0 ? r : 0, saved);
}

/* select through poll, which knows the streams. */
static int select_common(int n, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
			 const sigset_t *mask, bool *served)
{
	*served = false;
	if (n < 0 || n > FD_SETSIZE)
		return -EINVAL;
	bool any = false;
	int count = 0;
	for (int fd = 0; fd < n; fd++) {
		if ((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex))) {
			count++;
			struct sv_fd *f = sv_fd_get(fd);
			if (f) {
				any = any || f->ops == &sv_stream_ops;
				sv_fd_put(f);
			}
		}
	}
	if (!any)
		return 0;
	*served = true;
	struct pollfd *p = calloc(count ? (size_t)count : 1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	int k = 0;
	for (int fd = 0; fd < n; fd++) {
		short ev = 0;
		if (rd && FD_ISSET(fd, rd))
			ev |= POLLIN;
		if (wr && FD_ISSET(fd, wr))
			ev |= POLLOUT;
		if (ex && FD_ISSET(fd, ex))
			ev |= POLLPRI;
		if (ev)
			p[k++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int r;
	if (mask) {
		struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
		r = ppoll(p, (nfds_t)k, timeout_ms < 0 ? NULL : &ts, mask);
	} else {
		r = poll(p, (nfds_t)k, timeout_ms);
	}
	if (r < 0) {
		r = -errno;
		free(p);
		return r;
	}
	for (int i = 0; i < k; i++)
		if (p[i].revents & POLLNVAL) {
			free(p);
			return -EBADF;
		}
	if (rd)
		FD_ZERO(rd);
	if (wr)
		FD_ZERO(wr);
	if (ex)
		FD_ZERO(ex);
	int bits = 0;
	for (int i = 0; i < k; i++) {
		short re = p[i].revents;
		/* As the kernel's select: an error or hang-up makes a socket
		 * readable and writable. */
		if (rd && (p[i].events & POLLIN) && (re & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(p[i].fd, rd);
			bits++;
		}
		if (wr && (p[i].events & POLLOUT) && (re & (POLLOUT | POLLERR))) {
			FD_SET(p[i].fd, wr);
			bits++;
		}
		if (ex && (p[i].events & POLLPRI) && (re & POLLPRI)) {
			FD_SET(p[i].fd, ex);
			bits++;
		}
	}
	free(p);
	return bits;
}

static int64_t tv_ms(const struct timeval *tv)
{
	if (!tv)
		return -1;
	return (int64_t)tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000;
}

SV_EXPORT int select(int n, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	if (sv_passthrough())
		return SV_REAL(select)(n, rd, wr, ex, tv);
	int saved = errno;
	int64_t ms = tv_ms(tv);
	bool served;
	int r = select_common(n, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, NULL, &served);
	if (!served)
		return SV_REAL(select)(n, rd, wr, ex, tv);
	if (tv && r == 0)
		tv->tv_sec = tv->tv_usec = 0; /* Linux reports the time left */
	return (int)sv_ret(r, saved);
}

SV_EXPORT int pselect(int n, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts,
		      const sigset_t *mask)
{
	if (sv_passthrough())
		return SV_REAL(pselect)(n, rd, wr, ex, ts, mask);
	int saved = errno;
	int64_t ms = ts ? (int64_t)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000 : -1;
	sigset_t cur;
	if (!mask) {
		pthread_sigmask(SIG_SETMASK, NULL, &cur);
		mask = &cur;
	}
	bool served;
	int r = select_common(n, rd, wr, ex, ms > INT_MAX ? INT_MAX : (int)ms, mask, &served);
	if (!served)
		return SV_REAL(pselect)(n, rd, wr, ex, ts, mask);
	return (int)sv_ret(r, saved);
}

/* recvmmsg/sendmmsg: one message at a time through the stream. */
SV_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags,
		       struct timespec *timeout)
{
	struct sv_fd *f = sv_passthrough() ? NULL : sv_fd_get(fd);
	if (!f || f->ops != &sv_stream_ops) {
		if (f)
			sv_fd_put(f);
		return SV_REAL(recvmmsg)(fd, v, n, flags, timeout);
	}
	int saved = errno;
	int got = 0, fl = flags & ~MSG_WAITFORONE;
	long r = 0;
	for (unsigned int i = 0; i < n; i++) {
		r = f->ops->recvmsg(f, &v[i].msg_hdr, fl);
		if (r < 0)
			break;
		v[i].msg_len = (unsigned int)r;
		got++;
		if (r == 0)
			break; /* the end of the stream */
		if (flags & MSG_WAITFORONE)
			fl |= MSG_DONTWAIT;
	}
	sv_fd_put(f);
	return got ? (errno = saved, got) : (int)sv_ret(r, saved);
}

SV_EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	struct sv_fd *f = sv_passthrough() ? NULL : sv_fd_get(fd);
	if (!f || f->ops != &sv_stream_ops) {
		if (f)
			sv_fd_put(f);
		return SV_REAL(sendmmsg)(fd, v, n, flags);
	}
	int saved = errno;
	unsigned int i = 0;
	long r = 0;
	for (; i < n; i++) {
		r = f->ops->sendmsg(f, &v[i].msg_hdr, flags);
		if (r < 0)
			break;
		v[i].msg_len = (unsigned int)r;
	}
	sv_fd_put(f);
	if (i > 0) {
		errno = saved;
		return (int)i;
	}
	return (int)sv_ret(r, saved);
}
