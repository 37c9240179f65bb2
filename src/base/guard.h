/* The re-entry guard. While it is set on a thread, every interposed call
 * made on that thread goes straight to libc: libsovia's own code (and the
 * libraries it calls, libibverbs and librdmacm, which read and write fds
 * themselves) never loops back into the interposer. */
#ifndef SV_GUARD_H
#define SV_GUARD_H

extern __thread int sv_tls_inside __attribute__((tls_model("initial-exec")));

static inline void sv_enter(void)
{
	sv_tls_inside++;
}

static inline void sv_leave(void)
{
	sv_tls_inside--;
}

/* Around a blocking call of the kernel's own made with no lock of
 * libsovia's held and nothing of its state half changed (a stream's
 * socket that is TCP for good): the thread is not inside libsovia while it
 * waits there, so a signal handler that interrupts it is served in full
 * (preload/reentry.c). */
static inline int sv_guard_suspend(void)
{
	int depth = sv_tls_inside;
	sv_tls_inside = 0;
	return depth;
}

static inline void sv_guard_resume(int depth)
{
	sv_tls_inside = depth;
}

#endif
