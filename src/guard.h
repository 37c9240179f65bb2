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

#endif
