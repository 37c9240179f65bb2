/* io_uring reads and writes a socket in the kernel, behind libsovia: on a
 * connection whose bytes travel over RDMA, a ring's reads would wait on a
 * TCP socket that carries nothing, and its writes would reach the peer out
 * of order. liburing makes its system calls itself, so there is no libc
 * call per operation to interpose; what can be seen is a ring being set
 * up. Before the first one (through liburing, or syscall(SYS_io_uring_setup))
 * every accelerated connection goes back to plain TCP (unserved.c's way),
 * and from then on this process upgrades no connection: a ring can be
 * given any socket, at any time. A ring set up by a raw system call
 * instruction of the program's own is not seen (README, limitations). */
#include "log.h"
#include "preload.h"
#include "real.h"
#include "stream.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

static void ring_coming(void)
{
	static atomic_bool seen;
	if (sv_passthrough() || atomic_exchange(&seen, true))
		return;
	int saved = errno;
	sv_info("io_uring in this process: its connections go back to TCP and stay there");
	sv_stream_upgrades_off("io_uring_setup");
	sv_fd_detach_all(false, "io_uring_setup");
	errno = saved;
}

/* liburing's functions are not libc's: resolved on first use, only in
 * processes that call them (and so have liburing loaded). */
#define NEXT(name, type)                                                                    \
	static _Atomic(type) next_;                                                         \
	type fn_ = atomic_load_explicit(&next_, memory_order_acquire);                      \
	if (!fn_) {                                                                         \
		fn_ = (type)dlsym(RTLD_NEXT, name);                                         \
		atomic_store_explicit(&next_, fn_, memory_order_release);                  \
	}                                                                                   \
	if (!fn_) {                                                                         \
		errno = ENOSYS;                                                             \
		return -ENOSYS;                                                             \
	}

/* liburing's own declarations (liburing.h), with its structs opaque. */
int io_uring_queue_init(unsigned entries, void *ring, unsigned flags);
int io_uring_queue_init_params(unsigned entries, void *ring, void *params);
int io_uring_queue_init_mem(unsigned entries, void *ring, void *params, void *buf, size_t size);
int io_uring_setup(unsigned entries, void *params);

typedef int (*init_fn)(unsigned, void *, unsigned);
typedef int (*init_params_fn)(unsigned, void *, void *);
typedef int (*init_mem_fn)(unsigned, void *, void *, void *, size_t);
typedef int (*setup_fn)(unsigned, void *);

SV_EXPORT int io_uring_queue_init(unsigned entries, void *ring, unsigned flags)
{
	NEXT("io_uring_queue_init", init_fn);
	ring_coming();
	return fn_(entries, ring, flags);
}

SV_EXPORT int io_uring_queue_init_params(unsigned entries, void *ring, void *params)
{
	NEXT("io_uring_queue_init_params", init_params_fn);
	ring_coming();
	return fn_(entries, ring, params);
}

SV_EXPORT int io_uring_queue_init_mem(unsigned entries, void *ring, void *params, void *buf,
				      size_t size)
{
	NEXT("io_uring_queue_init_mem", init_mem_fn);
	ring_coming();
	return fn_(entries, ring, params, buf, size);
}

SV_EXPORT int io_uring_setup(unsigned entries, void *params)
{
	NEXT("io_uring_setup", setup_fn);
	ring_coming();
	return fn_(entries, params);
}

/* syscall(2) passes up to six arguments in registers; forwarding six is
 * right for every call, whatever its count. */
SV_EXPORT long syscall(long nr, ...)
{
	va_list ap;
	va_start(ap, nr);
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_io_uring_setup)
		ring_coming();
	return SV_REAL(syscall)(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
