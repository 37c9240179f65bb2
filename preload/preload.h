/* Shared by the interposer's files: initialisation state, the re-entry
 * guard, and the -errno to -1/errno conversion at the boundary. */
#ifndef SV_PRELOAD_H
#define SV_PRELOAD_H

#include "fdtable.h"
#include "guard.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>

#define SV_EXPORT __attribute__((visibility("default")))

extern atomic_bool sv_initialised;

static inline bool sv_passthrough(void)
{
	return !atomic_load_explicit(&sv_initialised, memory_order_acquire) || sv_tls_inside;
}

/* Convert an internal result (>= 0 or -errno) to the libc convention. On
 * success errno is restored to what the caller had. */
static inline long sv_ret(long r, int saved_errno)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	errno = saved_errno;
	return r;
}

/* fd's connection goes back to plain TCP (if libsovia serves it), and its
 * entry becomes the kernel's (unserved.c). */
void sv_fd_detach(int fd);
/* The same for every fd msg passes to another process (SCM_RIGHTS): the
 * receiver gets the kernel's socket, which must then be the whole
 * connection (unserved.c). Keeps errno. */
struct msghdr;
void sv_fd_detach_passed(const struct msghdr *msg);

/* In a fork child: the FILEs fdopen made stay known (stdio.c). */
void sv_stdio_atfork_child(void);

/* One-time set-up: resolve symbols, load settings, size the fd table. */
void sv_preload_init(void);

#endif
