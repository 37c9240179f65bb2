#include "real.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

struct sv_real sv_real;
atomic_bool sv_real_ready;

static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;

/* Any address inside this module, to recognise a symbol that resolves back to us. */
static void *self_base(void)
{
	Dl_info info;
	if (!dladdr((void *)&self_base, &info))
		return NULL;
	return info.dli_fbase;
}

/* The process cannot go on without libc's own call: say so on stderr,
 * with the raw write (the log's calls come through this table), and
 * abort. */
_Noreturn static void cannot(const char *name, const char *why, const char *what)
{
	char msg[512];
	int n = snprintf(msg, sizeof(msg), "libsovia: fatal: the real %s() %s (%s)\n", name, why,
			 what ? what : "?");
	long (*sc)(long, ...) = sv_real_syscall();
	if (sc && n > 0)
		(void)sc(SYS_write, 2, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
	abort();
}

static void *resolve_one(const char *name, void *self)
{
	void *fn = dlsym(RTLD_NEXT, name);
	if (!fn)
		cannot(name, "cannot be resolved", dlerror());
	Dl_info info;
	if (self && dladdr(fn, &info) && info.dli_fbase == self)
		cannot(name, "resolves back into libsovia", info.dli_fname);
	return fn;
}

static void resolve_all(void)
{
	void *self = self_base();
#define SV_REAL_RESOLVE(name, ret, args) sv_real.name = (ret(*) args)resolve_one(#name, self);
	SV_REAL_SYMBOLS(SV_REAL_RESOLVE)
#undef SV_REAL_RESOLVE
	atomic_store_explicit(&sv_real_ready, true, memory_order_release);
}

void sv_real_resolve(void)
{
	pthread_once(&resolve_once, resolve_all);
}

FILE **sv_real_std(int fd)
{
	static const char *const names[3] = {"stdin", "stdout", "stderr"};
	static FILE **_Atomic vars[3];
	if (fd < 0 || fd > 2)
		return NULL;
	FILE **v = atomic_load_explicit(&vars[fd], memory_order_acquire);
	if (!v) {
		/* RTLD_NEXT looks past libsovia (and past an executable that
		 * links the wrappers in, as the tests do): libc's definition. */
		v = dlsym(RTLD_NEXT, names[fd]);
		atomic_store_explicit(&vars[fd], v, memory_order_release);
	}
	return v;
}

long (*sv_real_syscall(void))(long, ...)
{
	typedef long (*syscall_fn)(long, ...);
	if (atomic_load_explicit(&sv_real_ready, memory_order_acquire))
		return sv_real.syscall;
	/* Not through sv_real_resolve: this may run inside it (cannot()). */
	static _Atomic(syscall_fn) early;
	syscall_fn fn = atomic_load_explicit(&early, memory_order_acquire);
	if (!fn) {
		fn = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
		atomic_store_explicit(&early, fn, memory_order_release);
	}
	return fn;
}
