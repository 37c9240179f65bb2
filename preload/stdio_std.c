/* stdin, stdout and stderr of an image exec'd on a handed connection:
 * glibc's own FILEs read and write fds 0-2 with its internal calls, past
 * the interposer, so once the connection moves to RDMA they would miss
 * bytes or put them out of order. Before main(), libsovia's constructor
 * replaces each one whose fd carries the connection by a cookie FILE
 * (stdio.c), whose calls come back through read, write and close. */
#include "preload.h"
#include "stdio_int.h"

#include <dlfcn.h>

/* The FILE taken for fd 0, 1 or 2, while it is open. */
static FILE *_Atomic std_files[3];

static const char *const std_names[3] = {"stdin", "stdout", "stderr"};
/* The FILEs glibc's variables start at (libio/stdfiles.c). */
static const char *const std_glibc[3] = {"_IO_2_1_stdin_", "_IO_2_1_stdout_", "_IO_2_1_stderr_"};

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
 * older ones read their own through a hidden alias (_IO_stdout). RTLD_NEXT looks past libsovia (and past an executable that
 * links the wrappers in, as the tests do): libc's definition. */
static FILE **libc_var(int fd)
{
	return dlsym(RTLD_NEXT, std_names[fd]);
}

/* Nothing has used fp: no buffer, nothing buffered, no orientation. */
static bool pristine(const FILE *fp)
{
	return fp->_IO_buf_base == NULL && fp->_IO_read_ptr == fp->_IO_read_end &&
	       fp->_IO_write_ptr == fp->_IO_write_base && fp->_mode == 0;
}

int sv_stdio_take_std(int fd)
{
	if (fd < 0 || fd > 2)
		return -EINVAL;
	if (sv_stdio_ours(fd))
		return 0;
	FILE *glibc = dlsym(RTLD_NEXT, std_glibc[fd]);
	FILE **ours = std_var(fd), **libcs = libc_var(fd);
	if (!glibc || !libcs)
		return -ENOENT;
	/* Bytes an earlier constructor left in glibc's FILE, or a FILE it
	 * put there, would be lost or bypass us. */
	if (*ours != glibc || *libcs != glibc || !pristine(glibc))
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
	*ours = fp;
	*libcs = fp;
	atomic_store(&std_files[fd], fp);
	return 0;
}
