/* stdio on a socket libsovia may carry: glibc's FILE would read, write and
 * close the fd with its internal calls, past the interposer, so fdopen()
 * builds the FILE on fopencookie, whose calls come back through read,
 * write and close. That holds for a socket that may still become a stream,
 * too: ftpd fdopen()s its active-mode data socket before connect(), and its
 * fclose() must finish the connection (a real FILE would close the
 * kernel's socket under libsovia's feet, and the peer would never get the
 * end of the data). fileno() and fileno_unlocked() give such a FILE's fd,
 * as they do for any fdopen'ed FILE. */
#include "guard.h"
#include "lock.h"
#include "preload.h"
#include "real.h"
#include "stdio_int.h"

#include <stdio_ext.h>
#include <stdlib.h>
#include <unistd.h>

struct cookie {
	int fd;
	FILE *fp;
	struct cookie *next;
};

/* The FILEs made here, for fileno(). */
static struct sv_lock cookies_lock = SV_LOCK_INIT(SV_RANK_STDIO);
static struct cookie *cookies;
static atomic_int ncookies;

void sv_stdio_atfork_child(void)
{
	/* Its holder may be a thread the child does not have; the FILEs
	 * themselves were copied with the process and stay listed. */
	sv_lock_reinit(&cookies_lock);
}

static ssize_t cookie_read(void *c, char *buf, size_t n)
{
	return read(((struct cookie *)c)->fd, buf, n);
}

static ssize_t cookie_write(void *c, const char *buf, size_t n)
{
	/* stdio treats a short write as an error: write it all. */
	size_t done = 0;
	while (done < n) {
		ssize_t r = write(((struct cookie *)c)->fd, buf + done, n - done);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return done ? (ssize_t)done : -1;
		}
		done += (size_t)r;
	}
	return (ssize_t)done;
}

/* The list's lock is taken inside libsovia (guard.h): a signal handler
 * that interrupts its holder does not wait for it. */
static void cookies_take(void)
{
	sv_enter();
	sv_lock(&cookies_lock);
}

static void cookies_give(void)
{
	sv_unlock(&cookies_lock);
	sv_leave();
}

static int cookie_close(void *arg)
{
	struct cookie *c = arg;
	cookies_take();
	for (struct cookie **pp = &cookies; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			atomic_fetch_sub(&ncookies, 1);
			break;
		}
	}
	cookies_give();
	sv_stdio_std_closing(c->fp);
	int r = close(c->fd);
	free(c);
	return r;
}

FILE *sv_cookie_open(int fd, const char *mode)
{
	struct cookie *c = malloc(sizeof(*c));
	if (!c)
		return NULL;
	c->fd = fd;
	cookie_io_functions_t io = {
		.read = cookie_read,
		.write = cookie_write,
		.seek = NULL,
		.close = cookie_close,
	};
	c->fp = fopencookie(c, mode, io);
	if (!c->fp) {
		free(c);
		return NULL;
	}
	cookies_take();
	c->next = cookies;
	cookies = c;
	atomic_fetch_add(&ncookies, 1);
	cookies_give();
	return c->fp;
}

SV_EXPORT FILE *fdopen(int fd, const char *mode)
{
	if (sv_reentered() && sv_fd_claimed(fd, SV_MARK_SERVED | SV_MARK_MANAGED)) {
		/* A FILE of glibc's own would go past libsovia (reentry.c). */
		sv_refuse(fd, "fdopen", EBUSY);
		return NULL;
	}
	struct sv_fd *f = sv_passthrough() ? NULL : sv_fd_get(fd);
	bool ours = f && f->ops->stdio_cookie;
	sv_fd_put(f);
	if (!ours)
		return SV_REAL(fdopen)(fd, mode);
	return sv_cookie_open(fd, mode);
}

void sv_cookie_set_fd(FILE *fp, int fd)
{
	cookies_take();
	for (struct cookie *c = cookies; c; c = c->next) {
		if (c->fp == fp) {
			c->fd = fd;
			break;
		}
	}
	cookies_give();
}

/* At exit glibc writes what its FILEs buffered only after the destructors
 * ran (_IO_cleanup), after libsovia's exit flush has ended the
 * connections: a FILE of ours (a taken stdout, an fdopen'ed socket) writes
 * it first, while the connection takes it. Each is locked while it is
 * still listed (so another thread's fclose cannot free it under us, nor
 * flush it at the same time); one whose lock is held (a thread blocked in
 * a call on it) is left to glibc's exit, as glibc's own flush skips
 * locking. In batches, a bounded number of them. */
void sv_stdio_exit_flush(void)
{
	enum { BATCH = 64 };
	int total = atomic_load(&ncookies);
	if (total == 0 || sv_reentered())
		return;
	for (int pass = 0; pass <= total / BATCH + 1; pass++) {
		FILE *due[BATCH];
		int n = 0;
		cookies_take();
		for (struct cookie *c = cookies; c && n < BATCH; c = c->next) {
			FILE *fp = c->fp;
			/* Read without its lock, as glibc's exit does. */
			if (__fpending(fp) > 0 && ftrylockfile(fp) == 0)
				due[n++] = fp;
		}
		cookies_give();
		if (n == 0)
			return;
		for (int i = 0; i < n; i++) {
			fflush_unlocked(due[i]);
			funlockfile(due[i]);
		}
	}
}

/* The fd of a FILE made here, or -1 (also from inside libsovia, where
 * the list cannot be looked at: glibc's fileno then says EBADF). */
static int cookie_fd(FILE *fp)
{
	if (atomic_load(&ncookies) == 0 || sv_reentered())
		return -1;
	int fd = -1;
	cookies_take();
	for (struct cookie *c = cookies; c; c = c->next) {
		if (c->fp == fp) {
			fd = c->fd;
			break;
		}
	}
	cookies_give();
	return fd;
}

SV_EXPORT int fileno(FILE *fp)
{
	int fd = fp ? cookie_fd(fp) : -1;
	return fd >= 0 ? fd : SV_REAL(fileno)(fp);
}

SV_EXPORT int fileno_unlocked(FILE *fp)
{
	int fd = fp ? cookie_fd(fp) : -1;
	return fd >= 0 ? fd : SV_REAL(fileno_unlocked)(fp);
}
