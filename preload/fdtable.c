#include "fdtable.h"

#include "guard.h"
#include "lock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define SV_FD_MAX (1 << 20)
#define SV_FD_STRIPES 64

static _Atomic(struct sv_fd *) *slots;
/* Per fd, what a call from inside libsovia may learn without a lock
 * (SV_MARK_*). */
static atomic_uchar *marks;
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
	size_t bytes = (size_t)want * (sizeof(*slots) + sizeof(*marks));
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		init_err = -errno;
		return;
	}
	for (int i = 0; i < SV_FD_STRIPES; i++)
		sv_lock_init(&stripes[i], SV_RANK_FDTABLE);
	slots = p;
	marks = (atomic_uchar *)(slots + want);
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

void (*sv_fdtable_test_held)(int fd);

/* A stripe is taken inside libsovia (guard.h), so that a signal handler
 * that interrupts its holder never waits for it: its calls see they come
 * from inside and take no lock. */
static void stripe_lock(int fd)
{
	sv_enter();
	sv_lock(stripe_of(fd));
}

static void stripe_unlock(int fd)
{
	sv_unlock(stripe_of(fd));
	sv_leave();
}

/* What the table says of an entry's fd, for the marks. */
static unsigned char mark_of(const struct sv_fd *f)
{
	return f && f->ops && f->ops->detach ? SV_MARK_SERVED : 0;
}

struct sv_fd *sv_fd_get(int fd)
{
	if (fd < 0 || fd >= nslots)
		return NULL;
	/* Fast path for fds that are not ours: no lock. */
	if (!atomic_load_explicit(&slots[fd], memory_order_relaxed))
		return NULL;
	stripe_lock(fd);
	struct sv_fd *f = atomic_load_explicit(&slots[fd], memory_order_relaxed);
	if (f)
		atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
	if (sv_fdtable_test_held)
		sv_fdtable_test_held(fd);
	stripe_unlock(fd);
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
	stripe_lock(f->fd);
	struct sv_fd *old = atomic_exchange_explicit(&slots[f->fd], f, memory_order_release);
	sv_fd_set_mark(f->fd, SV_MARK_SERVED, mark_of(f));
	stripe_unlock(f->fd);
	sv_fd_put(old);
	return 0;
}

int sv_fd_swap(struct sv_fd *old, struct sv_fd *f)
{
	if (f->fd != old->fd || f->fd < 0 || f->fd >= nslots)
		return -EINVAL;
	stripe_lock(f->fd);
	struct sv_fd *cur = atomic_load_explicit(&slots[f->fd], memory_order_relaxed);
	if (cur == old) {
		atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
		atomic_store_explicit(&slots[f->fd], f, memory_order_release);
		sv_fd_set_mark(f->fd, SV_MARK_SERVED, mark_of(f));
	}
	stripe_unlock(f->fd);
	if (cur != old)
		return -ESTALE;
	sv_fd_put(old); /* the table's */
	return 0;
}

struct sv_fd *sv_fd_remove(int fd)
{
	if (fd < 0 || fd >= nslots)
		return NULL;
	if (!atomic_load_explicit(&slots[fd], memory_order_relaxed))
		return NULL;
	stripe_lock(fd);
	struct sv_fd *f = atomic_exchange_explicit(&slots[fd], NULL, memory_order_acq_rel);
	sv_fd_set_mark(fd, SV_MARK_SERVED, 0);
	stripe_unlock(fd);
	return f;
}

void sv_fd_unserve(struct sv_fd *f)
{
	if (!(sv_fd_marks(f->fd) & SV_MARK_SERVED))
		return;
	stripe_lock(f->fd);
	if (atomic_load_explicit(&slots[f->fd], memory_order_relaxed) == f)
		sv_fd_set_mark(f->fd, SV_MARK_SERVED, 0);
	stripe_unlock(f->fd);
}

unsigned sv_fd_marks(int fd)
{
	if (fd < 0 || fd >= nslots)
		return 0;
	unsigned m = atomic_load_explicit(&marks[fd], memory_order_acquire);
	if (atomic_load_explicit(&slots[fd], memory_order_acquire))
		m |= SV_MARK_MANAGED;
	return m;
}

void sv_fd_set_mark(int fd, unsigned mark, unsigned value)
{
	if (fd < 0 || fd >= nslots)
		return;
	if (value & mark)
		atomic_fetch_or_explicit(&marks[fd], (unsigned char)mark, memory_order_release);
	else
		atomic_fetch_and_explicit(&marks[fd], (unsigned char)~mark, memory_order_release);
}

void sv_fdtable_atfork_child(void)
{
	/* A thread that held a stripe when another forked does not exist in
	 * the child: the stripe would stay taken. */
	if (slots)
		for (int i = 0; i < SV_FD_STRIPES; i++)
			sv_lock_reinit(&stripes[i]);
}
