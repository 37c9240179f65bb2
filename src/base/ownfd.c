#include "ownfd.h"

#include "log.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* A bit per fd number: pages of PAGE_FDS bits, made (mmap: no malloc a
 * signal handler could interrupt) the first time an fd of theirs is
 * added, never freed. */
#define PAGE_FDS 4096
#define WORD_BITS (8 * (int)sizeof(unsigned long))
#define NPAGES (SV_OWNFD_MAX / PAGE_FDS)

static _Atomic(atomic_ulong *) pages[NPAGES];

static atomic_ulong *page_of(int fd, bool make)
{
	atomic_ulong *p = atomic_load_explicit(&pages[fd / PAGE_FDS], memory_order_acquire);
	if (p || !make)
		return p;
	void *m = mmap(NULL, PAGE_FDS / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	atomic_ulong *want = NULL;
	if (atomic_compare_exchange_strong(&pages[fd / PAGE_FDS], &want, (atomic_ulong *)m))
		return m;
	munmap(m, PAGE_FDS / 8); /* another thread made it first */
	return want;
}

void sv_ownfd_add(int fd)
{
	if (fd < 0)
		return;
	atomic_ulong *p = fd < SV_OWNFD_MAX ? page_of(fd, true) : NULL;
	if (!p) {
		static atomic_bool told;
		if (!atomic_exchange(&told, true))
			sv_warn("fd %d of libsovia's cannot be kept from the application's close-all "
				"calls (%s)", fd, fd < SV_OWNFD_MAX ? "no memory" : "too high");
		return;
	}
	int bit = fd % PAGE_FDS;
	atomic_fetch_or(&p[bit / WORD_BITS], 1UL << (bit % WORD_BITS));
}

void sv_ownfd_del(int fd)
{
	atomic_ulong *p = fd >= 0 && fd < SV_OWNFD_MAX ? page_of(fd, false) : NULL;
	if (!p)
		return;
	int bit = fd % PAGE_FDS;
	atomic_fetch_and(&p[bit / WORD_BITS], ~(1UL << (bit % WORD_BITS)));
}

bool sv_ownfd_is(int fd)
{
	atomic_ulong *p = fd >= 0 && fd < SV_OWNFD_MAX ? page_of(fd, false) : NULL;
	if (!p)
		return false;
	int bit = fd % PAGE_FDS;
	return atomic_load_explicit(&p[bit / WORD_BITS], memory_order_relaxed) &
	       (1UL << (bit % WORD_BITS));
}

int sv_ownfd_close(int fd)
{
	sv_ownfd_del(fd);
	return SV_REAL(close)(fd);
}

int sv_ownfd_next(unsigned from)
{
	for (unsigned fd = from; fd < SV_OWNFD_MAX;) {
		atomic_ulong *p = page_of((int)fd, false);
		if (!p) {
			fd = (fd / PAGE_FDS + 1) * PAGE_FDS; /* a page with none of ours */
			continue;
		}
		unsigned bit = fd % PAGE_FDS;
		unsigned long w = atomic_load_explicit(&p[bit / WORD_BITS], memory_order_relaxed) >>
				  (bit % WORD_BITS);
		if (w)
			return (int)(fd + (unsigned)__builtin_ctzl(w));
		fd += (unsigned)(WORD_BITS - (int)(bit % WORD_BITS)); /* the next word */
	}
	return -1;
}

int sv_ownfd_base(void)
{
	struct rlimit rl;
	int base = 1000;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (rlim_t)base >= rl.rlim_cur)
		base = (int)(rl.rlim_cur > 64 ? rl.rlim_cur - 64 : 3);
	return base;
}

int sv_ownfd_dup(int fd)
{
	int c = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, sv_ownfd_base());
	if (c < 0)
		c = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, 0);
	if (c < 0)
		return -errno;
	sv_ownfd_add(c);
	return c;
}

int sv_ownfd_dup_above(int fd)
{
	int c = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, sv_ownfd_base());
	if (c < 0)
		return errno == EINVAL ? -EMFILE : -errno;
	sv_ownfd_add(c);
	return c;
}

int sv_ownfd_move(int fd)
{
	int base = sv_ownfd_base();
	if (fd < 0 || fd >= base) {
		sv_ownfd_add(fd);
		return fd;
	}
	int saved = errno;
	int hi = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, base);
	if (hi < 0) {
		errno = saved; /* none free up there: it stays where it is */
		sv_ownfd_add(fd);
		return fd;
	}
	SV_REAL(close)(fd);
	sv_ownfd_add(hi);
	return hi;
}
