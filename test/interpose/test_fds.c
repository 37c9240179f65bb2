/* libsovia's own descriptors and the application's (issue 53, finding 5):
 * every fd of libsovia's is kept from the application's close-all calls,
 * however many there are (the registry had 256 places, and silently
 * stopped protecting beyond them), and the wrappers close the
 * application's around them. */
#include "preload_harness.h"
#include "ownfd.h"
#include "preload.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

TestSuite(fds, .init = h_setup, .fini = h_teardown, .timeout = 60);

static bool open_fd(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

Test(fds, close_range_keeps_every_fd_of_libsovias)
{
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max < 4096)
		cr_skip_test("RLIMIT_NOFILE's hard limit is below 4096");
	rl.rlim_cur = 4096;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	int null = open("/dev/null", O_RDWR);
	cr_assert_geq(null, 0);
	enum { OURS = 600, APPS = 10 };
	int ours[OURS];
	for (int i = 0; i < OURS; i++) {
		ours[i] = sv_ownfd_dup(null);
		cr_assert_geq(ours[i], sv_ownfd_base(), "ours %d: %d", i, ours[i]);
	}
	/* The application's fds just above and among ours. */
	int first = ours[0], apps[APPS];
	for (int i = 0; i < APPS; i++) {
		apps[i] = ours[OURS - 1] + 1 + i;
		cr_assert_eq(dup2(null, apps[i]), apps[i]);
	}
	cr_assert_eq(sv_ownfd_next((unsigned)first), first);
	cr_assert_eq(close_range((unsigned)first, (unsigned)apps[APPS - 1], 0), 0);
	for (int i = 0; i < OURS; i++)
		cr_assert(open_fd(ours[i]), "libsovia's fd %d (its %dth) was closed", ours[i], i + 1);
	for (int i = 0; i < APPS; i++)
		cr_assert_not(open_fd(apps[i]), "the application's fd %d is open", apps[i]);
	for (int i = 0; i < OURS; i++)
		cr_assert_eq(sv_ownfd_close(ours[i]), 0);
	cr_assert_eq(sv_ownfd_next((unsigned)first), -1, "none of ours left there");
	close(null);
}
