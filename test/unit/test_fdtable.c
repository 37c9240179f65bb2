/* The fd table: refcounting, install/remove, and concurrent lookups. */
#include "fdtable.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int released;

static void count_release(struct sv_fd *f)
{
	(void)f;
	released++;
}

static const struct sv_fd_ops test_ops = {.name = "test", .release = count_release};

static void setup(void)
{
	released = 0;
	cr_assert_eq(sv_fdtable_init(), 0);
}

TestSuite(fdtable, .init = setup, .timeout = 30);

Test(fdtable, unmanaged_fd_is_null)
{
	cr_assert_null(sv_fd_get(5));
	cr_assert_null(sv_fd_get(-1));
	cr_assert_null(sv_fd_get(sv_fdtable_size()));
	cr_assert_null(sv_fd_remove(5));
}

Test(fdtable, install_get_remove_release)
{
	struct sv_fd *f = sv_fd_new(7, &test_ops, NULL);
	cr_assert_not_null(f);
	cr_assert_eq(sv_fd_install(f), 0);
	sv_fd_put(f); /* the table holds it now */
	cr_assert_eq(released, 0);

	struct sv_fd *g = sv_fd_get(7);
	cr_assert_eq(g, f);
	struct sv_fd *r = sv_fd_remove(7);
	cr_assert_eq(r, f);
	cr_assert_null(sv_fd_get(7), "removed fd must be unmanaged");
	sv_fd_put(r);
	cr_assert_eq(released, 0, "a user still holds a reference");
	sv_fd_put(g);
	cr_assert_eq(released, 1);
}

Test(fdtable, install_over_stale_entry_drops_it)
{
	struct sv_fd *a = sv_fd_new(9, &test_ops, NULL);
	struct sv_fd *b = sv_fd_new(9, &test_ops, NULL);
	cr_assert_eq(sv_fd_install(a), 0);
	sv_fd_put(a);
	cr_assert_eq(sv_fd_install(b), 0);
	sv_fd_put(b);
	cr_assert_eq(released, 1, "the stale entry is released");
	sv_fd_put(sv_fd_remove(9));
	cr_assert_eq(released, 2);
}

Test(fdtable, fd_beyond_table_is_refused)
{
	struct sv_fd *f = sv_fd_new(sv_fdtable_size(), &test_ops, NULL);
	cr_assert_eq(sv_fd_install(f), -EMFILE);
	sv_fd_put(f);
	cr_assert_eq(released, 1);
}

static atomic_int stop;

static void *hammer(void *arg)
{
	int fd = (int)(intptr_t)arg;
	long hits = 0;
	while (!atomic_load(&stop)) {
		struct sv_fd *f = sv_fd_get(fd);
		if (f) {
			cr_assert_eq(f->fd, fd);
			hits++;
			sv_fd_put(f);
		}
	}
	return (void *)hits;
}

Test(fdtable, concurrent_get_while_replacing)
{
	pthread_t t[2];
	atomic_store(&stop, 0);
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)11);
	for (int i = 0; i < 20000; i++) {
		struct sv_fd *f = sv_fd_new(11, &test_ops, NULL);
		sv_fd_install(f);
		sv_fd_put(f);
		if (i % 2)
			sv_fd_put(sv_fd_remove(11));
	}
	sv_fd_put(sv_fd_remove(11));
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(released, 20000, "every entry released exactly once");
}

/* A fork while another thread is inside a lookup: the child has no such
 * thread, so a stripe it held must not stay taken there. Each child looks
 * the fd up after the table's fork handler; a deadlock would be killed by
 * its alarm. */
static atomic_bool stop_lookups;

static void *lookups(void *arg)
{
	int fd = (int)(intptr_t)arg;
	while (!atomic_load(&stop_lookups))
		sv_fd_put(sv_fd_get(fd));
	return NULL;
}

Test(fdtable, fork_during_lookups_leaves_no_stripe_taken)
{
	struct sv_fd *f = sv_fd_new(9, &test_ops, NULL);
	cr_assert_eq(sv_fd_install(f), 0);
	sv_fd_put(f);
	pthread_t t;
	atomic_store(&stop_lookups, false);
	cr_assert_eq(pthread_create(&t, NULL, lookups, (void *)(intptr_t)9), 0);
	int bad = 0;
	for (int i = 0; i < 300 && !bad; i++) {
		pid_t pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0) {
			alarm(5);
			sv_fdtable_atfork_child();
			struct sv_fd *g = sv_fd_get(9);
			_exit(g ? 0 : 3);
		}
		int st = 0;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0 ? st : 0;
	}
	atomic_store(&stop_lookups, true);
	pthread_join(t, NULL);
	cr_assert_eq(bad, 0, "a child's lookup failed or hung (status %#x)", bad);
	sv_fd_put(sv_fd_remove(9));
}
