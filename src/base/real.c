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
