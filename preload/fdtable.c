#include "fdtable.h"

#include "lock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define SV_FD_MAX (1 << 20)
#define SV_FD_STRIPES 64

static _Atomic(struct sv_fd *) *slots;
static int nslots;
static struct sv_lock stripes[SV_FD_STRIPES];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_err;

static void table_init(void)
{
	struct rlimit rl;
	rlim_t want = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > want)
		want = rl.rlim_max;
	if (want > SV_FD_MAX)
		want = SV_FD_MAX;
	/* Untouched pages cost nothing: most programs use a few low fds. */
	void *p = mmap(NULL, (size_t)want * sizeof(*slots), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		init_err = -errno;
		return;
	}
	for (int i = 0; i < SV_FD_STRIPES; i++)
		sv_lock_init(&stripes[i], SV_RANK_FDTABLE);
	slots = p;
	nslots = (int)want;
}

int sv_fdtable_init(void)
{
	pthread_once(&init_once, table_init);
	return init_err;
}

int sv_fdtable_size(void)
{
	return nslots;
}

static struct sv_lock *stripe_of(int fd)
{
	return &stripes[(unsigned)fd % SV_FD_STRIPES];
}

struct sv_fd *sv_fd_new(int fd, const struct sv_fd_ops *ops, void *priv)
{
	struct sv_fd *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	atomic_init(&f->refs, 1);
	f->fd = fd;
	f->ops = ops;
	f->priv = priv;
	return f;
}

struct sv_fd *sv_fd_get(int fd)
{
	if (fd < 0 || fd >= nslots)
		return NULL;
	/* Fast path for fds that are not ours: no lock. */
	if (!atomic_load_explicit(&slots[fd], memory_order_relaxed))
		return NULL;
	struct sv_lock *m = stripe_of(fd);
	sv_lock(m);
	struct sv_fd *f = atomic_load_explicit(&slots[fd], memory_order_relaxed);
	if (f)
		atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
	sv_unlock(m);
	return f;
}

void sv_fd_put(struct sv_fd *f)
{
	if (!f)
		return;
	if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (f->ops && f->ops->release)
		f->ops->release(f);
	free(f);
}

int sv_fd_install(struct sv_fd *f)
{
	if (f->fd < 0 || f->fd >= nslots)
		return -EMFILE;
	atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
	struct sv_lock *m = stripe_of(f->fd);
	sv_lock(m);
	struct sv_fd *old = atomic_exchange_explicit(&slots[f->fd], f, memory_order_release);
	sv_unlock(m);
	sv_fd_put(old);
	return 0;
}

struct sv_fd *sv_fd_remove(int fd)
{
	if (fd < 0 || fd >= nslots)
		return NULL;
	if (!atomic_load_explicit(&slots[fd], memory_order_relaxed))
		return NULL;
	struct sv_lock *m = stripe_of(fd);
	sv_lock(m);
	struct sv_fd *f = atomic_exchange_explicit(&slots[fd], NULL, memory_order_acq_rel);
	sv_unlock(m);
	return f;
}

void sv_fdtable_atfork_child(void)
{
	/* A thread that held a stripe when another forked does not exist in
	 * the child: the stripe would stay taken. */
	if (slots)
		for (int i = 0; i < SV_FD_STRIPES; i++)
			sv_lock_reinit(&stripes[i]);
}
