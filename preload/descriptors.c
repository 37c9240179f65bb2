/* Descriptor calls on a stream: dup, dup2, dup3 and fcntl(F_DUPFD*) make
 * every copy the same stream, which lives until the last copy is closed
 * (src/stream/stream_close.c); fcntl(F_SETFL) and ioctl(FIONBIO) tell the stream
 * its mode may have changed; ioctl(FIONREAD/SIOCINQ, SIOCOUTQ) counts what
 * libsovia holds as well. Other fcntl and ioctl requests go to the kernel
 * unchanged. */
#include "preload.h"
#include "real.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <stdarg.h>
#include <sys/ioctl.h>

/* dup of an accelerated stream: the copy is the same stream. Returns fd's
 * entry, held, when the copy must become the stream's; NULL when the
 * kernel's dup is all (not a stream, plain TCP for good, or it could not be
 * shared and went back to TCP). */
static struct sv_fd *share_begin(int fd)
{
	if (sv_passthrough())
		return NULL;
	struct sv_fd *f = sv_fd_get(fd);
	if (f && f->ops->share) {
		int saved = errno;
		int r = f->ops->share(f);
		if (r == 0) {
			errno = saved;
			return f;
		}
		if (r < 0) {
			sv_fd_put(f);
			sv_fd_detach(fd, "dup");
			errno = saved;
			return NULL;
		}
		errno = saved;
	}
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
		if (!f->ops->add_copy(f, nfd))
			sv_fd_detach(fd, "dup"); /* nfd is the kernel's: the stream must be too */
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
	sv_enter();
	sv_epoll_on_close(fd2);
	struct sv_fd *f = sv_fd_remove(fd2);
	sv_leave();
	if (!f)
		return;
	int saved = errno;
	f->ops->close(f);
	sv_fd_put(f);
	errno = saved;
}

/* From inside libsovia (reentry.c), a copy of a connection libsovia
 * serves, or one onto an fd it keeps anything for (fd2 >= 0), needs its
 * table. */
static bool dup_refused(int fd, int fd2)
{
	return sv_reentered() &&
	       (sv_fd_claimed(fd, SV_MARK_SERVED) ||
		(fd2 >= 0 && fd2 != fd && sv_fd_claimed(fd2, SV_CLAIM_ANY)));
}

SV_EXPORT int dup(int fd)
{
	if (dup_refused(fd, -1))
		return sv_refuse(fd, "dup", EBUSY);
	struct sv_fd *f = share_begin(fd);
	return share_end(f, fd, SV_REAL(dup)(fd));
}

SV_EXPORT int dup2(int fd, int fd2)
{
	/* Onto itself: the kernel only checks fd and makes no copy, so the
	 * stream must not be shared (moved to a private descriptor) either. */
	if (fd == fd2)
		return SV_REAL(dup2)(fd, fd2);
	if (dup_refused(fd, fd2))
		return sv_refuse(fd, "dup2", EBUSY);
	struct sv_fd *f = share_begin(fd);
	dup_target(fd, fd2);
	return share_end(f, fd, SV_REAL(dup2)(fd, fd2));
}

SV_EXPORT int dup3(int fd, int fd2, int flags)
{
	/* The kernel refuses these (EINVAL) before it touches fd2: fd2's
	 * connection must not be closed first, nor fd's stream shared. An
	 * unknown flag is refused here as the kernel does today, since closing
	 * fd2 first and then failing would lose its connection. */
	if (fd == fd2)
		return SV_REAL(dup3)(fd, fd2, flags);
	if (flags & ~O_CLOEXEC) {
		errno = EINVAL;
		return -1;
	}
	if (dup_refused(fd, fd2))
		return sv_refuse(fd, "dup3", EBUSY);
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
	if (f && f->ops->mode_changed)
		f->ops->mode_changed(f);
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
	if (dup_refused(fd, -1))
		return sv_refuse(fd, "fcntl", EBUSY);
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

/* FIONREAD/SIOCINQ count what libsovia holds as well, SIOCOUTQ (TIOCOUTQ)
 * what it holds or has in flight of the application's writes. */
SV_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (req == FIONBIO && !sv_passthrough())
		return mode_call_done(fd, SV_REAL(ioctl)(fd, req, arg));
	bool counts = req == FIONREAD || req == SIOCINQ || req == SIOCOUTQ;
	if (counts && sv_reentered() && sv_fd_claimed(fd, SV_MARK_SERVED))
		return sv_refuse(fd, "ioctl", EBUSY); /* libsovia's counts need its lock */
	if (sv_passthrough() || !counts)
		return SV_REAL(ioctl)(fd, req, arg);
	struct sv_fd *f = sv_fd_get(fd);
	long (*count)(struct sv_fd *) = !f ? NULL : req == SIOCOUTQ ? f->ops->outq : f->ops->inq;
	if (!count) {
		sv_fd_put(f);
		return SV_REAL(ioctl)(fd, req, arg);
	}
	int saved = errno;
	long r = count(f);
	sv_fd_put(f);
	if (r >= 0 && arg)
		*(int *)arg = r > INT_MAX ? INT_MAX : (int)r;
	return (int)sv_ret(r < 0 ? r : 0, saved);
}
