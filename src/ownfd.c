#include "ownfd.h"

#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>

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
	return c < 0 ? -errno : c;
}

int sv_ownfd_move(int fd)
{
	int base = sv_ownfd_base();
	if (fd < 0 || fd >= base)
		return fd;
	int saved = errno;
	int hi = SV_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, base);
	if (hi < 0) {
		errno = saved; /* none free up there: it stays where it is */
		return fd;
	}
	SV_REAL(close)(fd);
	return hi;
}
