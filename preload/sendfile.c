/* sendfile, sendfile64 and splice on a connection libsovia serves: the
 * bytes go through the stream's own calls (the write path that write()
 * and send() take, the read path of recv()), so they keep their place in
 * the stream, its medium (the QP once upgraded, the held writes of an
 * upgrade in progress), blocking mode, SO_SNDTIMEO, EINTR and EPIPE with
 * SIGPIPE. The kernel's calls would write the kernel's socket under the
 * QP's bytes.
 *
 *   sendfile(out, in)   in a regular file: read with pread into a buffer
 *                       of libsovia's, a chunk at a time, and written to
 *                       the stream; the offset (*off, or in's file offset)
 *                       moves by exactly what the stream took
 *   splice(pipe, out)   the pipe's bytes are copied with tee into a pipe of
 *                       libsovia's and read from there, written to the
 *                       stream, and only what the stream took is read off
 *                       the application's pipe: a partial write leaves the
 *                       rest in it
 *   splice(in, pipe)    the stream's bytes are peeked (MSG_PEEK) and
 *                       vmspliced into the pipe, and only what the pipe
 *                       took is read from the stream
 *
 * As the kernel's: SPLICE_F_NONBLOCK (or O_NONBLOCK on the pipe) makes the
 * pipe's side non-blocking, the socket's side follows the socket's mode.
 * The kernel's error for a call it refuses (offsets on a socket or pipe,
 * no pipe on either side) moves no byte, so such a call goes to it as it
 * is. Two callers of one pipe at once may interleave differently from the
 * kernel's, which holds the pipe's lock across a splice.
 *
 * A sendfile from anything but a regular file (a pipe, a socket, a
 * device), or from one opened O_DIRECT, takes the connection back to
 * plain TCP first (protocol.md, section 10) and is the kernel's. So are
 * both calls on a connection that is plain TCP for good. copy_file_range
 * is not interposed: the kernel refuses a socket (EINVAL) without moving a
 * byte. */
#include "preload.h"
#include "real.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* The most a call moves per round: below the default zero-copy threshold
 * (SOVIA_REG_THRESHOLD), so the buffer is copied into the stream's own
 * registered ones, and no larger than a pipe's default capacity. */
enum { CHUNK = 64 * 1024 };
/* The kernel's most per read or write (MAX_RW_COUNT). */
#define MAX_RW ((size_t)0x7ffff000)

/* What a call does when libsovia does not serve it. */
enum unserved {
	SERVED,
	TO_KERNEL, /* to the kernel as it is: it moves no byte of the stream */
	DETACH,    /* the connection goes back to plain TCP first */
};

/* fd's entry when libsovia serves its connection (a reference), else NULL. */
static struct sv_fd *served(int fd, const char *call)
{
	struct sv_fd *f = sv_fd_get(fd);
	if (f && f->ops->detach &&
	    !(f->ops->wait && f->ops->wait->kernel_only && f->ops->wait->kernel_only(f)))
		return f;
	/* The kernel's socket alone carries it: the call is the kernel's,
	 * and the fd is for good (a successor that moved the connection to
	 * RDMA again, src/share/redo.c, would not count these bytes). */
	if (f && f->ops->detach)
		(void)f->ops->detach(f, call);
	sv_fd_put(f);
	return NULL;
}

/* A buffer of libsovia's for one call: mmap, not malloc, so a call from a
 * signal handler that interrupted malloc is safe. */
static void *buf_get(size_t len)
{
	void *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return b == MAP_FAILED ? NULL : b;
}

/* The calls that only copy through their buffer use their thread's own,
 * mapped at its first such call and unmapped when the thread ends: a call
 * (nginx makes one per response) then costs no mmap, page faults and
 * munmap. A signal handler that calls in while its thread's buffer is in
 * use gets one of its own for the call. */
enum { TBUF = 2 * CHUNK };
static __thread uint8_t *tbuf __attribute__((tls_model("initial-exec")));
static __thread bool tbuf_busy __attribute__((tls_model("initial-exec")));
static pthread_key_t tbuf_key;
static pthread_once_t tbuf_once = PTHREAD_ONCE_INIT;

static void tbuf_free(void *b)
{
	munmap(b, TBUF);
}

static void tbuf_init(void)
{
	(void)pthread_key_create(&tbuf_key, tbuf_free);
}

static uint8_t *tbuf_take(void)
{
	if (tbuf_busy)
		return buf_get(TBUF);
	if (!tbuf) {
		pthread_once(&tbuf_once, tbuf_init);
		tbuf = buf_get(TBUF);
		if (!tbuf)
			return NULL;
		(void)pthread_setspecific(tbuf_key, tbuf);
	}
	tbuf_busy = true;
	return tbuf;
}

static void tbuf_give(uint8_t *b)
{
	if (b == tbuf)
		tbuf_busy = false;
	else
		munmap(b, TBUF);
}

static long stream_send(struct sv_fd *f, void *buf, size_t n, int flags)
{
	struct iovec iov = {buf, n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return f->ops->sendmsg(f, &m, flags);
}

static long stream_recv(struct sv_fd *f, void *buf, size_t n, int flags)
{
	struct iovec iov = {buf, n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return f->ops->recvmsg(f, &m, flags);
}

/* ---- sendfile ------------------------------------------------------------- */

/* Send [pos, pos + count) of in to the stream, a chunk at a time; the
 * bytes the stream took, or -errno when it took none. */
static long file_to_stream(struct sv_fd *f, int in, off_t pos, size_t count)
{
	size_t blen = count < CHUNK ? count : CHUNK;
	uint8_t *buf = tbuf_take();
	if (!buf)
		return -ENOMEM;
	size_t done = 0;
	long err = 0;
	while (done < count) {
		size_t want = count - done < blen ? count - done : blen;
		ssize_t n = pread(in, buf, want, pos + (off_t)done);
		if (n <= 0) {
			err = n < 0 ? -errno : 0; /* 0: the end of the file */
			break;
		}
		long w = stream_send(f, buf, (size_t)n, 0);
		if (w < 0) {
			err = w;
			break;
		}
		done += (size_t)w;
		if (w < n) /* a partial write: the call ends with it, as the kernel's */
			break;
	}
	tbuf_give(buf);
	return done || !err ? (long)done : err;
}

static long send_file(struct sv_fd *f, int in, off_t *off, size_t count, enum unserved *un)
{
	struct stat st;
	if (fstat(in, &st) < 0)
		return -errno;
	int fl = sv_real.fcntl(in, F_GETFL, 0);
	if (fl < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (fl & O_DIRECT)) {
		*un = DETACH;
		return 0;
	}
	if ((fl & O_ACCMODE) == O_WRONLY || (fl & O_PATH))
		return -EBADF;
	if ((ssize_t)count < 0 || (off && *off < 0))
		return -EINVAL;
	off_t pos = off ? *off : lseek(in, 0, SEEK_CUR);
	if (pos < 0)
		return -errno;
	if (count == 0)
		return 0;
	long r = file_to_stream(f, in, pos, count > MAX_RW ? MAX_RW : count);
	if (r > 0) { /* the bytes are out: the count is the answer */
		if (off)
			*off = pos + r;
		else
			(void)lseek(in, pos + r, SEEK_SET);
	}
	return r;
}

static ssize_t sendfile_common(const char *name, int out, int in, off_t *off, size_t count)
{
	if (sv_reentered() && sv_fd_claimed(out, SV_MARK_SERVED))
		return sv_refuse(out, name, EAGAIN);
	int saved = errno;
	struct sv_fd *f = sv_passthrough() ? NULL : served(out, name);
	errno = saved;
	if (!f)
		return SV_REAL(sendfile)(out, in, off, count);
	enum unserved un = SERVED;
	long r = send_file(f, in, off, count, &un);
	sv_fd_put(f);
	if (un == SERVED)
		return sv_ret(r, saved);
	sv_fd_detach(out, "sendfile(not-a-regular-file)");
	errno = saved;
	return SV_REAL(sendfile)(out, in, off, count);
}

SV_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	return sendfile_common("sendfile", out, in, off, count);
}

SV_EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	return sendfile_common("sendfile64", out, in, off, count);
}

/* ---- splice --------------------------------------------------------------- */

/* Is fd a pipe (or FIFO)? SPLICE_F_NONBLOCK added to *flags when it is in
 * non-blocking mode, as the kernel's splice does. */
static int pipe_mode(int fd, unsigned int *flags)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISFIFO(st.st_mode))
		return 0;
	int fl = sv_real.fcntl(fd, F_GETFL, 0);
	if (fl < 0)
		return -errno;
	if (fl & O_NONBLOCK)
		*flags |= SPLICE_F_NONBLOCK;
	return 1;
}

/* Read exactly n bytes that are there already off fd (a pipe) or the
 * stream f: what a round used. */
static void take(int fd, struct sv_fd *f, uint8_t *buf, size_t n)
{
	while (n) {
		long r = f ? stream_recv(f, buf, n, MSG_DONTWAIT) : sv_real.read(fd, buf, n);
		if (r <= 0)
			return; /* another reader took them */
		n -= (size_t)r;
	}
}

/* The pipe in's first bytes, up to len, to the stream f. */
static long pipe_to_stream(struct sv_fd *f, int in, size_t len, unsigned int flags,
			   enum unserved *un)
{
	int tmp[2];
	if (pipe2(tmp, O_CLOEXEC) < 0) {
		*un = DETACH;
		return 0;
	}
	uint8_t *buf = tbuf_take();
	if (!buf) {
		sv_real.close(tmp[0]);
		sv_real.close(tmp[1]);
		*un = DETACH;
		return 0;
	}
	long r = tee(in, tmp[1], len < CHUNK ? len : CHUNK, flags & SPLICE_F_NONBLOCK);
	if (r < 0)
		r = -errno;
	if (r > 0) {
		size_t n = (size_t)r;
		take(tmp[0], NULL, buf, n);
		r = stream_send(f, buf, n, flags & SPLICE_F_MORE ? MSG_MORE : 0);
		if (r > 0)
			take(in, NULL, buf + CHUNK, (size_t)r);
	}
	tbuf_give(buf);
	sv_real.close(tmp[0]);
	sv_real.close(tmp[1]);
	return r;
}

/* The stream f's first bytes, up to len, to the pipe out. */
static long stream_to_pipe(struct sv_fd *f, int out, size_t len, unsigned int flags,
			   enum unserved *un)
{
	/* A mapping of its own: the pipe keeps a reference to its pages. */
	uint8_t *buf = buf_get(2 * CHUNK);
	if (!buf) {
		*un = DETACH;
		return 0;
	}
	long r = stream_recv(f, buf, len < CHUNK ? len : CHUNK, MSG_PEEK);
	if (r > 0) {
		/* The pipe takes the pages themselves: they stay as they are
		 * (the rest is read into the buffer's other half). */
		struct iovec v = {buf, (size_t)r};
		r = vmsplice(out, &v, 1, flags & SPLICE_F_NONBLOCK);
		if (r < 0)
			r = -errno;
		else
			take(-1, f, buf + CHUNK, (size_t)r);
	}
	munmap(buf, 2 * CHUNK);
	return r;
}

static long splice_served(struct sv_fd *fi, int in, loff_t *off_in, struct sv_fd *fo, int out,
			  loff_t *off_out, size_t len, unsigned int flags, enum unserved *un)
{
	*un = TO_KERNEL;
	if ((fi && fo) || off_in || off_out)
		return 0;
	int pipe = pipe_mode(fi ? out : in, &flags);
	if (pipe <= 0)
		return pipe;
	*un = SERVED;
	if (len == 0)
		return 0;
	return fo ? pipe_to_stream(fo, in, len, flags, un) : stream_to_pipe(fi, out, len, flags, un);
}

SV_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
			 unsigned int flags)
{
	if (sv_reentered() && (sv_fd_claimed(in, SV_MARK_SERVED) ||
			       sv_fd_claimed(out, SV_MARK_SERVED)))
		return sv_refuse(sv_fd_claimed(in, SV_MARK_SERVED) ? in : out, "splice", EAGAIN);
	int saved = errno;
	struct sv_fd *fi = sv_passthrough() ? NULL : served(in, "splice");
	struct sv_fd *fo = sv_passthrough() ? NULL : served(out, "splice");
	errno = saved;
	if (!fi && !fo)
		return SV_REAL(splice)(in, off_in, out, off_out, len, flags);
	enum unserved un = SERVED;
	long r = splice_served(fi, in, off_in, fo, out, off_out, len, flags, &un);
	sv_fd_put(fi);
	sv_fd_put(fo);
	if (un == SERVED || r < 0)
		return sv_ret(r, saved);
	if (un == DETACH) {
		sv_fd_detach(in, "splice");
		sv_fd_detach(out, "splice");
	}
	errno = saved;
	return SV_REAL(splice)(in, off_in, out, off_out, len, flags);
}
