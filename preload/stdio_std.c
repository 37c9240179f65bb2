/* stdin, stdout and stderr where fds 0-2 carry a connection: glibc's own
 * FILEs read and write those fds with its internal calls, past the
 * interposer, so once the connection moves to RDMA they would miss bytes
 * or put them out of order. Each one whose fd carries a connection is
 * replaced by a cookie FILE (stdio.c), whose calls come back through
 * read, write and close: in an image exec'd on a handed connection, by
 * libsovia's constructor before main(); in a process that dup2()s a
 * stream onto 0-2 (ftpd -D's child), at the dup2. Only a FILE nothing
 * used yet is replaced.
 * freopen() of such a FILE keeps it, on the new file. */
#include "preload.h"
#include "real.h"
#include "stdio_int.h"

#include <fcntl.h>
#include <stdio_ext.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

/* The FILE taken for fd 0, 1 or 2, while it is open. */
static FILE *_Atomic std_files[3];
/* glibc's FILE it replaced: a direction the cookie lacks gives the fd
 * back to it (std_give_back). */
static FILE *replaced[3];

bool sv_stdio_ours(int fd)
{
	return fd >= 0 && fd < 3 && atomic_load(&std_files[fd]) != NULL;
}

void sv_stdio_std_closing(FILE *fp)
{
	for (int fd = 0; fd < 3; fd++) {
		FILE *want = fp;
		atomic_compare_exchange_strong(&std_files[fd], &want, NULL);
	}
}

/* The variable as libsovia sees it: the executable's copy if it has a
 * copy relocation, which every caller outside libc then uses. */
static FILE **std_var(int fd)
{
	return fd == 0 ? &stdin : fd == 1 ? &stdout : &stderr;
}

/* libc's own variable: not ours when the executable has a copy. glibc
 * 2.33's puts() reads the variable through libc's GOT, so the copy;
 * older ones read their own through a hidden alias (_IO_stdout). Both are
 * set. */
static FILE **libc_var(int fd)
{
	return sv_real_std(fd);
}

/* Nothing has used fp, as <stdio_ext.h> and fwide() tell: stdio gives a
 * FILE its buffer at its first read or write (an unbuffered one a
 * one-byte buffer), so no buffer means nothing was read ahead, written
 * or pending; and no orientation was chosen. */
static bool pristine(FILE *fp)
{
	return __fbufsize(fp) == 0 && __fpending(fp) == 0 && fwide(fp, 0) == 0;
}

int sv_stdio_take_std(int fd)
{
	if (fd < 0 || fd > 2)
		return -EINVAL;
	if (sv_stdio_ours(fd))
		return 0;
	FILE **ours = std_var(fd), **libcs = libc_var(fd);
	if (!libcs || !*libcs)
		return -ENOENT;
	FILE *glibc = *libcs;
	/* Bytes an earlier constructor left in glibc's FILE, or a FILE of
	 * another file it put there, would be lost or bypass us. */
	if (*ours != glibc || SV_REAL(fileno)(glibc) != fd || !pristine(glibc))
		return -EBUSY;
	FILE *fp = sv_cookie_open(fd, fd == 0 ? "r" : "w");
	if (!fp)
		return errno ? -errno : -ENOMEM;
	/* glibc's choices for a socket: stdout fully buffered (a line buffer
	 * is only for a tty, filedoalloc.c), stderr unbuffered (stdfiles.c).
	 * Without a buffer now, stdio makes one at the first write. */
	if (fd == 1)
		(void)setvbuf(fp, NULL, _IOFBF, BUFSIZ);
	else if (fd == 2)
		(void)setvbuf(fp, NULL, _IONBF, 0);
	/* glibc's FILE stays on its list, empty: the exit flush has nothing
	 * of it to write. */
	replaced[fd] = glibc;
	*ours = fp;
	*libcs = fp;
	atomic_store(&std_files[fd], fp);
	return 0;
}

/* open(2)'s flags for an fopen() mode; -1 for a mode fopen refuses. */
static int mode_flags(const char *mode)
{
	int flags;
	switch (mode[0]) {
	case 'r':
		flags = O_RDONLY;
		break;
	case 'w':
		flags = O_WRONLY | O_CREAT | O_TRUNC;
		break;
	case 'a':
		flags = O_WRONLY | O_CREAT | O_APPEND;
		break;
	default:
		return -1;
	}
	if (strchr(mode, '+'))
		flags = (flags & ~O_ACCMODE) | O_RDWR;
	if (strchr(mode, 'e'))
		flags |= O_CLOEXEC;
	if (strchr(mode, 'x'))
		flags |= O_EXCL;
	return flags;
}

/* The new file goes where fd was: the kernel gives the lowest free
 * number, fd's, unless another thread took it meanwhile. -errno. */
static int open_at(int fd, const char *path, int flags)
{
	int nfd = open(path, flags, 0666);
	if (nfd < 0)
		return -errno;
	if (nfd == fd)
		return 0;
	int r = dup3(nfd, fd, flags & O_CLOEXEC);
	int err = errno;
	close(nfd);
	return r < 0 ? -err : 0;
}

/* A direction fp's cookie lacks (stdin's "w", stdout's "r", any "+"):
 * glibc's own FILE for fd takes the file, as it would without libsovia,
 * and both variables go back to it. fp stays allocated, with no fd, for
 * whoever kept a pointer to it. */
static FILE *std_give_back(int fd, const char *path, const char *mode, FILE *fp)
{
	FILE *glibc = replaced[fd];
	FILE **libcs = libc_var(fd);
	if (!glibc || !libcs) {
		errno = ENOENT;
		return NULL;
	}
	fflush(fp);
	sv_cookie_set_fd(fp, -1);
	atomic_store(&std_files[fd], NULL);
	/* Through the interposer: a connection ends as the application's
	 * close() ends it. glibc's freopen then closes an fd already closed
	 * and opens the file on fd (libio/freopen.c). */
	close(fd);
	FILE *r = SV_REAL(freopen)(path, mode, glibc);
	*std_var(fd) = glibc;
	*libcs = glibc;
	return r;
}

/* freopen() of the FILE taken for fd. glibc's would see the cookie's fd
 * (-2), keep our close from running, and fail (libio/freopen.c). */
static FILE *std_reopen(int fd, const char *path, const char *mode, FILE *fp)
{
	if (!path)
		return fp; /* a mode change: the cookie's mode stays */
	int flags = mode_flags(mode);
	if (flags < 0) {
		errno = EINVAL;
		return NULL;
	}
	int acc = flags & O_ACCMODE;
	if (acc == O_RDWR || (fd == 0) != (acc == O_RDONLY))
		return std_give_back(fd, path, mode, fp);
	if (fd == 0)
		__fpurge(fp); /* what was read ahead belongs to the old file */
	else
		fflush(fp);
	clearerr(fp);
	close(fd);
	int r = open_at(fd, path, flags);
	if (r < 0) {
		/* Closed, as glibc leaves a FILE it could not reopen; the fd
		 * number may go to another file, which fp must not touch. */
		sv_cookie_set_fd(fp, -1);
		atomic_store(&std_files[fd], NULL);
		errno = -r;
		return NULL;
	}
	return fp;
}

static int std_fd_of(FILE *fp)
{
	for (int fd = 0; fd < 3; fd++) {
		if (fp && atomic_load(&std_files[fd]) == fp)
			return fd;
	}
	return -1;
}

/* std_reopen, with the caller's errno kept when it succeeds. */
static FILE *reopen_std(int fd, const char *path, const char *mode, FILE *fp)
{
	int saved = errno;
	FILE *r = std_reopen(fd, path, mode, fp);
	if (r)
		errno = saved;
	return r;
}

SV_EXPORT FILE *freopen(const char *path, const char *mode, FILE *fp)
{
	int fd = std_fd_of(fp);
	return fd < 0 ? SV_REAL(freopen)(path, mode, fp) : reopen_std(fd, path, mode, fp);
}

SV_EXPORT FILE *freopen64(const char *path, const char *mode, FILE *fp)
{
	int fd = std_fd_of(fp);
	return fd < 0 ? SV_REAL(freopen64)(path, mode, fp) : reopen_std(fd, path, mode, fp);
}
