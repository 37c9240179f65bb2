/* The interposed libc calls. Each wrapper passes straight through until
 * libsovia is initialised, on re-entry from libsovia's own code, and for fds
 * that are not managed; otherwise it dispatches to the fd's operations and
 * converts their -errno result to -1/errno here, once. */
#include "config.h"
#include "log.h"
#include "preload.h"
#include "ownfd.h"
#include "real.h"
#include "sovia_ops.h"
#include "wait.h"

#include <limits.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

atomic_bool sv_initialised;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* The process whose connections these are: a child made by clone() with
 * shared memory (a hand-made vfork) that calls _exit must not flush them. */
static atomic_int owner_pid;

static void atfork_child(void)
{
	atomic_store(&owner_pid, (int)getpid());
	sv_ops_atfork_child();
}

static void init_once_fn(void)
{
	sv_real_resolve();
	/* secure_getenv: in a set-id program (an /etc/ld.so.preload's
	 * libsovia) the invoking user's SOVIA_* settings are not taken. */
	sv_config_load(&sv_cfg, secure_getenv);
	sv_log_threshold = sv_cfg.log_level;
	int r = sv_fdtable_init();
	if (r < 0) {
		sv_err("cannot allocate the fd table (%s); libsovia stays out of the way",
		       strerror(-r));
		return; /* never initialised: everything passes through */
	}
	if (sv_cfg.disable)
		sv_info("SOVIA_DISABLE is set: all sockets stay on the kernel");
	sv_ops_init();
	atomic_store(&owner_pid, (int)getpid());
	pthread_atfork(NULL, NULL, atfork_child);
	atomic_store_explicit(&sv_initialised, true, memory_order_release);
}

void sv_preload_init(void)
{
	pthread_once(&init_once, init_once_fn);
}

/* Once set up (outside the one-time set-up, whose calls would come back
 * to it): a connection the image before the exec handed on (exec_hand.c)
 * is continued before main(), and before glibc's stdio is used. */
__attribute__((constructor)) static void sv_preload_ctor(void)
{
	sv_preload_init();
	if (atomic_load_explicit(&sv_initialised, memory_order_acquire))
		sv_exec_inherit();
}

/* Normal termination (return from main, exit()): push out what the
 * connections still hold, and end those on the QP (the kernel would close
 * the sockets now). What stdio buffered in FILEs of ours goes first.
 * Both come last, after every library's destructor (a C++ stream or a
 * logger may write in one), just before glibc's own flush of its FILEs:
 * the destructor registers them as an exit handler, which glibc runs
 * after the destructors. Not in a child that shares the parent's
 * connections without our fork (_Fork, clone): they are the parent's. */
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);

static void last_exit_flush(void *unused)
{
	(void)unused;
	sv_stdio_exit_flush();
	sv_on_exit();
}

__attribute__((destructor)) static void sv_preload_dtor(void)
{
	if (atomic_load_explicit(&sv_initialised, memory_order_acquire) && !sv_tls_inside &&
	    atomic_load(&owner_pid) == (int)getpid() && __cxa_atexit(last_exit_flush, NULL, NULL))
		last_exit_flush(NULL);
}

/* _exit and _Exit skip the destructors, but not the connections' due: a
 * lingering close still owes the peer its last bytes and FIN on the QP
 * (with TCP the kernel would deliver them after the exit), and a connection
 * still open owes its coalesced bytes. ftpd, for one, ends each session
 * with _exit right after its last transfer. The same bounded flush as at
 * exit(); skipped when a signal handler interrupted libsovia's own code,
 * and in a child that shares the parent's memory without our fork. */
static void quick_exit_flush(void)
{
	if (atomic_load_explicit(&sv_initialised, memory_order_acquire) && !sv_tls_inside &&
	    atomic_load(&owner_pid) == (int)getpid())
		sv_on_exit();
}

SV_EXPORT _Noreturn void _exit(int status)
{
	quick_exit_flush();
	SV_REAL(_exit)(status);
	__builtin_unreachable();
}

SV_EXPORT _Noreturn void _Exit(int status)
{
	quick_exit_flush();
	SV_REAL(_Exit)(status);
	__builtin_unreachable();
}

/* Is this a socket libsovia may accelerate? TCP over IPv4/IPv6 only;
 * SOCK_NONBLOCK and SOCK_CLOEXEC do not change the answer. */
static bool classify_stream(int domain, int type, int protocol)
{
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
	return (domain == AF_INET || domain == AF_INET6) && base == SOCK_STREAM &&
	       (protocol == 0 || protocol == IPPROTO_TCP);
}

/* Start managing fd. Failure is not an error for the application: the
 * socket simply stays unmanaged, on the kernel. */
static void manage(int fd)
{
	if (sv_cfg.disable)
		return;
	struct sv_fd *f = sv_fd_new(fd, &sv_kernel_ops, NULL);
	if (!f) {
		sv_warn("fd %d: out of memory, it stays on the kernel", fd);
		return;
	}
	if (sv_fd_install(f) < 0)
		sv_dbg("fd %d is beyond the fd table, it stays on the kernel", fd);
	sv_fd_put(f);
}

SV_EXPORT int socket(int domain, int type, int protocol)
{
	if (sv_passthrough())
		return SV_REAL(socket)(domain, type, protocol);
	int fd = sv_real.socket(domain, type, protocol);
	if (fd >= 0 && classify_stream(domain, type, protocol)) {
		int saved = errno;
		manage(fd);
		errno = saved;
	}
	return fd;
}

SV_EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	return SV_REAL(bind)(fd, addr, len);
}

SV_EXPORT int listen(int fd, int backlog)
{
	if (sv_passthrough())
		return SV_REAL(listen)(fd, backlog);
	int r = sv_real.listen(fd, backlog);
	if (r == 0) {
		int saved = errno;
		struct sv_fd *f = sv_fd_get(fd);
		if (f && f->ops->listened) /* a second listen() only changes the backlog */
			f->ops->listened(f);
		sv_fd_put(f);
		errno = saved;
	}
	return r;
}

SV_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	if (sv_passthrough())
		return SV_REAL(connect)(fd, addr, len);
	int r = sv_real.connect(fd, addr, len);
	int saved = errno;
	if (r == 0 || errno == EINPROGRESS) {
		struct sv_fd *f = sv_fd_get(fd);
		if (f && f->ops->connected) /* a stream already: connect() called again to poll it */
			f->ops->connected(f, addr, len, r != 0);
		sv_fd_put(f);
	}
	errno = saved;
	return r;
}

static int accept_common(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	int saved = errno;
	struct sv_fd *f = sv_fd_get(fd);
	if (f && f->ops->will_accept)
		f->ops->will_accept(f);
	sv_fd_put(f);
	errno = saved;
	int nfd = sv_real.accept4(fd, addr, len, flags);
	if (nfd < 0)
		return nfd;
	saved = errno;
	f = sv_fd_get(fd);
	if (f && f->ops->accepted)
		f->ops->accepted(f, nfd);
	sv_fd_put(f);
	errno = saved;
	return nfd;
}

SV_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	if (sv_passthrough())
		return SV_REAL(accept)(fd, addr, len);
	return accept_common(fd, addr, len, 0);
}

SV_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	if (sv_passthrough())
		return SV_REAL(accept4)(fd, addr, len, flags);
	return accept_common(fd, addr, len, flags);
}

/* The receive family, one path: read, readv, recv, recvfrom, recvmsg. */
static ssize_t recv_common(struct sv_fd *f, struct msghdr *msg, int flags)
{
	int saved = errno;
	ssize_t r = f->ops->recvmsg(f, msg, flags);
	sv_fd_put(f);
	return sv_ret(r, saved);
}

/* The send family, one path: write, writev, send, sendto, sendmsg. */
static ssize_t send_common(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	int saved = errno;
	ssize_t r = f->ops->sendmsg(f, msg, flags);
	sv_fd_put(f);
	return sv_ret(r, saved);
}

#define SV_MSG(iovp, iovcnt) {.msg_iov = (struct iovec *)(iovp), .msg_iovlen = (size_t)(iovcnt)}

/* The entry f of fd for a call, or the call ends here: refused from
 * inside libsovia with err (reentry.c), or straight to libc with `real`.
 * The calls that move bytes are refused with EAGAIN. */
#define FD_ENTRY(f, fd, name, err, real)                                                    \
	struct sv_fd *f;                                                                    \
	do {                                                                                \
		bool refused_;                                                              \
		f = sv_fd_for_call(fd, &refused_);                                          \
		if (refused_)                                                               \
			return sv_refuse(fd, name, err);                                    \
		if (!f)                                                                     \
			return real;                                                        \
	} while (0)
#define DATA_ENTRY(f, fd, name, real) FD_ENTRY(f, fd, name, EAGAIN, real)

SV_EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	DATA_ENTRY(f, fd, "read", SV_REAL(read)(fd, buf, n));
	struct iovec iov = {buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	return recv_common(f, &msg, 0);
}

SV_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
	DATA_ENTRY(f, fd, "readv", SV_REAL(readv)(fd, iov, iovcnt));
	if (iovcnt < 0) {
		sv_fd_put(f);
		errno = EINVAL;
		return -1;
	}
	struct msghdr msg = SV_MSG(iov, iovcnt);
	return recv_common(f, &msg, 0);
}

SV_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	DATA_ENTRY(f, fd, "recv", SV_REAL(recv)(fd, buf, n, flags));
	struct iovec iov = {buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	return recv_common(f, &msg, flags);
}

SV_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
			   socklen_t *fromlen)
{
	DATA_ENTRY(f, fd, "recvfrom", SV_REAL(recvfrom)(fd, buf, n, flags, from, fromlen));
	struct iovec iov = {buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	msg.msg_name = from;
	msg.msg_namelen = fromlen ? *fromlen : 0;
	ssize_t r = recv_common(f, &msg, flags);
	if (r >= 0 && from && fromlen)
		*fromlen = msg.msg_namelen;
	return r;
}

SV_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	DATA_ENTRY(f, fd, "recvmsg", SV_REAL(recvmsg)(fd, msg, flags));
	return recv_common(f, msg, flags);
}

SV_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	DATA_ENTRY(f, fd, "write", SV_REAL(write)(fd, buf, n));
	struct iovec iov = {(void *)buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	return send_common(f, &msg, 0);
}

SV_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	DATA_ENTRY(f, fd, "writev", SV_REAL(writev)(fd, iov, iovcnt));
	if (iovcnt < 0) {
		sv_fd_put(f);
		errno = EINVAL;
		return -1;
	}
	struct msghdr msg = SV_MSG(iov, iovcnt);
	return send_common(f, &msg, 0);
}

SV_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	DATA_ENTRY(f, fd, "send", SV_REAL(send)(fd, buf, n, flags));
	struct iovec iov = {(void *)buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	return send_common(f, &msg, flags);
}

SV_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
			 const struct sockaddr *to, socklen_t tolen)
{
	DATA_ENTRY(f, fd, "sendto", SV_REAL(sendto)(fd, buf, n, flags, to, tolen));
	struct iovec iov = {(void *)buf, n};
	struct msghdr msg = SV_MSG(&iov, 1);
	msg.msg_name = (void *)to;
	msg.msg_namelen = tolen;
	return send_common(f, &msg, flags);
}

SV_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (!sv_fd_detach_passed(msg))
		return sv_refuse(fd, "sendmsg", EAGAIN);
	DATA_ENTRY(f, fd, "sendmsg", SV_REAL(sendmsg)(fd, msg, flags));
	return send_common(f, msg, flags);
}

/* Fortified variants (_FORTIFY_SOURCE): check the buffer, then the plain path. */
extern void __chk_fail(void) __attribute__((noreturn));
SV_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen);
SV_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags);
SV_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
				 struct sockaddr *from, socklen_t *fromlen);

SV_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return read(fd, buf, n);
}

SV_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (n > buflen)
		__chk_fail();
	return recv(fd, buf, n, flags);
}

SV_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
				 struct sockaddr *from, socklen_t *fromlen)
{
	if (n > buflen)
		__chk_fail();
	return recvfrom(fd, buf, n, flags, from, fromlen);
}

SV_EXPORT int close(int fd)
{
	/* From inside libsovia: a library it called closes its own; a signal
	 * handler cannot take an fd libsovia keeps anything for from there. */
	if (sv_reentered() && sv_fd_claimed(fd, SV_CLAIM_ANY))
		return sv_refuse(fd, "close", EBUSY);
	if (sv_passthrough()) {
		sv_ownfd_del(fd);
		return SV_REAL(close)(fd);
	}
	if (sv_ownfd_is(fd)) {
		/* libsovia's, never the application's: a close-all loop
		 * (daemons) must not take it. As for a number not open. */
		errno = EBADF;
		return -1;
	}
	sv_enter();
	sv_epoll_on_close(fd);
	struct sv_fd *f = sv_fd_remove(fd);
	sv_leave();
	if (!f)
		return SV_REAL(close)(fd);
	int saved = errno;
	int r = f->ops->close(f);
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

/* close_range and closefrom close every number in a range: the application's
 * managed fds go through close() (their table entries and connections end
 * with them), libsovia's own are left out, and the kernel closes the rest
 * in as few calls as the gaps between those allow. From a signal handler
 * that interrupted libsovia, the managed ones stay open (reentry.c):
 * EBUSY once the rest is closed. */

SV_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	if (!atomic_load_explicit(&sv_initialised, memory_order_acquire))
		return SV_REAL(close_range)(first, last, flags);
	if (first > last) {
		errno = EINVAL;
		return -1;
	}
	bool inside = sv_tls_inside != 0, busy = false;
	int saved = errno;
	/* The next of ours in the range (-1: none left). */
	int next_own = sv_ownfd_next(first);
	if (next_own >= 0 && (unsigned)next_own > last)
		next_own = -1;
	/* Managed fds are below the table's size; ours may be anywhere. fds
	 * are ints, so fd + 1 never wraps. */
	unsigned size = (unsigned)sv_fdtable_size();
	unsigned top = size && last >= size ? size - 1 : last;
	unsigned lo = first;
	for (unsigned fd = first; fd <= last; fd++) {
		if (fd > top || fd > (unsigned)INT_MAX) {
			if (next_own < 0)
				break;
			fd = (unsigned)next_own; /* past the table: on to the next of ours */
		}
		bool is_own = next_own >= 0 && (unsigned)next_own == fd;
		struct sv_fd *f = NULL;
		bool managed = !is_own && (inside ? sv_fd_claimed((int)fd, SV_CLAIM_ANY)
						  : (f = sv_fd_get((int)fd)) != NULL);
		if (!is_own && !managed)
			continue;
		if (fd > lo && SV_REAL(close_range)(lo, fd - 1, flags) < 0) {
			if (f)
				sv_fd_put(f);
			return -1;
		}
		lo = fd + 1;
		if (is_own) {
			next_own = fd < last ? sv_ownfd_next(fd + 1) : -1;
			if (next_own >= 0 && (unsigned)next_own > last)
				next_own = -1;
			continue;
		}
		sv_fd_put(f);
		if (flags & CLOSE_RANGE_CLOEXEC)
			SV_REAL(close_range)(fd, fd, flags);
		else if (inside)
			busy = true;
		else
			close((int)fd);
	}
	if (lo <= last && SV_REAL(close_range)(lo, last, flags) < 0)
		return -1;
	if (busy)
		return sv_refuse((int)first, "close_range", EBUSY);
	errno = saved;
	return 0;
}

SV_EXPORT void closefrom(int lowfd)
{
	if (!atomic_load_explicit(&sv_initialised, memory_order_acquire)) {
		SV_REAL(closefrom)(lowfd);
		return;
	}
	int saved = errno;
	if (close_range(lowfd < 0 ? 0 : (unsigned)lowfd, ~0U, 0) < 0 && errno != EBUSY) {
		/* No close_range in this kernel: one by one, as glibc's own
		 * fallback does, through close(). */
		int n = sv_fdtable_size();
		for (int fd = lowfd < 0 ? 0 : lowfd; fd < n; fd++)
			close(fd);
	}
	errno = saved;
}

SV_EXPORT int shutdown(int fd, int how)
{
	FD_ENTRY(f, fd, "shutdown", EBUSY, SV_REAL(shutdown)(fd, how));
	int saved = errno;
	int r = f->ops->shutdown(f, how);
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

SV_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	FD_ENTRY(f, fd, "setsockopt", EBUSY, SV_REAL(setsockopt)(fd, level, name, val, len));
	int saved = errno;
	int r = f->ops->setsockopt(f, level, name, val, len);
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

SV_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	FD_ENTRY(f, fd, "getsockopt", EBUSY, SV_REAL(getsockopt)(fd, level, name, val, len));
	int saved = errno;
	int r = f->ops->getsockopt(f, level, name, val, len);
	sv_fd_put(f);
	return (int)sv_ret(r, saved);
}

/* recvmmsg/sendmmsg on an fd whose bytes libsovia may hold: one message at
 * a time through its operations. An fd with no readiness of its own is
 * the kernel's socket; one that still has a way back (a connection handed
 * to a fork's child, held.c) takes it first, as for any call libsovia
 * does not serve. */
static void served_by_kernel(struct sv_fd *f, const char *call)
{
	if (f->ops->detach) {
		int saved = errno;
		(void)f->ops->detach(f, call);
		errno = saved;
	}
}

SV_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags,
		       struct timespec *timeout)
{
	DATA_ENTRY(f, fd, "recvmmsg", SV_REAL(recvmmsg)(fd, v, n, flags, timeout));
	if (!f->ops->wait) {
		served_by_kernel(f, "recvmmsg");
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
	for (unsigned int i = 0; v && i < n; i++)
		if (!sv_fd_detach_passed(&v[i].msg_hdr))
			return sv_refuse(fd, "sendmmsg", EAGAIN);
	DATA_ENTRY(f, fd, "sendmmsg", SV_REAL(sendmmsg)(fd, v, n, flags));
	if (!f->ops->wait) {
		served_by_kernel(f, "sendmmsg");
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
