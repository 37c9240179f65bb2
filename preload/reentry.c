/* Calls that reach the interposer while their thread is already inside
 * libsovia (guard.h).
 *
 * libsovia's own code calls the real functions (real.h), and the libraries
 * it calls (librdmacm, libibverbs) read, write and close only their own
 * fds. A call on one of the application's sockets made then comes from a
 * signal handler that interrupted the thread inside libsovia, which may
 * hold a stream's lock or a stripe of the fd table, or be in the middle of
 * a wait: serving it there would deadlock or corrupt the state it
 * interrupted, and giving it to the kernel's socket of a connection on
 * RDMA would misorder or lose its bytes. So it takes no lock: what
 * libsovia has at the fd comes from the table's marks (fdtable.h), and a
 * call that needs libsovia for a connection it serves is refused:
 *
 *   EAGAIN  the calls that move bytes (read, write, send, recv and their
 *           msg, mmsg and vector forms, sendfile, splice, and sendmsg
 *           passing such a connection in SCM_RIGHTS): a handler writing to
 *           a non-blocking socket is prepared for it, and a retry once
 *           the handler returned can succeed;
 *   EBUSY   every other call that needs libsovia's state for it (close,
 *           shutdown, socket options, poll, select, epoll, dup, FIONREAD
 *           and SIOCOUTQ, fdopen, fork, exec and spawns that would hand
 *           it over).
 *
 * Calls on every other fd go to the kernel, as before. A stream's
 * blocking call on the kernel's socket (TCP for good) is no longer inside
 * libsovia while it waits there (stream_rx.c, stream_tx.c): a handler that
 * interrupts it is served in full. */
#include "log.h"
#include "preload.h"

#include <errno.h>
#include <stddef.h>

struct sv_fd *sv_fd_for_call(int fd, bool *refused)
{
	*refused = false;
	if (!atomic_load_explicit(&sv_initialised, memory_order_acquire))
		return NULL;
	if (sv_tls_inside) {
		*refused = sv_fd_claimed(fd, SV_MARK_SERVED);
		return NULL;
	}
	return sv_fd_get(fd);
}

int sv_refuse(int fd, const char *call, int err)
{
	/* Once per kind, from a handler: the message is formatted with %d
	 * and %s only, which glibc's snprintf does without allocating. */
	static atomic_bool told_data, told_other;
	atomic_bool *told = err == EAGAIN ? &told_data : &told_other;
	if (!atomic_exchange(told, true))
		sv_warn("%s() on fd %d from a signal handler that interrupted libsovia on its "
			"thread: refused (%s), libsovia serves that connection and cannot from "
			"there (further refusals are not told)",
			call, fd, err == EAGAIN ? "EAGAIN" : "EBUSY");
	errno = err;
	return -1;
}
