#include "real.h"

#include "log.h"

#include <dlfcn.h>
#include <pthread.h>

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

static void *resolve_one(const char *name, void *self)
{
	void *fn = dlsym(RTLD_NEXT, name);
	if (!fn)
		sv_fatal("cannot resolve the real %s(): %s", name, dlerror());
	Dl_info info;
	if (self && dladdr(fn, &info) && info.dli_fbase == self)
		sv_fatal("the real %s() resolves back into libsovia (%s)", name, info.dli_fname);
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

long (*sv_real_syscall(void))(long, ...)
{
	typedef long (*syscall_fn)(long, ...);
	if (atomic_load_explicit(&sv_real_ready, memory_order_acquire))
		return sv_real.syscall;
	/* Not through sv_real_resolve: this may run inside it (sv_fatal). */
	static _Atomic(syscall_fn) early;
	syscall_fn fn = atomic_load_explicit(&early, memory_order_acquire);
	if (!fn) {
		fn = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
		atomic_store_explicit(&early, fn, memory_order_release);
	}
	return fn;
}
