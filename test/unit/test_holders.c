/* The holders' table (src/holders.h): a process's entries found by the
 * port's owner, removed once served, stale ones dropped, a full table
 * refused, and shared with a fork's child. */
#include "holders.h"
#include "addr.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(holders, .timeout = 30);


Test(holders, an_entry_is_found_until_removed)
{
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	cr_assert_eq(sv_holders_get(), h, "one table per process");
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.2", 40000);
	struct sockaddr_storage other = v4("10.77.0.2", 40001);
	int slot = sv_holders_add(h, &srv, &cli, 61000);
	cr_assert_geq(slot, 0);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 61000);
	cr_assert_eq(sv_holders_find(h, &srv, &other), 0, "another client port is another connection");
	cr_assert_eq(sv_holders_find(h, &cli, &srv), 0, "the roles are part of the key");
	sv_holders_remove(h, slot);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0);
}

/* A child enters its connection in the table it inherited; the parent
 * finds it. Once the child has exited, its forgotten entry is dropped. */
Test(holders, a_childs_entry_reaches_the_parent_and_dies_with_it)
{
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	cr_assert_not(sv_holders_forked(h));
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.2", 40002);
	int up[2], go[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		sv_holders_mark_forked(h);
		char c = sv_holders_add(h, &srv, &cli, 62000) >= 0 ? 'y' : 'n';
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(0); /* without removing its entry */
	}
	char c = 0;
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(c, 'y');
	cr_assert(sv_holders_forked(h), "the child's mark is the parent's too");
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 62000);
	sv_holders_remove(h, 0); /* not ours: nothing happens */
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 62000);
	cr_assert_eq(write(go[1], "x", 1), 1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "an exited process's entry was still found");
}

Test(holders, a_full_table_refuses)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80);
	int n = 0, r;
	for (;;) {
		struct sockaddr_storage cli = v4("10.77.0.2", (uint16_t)(1 + n % 60000));
		((struct sockaddr_in *)&cli)->sin_addr.s_addr = htonl(0x0a4d0000u + (unsigned)n);
		r = sv_holders_add(h, &srv, &cli, 63000);
		if (r < 0)
			break;
		n++;
		cr_assert_lt(n, 1000000, "the table never fills");
	}
	cr_assert_eq(r, -ENOSPC);
	cr_assert_gt(n, 1000, "only %d entries", n);
	sv_holders_remove(h, 5);
	struct sockaddr_storage cli = v4("10.99.0.1", 1);
	cr_assert_eq(sv_holders_add(h, &srv, &cli, 63001), 5, "a removed entry is taken again");
}
