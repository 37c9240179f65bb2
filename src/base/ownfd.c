#include "ownfd.h"

#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/resource.h>

/* fd + 1 per slot, 0 when free; `used` bounds the slots ever taken. */
static atomic_int slots[SV_OWNFD_SLOTS];
static atomic_int used;

void sv_ownfd_add(int fd)
{
	if (fd < 0 || sv_ownfd_is(fd))
		return;
	for (int i = 0; i < SV_OWNFD_SLOTS; i++) {
		int zero = 0;
		if (atomic_compare_exchange_strong(&slots[i], &zero, fd + 1)) {
			int u = atomic_load(&used);
			while (u < i + 1 && !atomic_compare_exchange_weak(&used, &u, i + 1))
				;
			return;
		}
	}
}

void sv_ownfd_del(int fd)
{
	int n = atomic_load(&used);
	for (int i = 0; i < n; i++) {
		int want = fd + 1;
		atomic_compare_exchange_strong(&slots[i], &want, 0);
	}
}

bool sv_ownfd_is(int fd)
{
	if (fd < 0)
		return false;
	int n = atomic_load(&used);
	for (int i = 0; i < n; i++)
		if (atomic_load_explicit(&slots[i], memory_order_relaxed) == fd + 1)
			return true;
	return false;
}

int sv_ownfd_close(int fd)
{
	sv_ownfd_del(fd);
	return SV_REAL(close)(fd);
}

int sv_ownfd_in(unsigned first, unsigned last, int *out, int max)
{
	int n = atomic_load(&used), k = 0;
	for (int i = 0; i < n && k < max; i++) {
		int v = atomic_load(&slots[i]) - 1;
		if (v >= 0 && (unsigned)v >= first && (unsigned)v <= last)
			out[k++] = v;
	}
	for (int i = 1; i < k; i++) /* a few: insertion sort */
		for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
			int t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return k;
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
