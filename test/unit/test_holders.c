/* The holders' table (src/holders.h): a process's entries found by the
 * port's owner, removed once served, stale ones dropped, a full table
 * refused, shared with a fork's child, and found again by an exec'd image
 * through the table's sealed memfd. */
#include "holders.h"
#include "addr.h"
#include "ownfd.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* A connection handed to a fork's child: the owner finds the child's port
 * only once the child claimed it and the parent released its copy. */
Test(holders, a_handed_connection_is_found_once_the_child_holds_it_alone)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.3", 40010);
	struct sv_hand hd;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &hd), 0);
	cr_assert(sv_holders_forked(h), "a hand marks the table forked");
	int up[2], go[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char c = 'n';
		if (sv_holders_adopt(&hd) && !sv_holders_sole(&hd)) {
			sv_holders_claim(&hd, 64000);
			c = 'y';
		}
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		c = sv_holders_sole(&hd) ? 's' : 'n'; /* the parent released it */
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		sv_holders_drop(&hd); /* matched: the entry goes */
		_exit(write(up[1], "r", 1) == 1 ? 0 : 2);
	}
	char c = 0;
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(c, 'y', "the child could not adopt and claim");
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "redirected while the parent still holds it");
	sv_holders_release_first(&hd);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 64000);
	cr_assert_eq(write(go[1], "x", 1), 1);
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(c, 's', "the child does not know it holds the connection alone");
	cr_assert_eq(write(go[1], "x", 1), 1);
	cr_assert_eq(read(up[0], &c, 1), 1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "the child's removal did not take");
	sv_holders_release_first(&hd); /* a late close: the entry is gone, nothing happens */
}

/* The parent's I/O, a dup, a second child: the child's counts would miss
 * bytes, or another process holds it. It is never redirected then. */
Test(holders, a_spoiled_or_twice_adopted_hand_is_never_redirected)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.3", 40011);
	struct sv_hand hd;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &hd), 0);
	cr_assert(sv_holders_adopt(&hd));
	sv_holders_claim(&hd, 64001);
	sv_holders_release_first(&hd);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 64001);
	cr_assert(sv_holders_sole(&hd));
	cr_assert_not(sv_holders_adopt(&hd), "a second child adopted it too");
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "three holders, and redirected");
	cr_assert_not(sv_holders_sole(&hd));
	sv_holders_drop(&hd);

	struct sv_hand h2;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &h2), 0);
	cr_assert(sv_holders_adopt(&h2));
	sv_holders_claim(&h2, 64002);
	sv_holders_spoil(&h2);
	sv_holders_release_first(&h2);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "spoiled, and redirected");
	cr_assert_not(sv_holders_sole(&h2));
	sv_holders_drop(&h2);
	sv_holders_spoil(&hd); /* an old generation's: nothing happens */
}

/* A late claim for an entry that is gone, its slot taken again: the new
 * entry keeps its port. */
Test(holders, a_claim_for_a_gone_entry_leaves_the_next_one_alone)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.3", 40012);
	struct sockaddr_storage cli2 = v4("10.77.0.3", 40013);
	struct sv_hand hd;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &hd), 0);
	cr_assert(sv_holders_adopt(&hd));
	sv_holders_drop(&hd); /* the child's connection went back to TCP */
	int slot = sv_holders_add(h, &srv, &cli2, 62000);
	cr_assert_eq(slot, hd.slot, "the freed slot was not taken again");
	sv_holders_claim(&hd, 63000);
	sv_holders_release_first(&hd);
	cr_assert_eq(sv_holders_find(h, &srv, &cli2), 62000);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0);
	sv_holders_remove(h, slot);
}

/* A prefork worker entered its connection, then forked and handed it: the
 * handed entry decides (no redirect to the worker, which holds it no
 * more alone), then the child's port. */
Test(holders, a_handed_entry_outranks_its_holders_earlier_one)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.3", 40014);
	int slot = sv_holders_add(h, &srv, &cli, 61000);
	cr_assert_geq(slot, 0);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 61000);
	struct sv_hand hd;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &hd), 0);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0, "redirected to the worker after its fork");
	cr_assert(sv_holders_adopt(&hd));
	sv_holders_claim(&hd, 64003);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0);
	sv_holders_release_first(&hd);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 64003);
	sv_holders_drop(&hd);
	sv_holders_remove(h, slot);
}

/* ---- The table's memfd (an exec'd image's way to it) ---------------------------- */

/* The table lives on a memfd that the application's closefrom(3) spares,
 * and that nobody holding it can resize (the owner would SIGBUS). */
Test(holders, the_table_is_on_a_sealed_memfd_of_libsovias_own)
{
	errno = 12345;
	struct sv_holders *h = sv_holders_get(); /* the first: this process makes it */
	cr_assert_not_null(h);
	cr_assert_eq(errno, 12345, "making the table changed the caller's errno");
	int fd = sv_holders_fd(h);
	cr_assert_geq(fd, 0, "no memfd");
	cr_assert_eq(sv_holders_fd(h), fd, "one fd per table");
	cr_assert_eq(sv_holders_fd(NULL), -1);
	cr_assert(sv_ownfd_is(fd), "a closefrom(3) would close it");
	cr_assert_geq(fd, sv_ownfd_base(), "fd %d in the application's range", fd);
	cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC, "every exec would inherit it");
	struct stat sb;
	cr_assert_eq(fstat(fd, &sb), 0);
	cr_assert(S_ISREG(sb.st_mode));
	cr_assert_eq(ftruncate(fd, sb.st_size / 2), -1, "shrunk");
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(ftruncate(fd, sb.st_size + 4096), -1, "grown");
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1, "writes could be sealed off");
	cr_assert_eq(errno, EPERM);
	cr_assert(sv_holders_is_table(fd), "an exec'd image would not recognise it");
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	cr_assert_not(sv_holders_is_table(pfd[0]), "an application's pipe taken for a table");
	close(pfd[0]);
	close(pfd[1]);
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.4", 40020);
	cr_assert_geq(sv_holders_add(h, &srv, &cli, 61020), 0, "the refused resizes broke it");
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 61020);
}

/* An exec'd image maps the table it inherited: its own mapping, not the
 * process's table (its own listeners get a fresh one), both ways shared. */
Test(holders, an_attached_table_shares_the_creators_entries)
{
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	int fd = sv_holders_fd(h);
	cr_assert_geq(fd, 0);
	struct sv_holders *a = sv_holders_attach(fd);
	cr_assert_not_null(a, "the creator's own table refused");
	cr_assert_neq(a, h, "attach gave the process's table");
	cr_assert_eq(sv_holders_get(), h, "attach replaced the process's table");
	cr_assert_eq(sv_holders_fd(a), -1, "an attached table's fd is its caller's");
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.5", 40030);
	struct sockaddr_storage cli2 = v4("10.77.0.5", 40031);
	int slot = sv_holders_add(h, &srv, &cli, 61030);
	cr_assert_geq(slot, 0);
	cr_assert_eq(sv_holders_find(a, &srv, &cli), 61030, "the creator's entry is not seen");
	int slot2 = sv_holders_add(a, &srv, &cli2, 61031);
	cr_assert_neq(slot2, slot);
	cr_assert_eq(sv_holders_find(h, &srv, &cli2), 61031, "the attacher's entry is not seen");
	cr_assert_eq(sv_holders_adds(h), 2);
	sv_holders_remove(a, slot);
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 0);
}

/* A memfd holding a copy of the table's first page, `size` long, with
 * `seals`; bytes at `at` (within the header) overwritten by `with`. */
static int fake_table(int real, off_t size, unsigned seals, size_t at, uint32_t with)
{
	char page[4096];
	int fd = memfd_create("fake-holders", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, size), 0);
	cr_assert_eq(pread(real, page, sizeof(page), 0), (ssize_t)sizeof(page));
	if (at != (size_t)-1)
		memcpy(page + at, &with, sizeof(with));
	cr_assert_eq(pwrite(fd, page, sizeof(page), 0), (ssize_t)sizeof(page));
	if (seals)
		cr_assert_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

/* Anything but a sealed table of this layout made by this user is
 * refused. Each fake differs from an accepted copy in one thing. The
 * header's order is known here: magic (8 bytes), version, creator uid,
 * creator gid. */
Test(holders, attach_refuses_what_is_not_a_sealed_table_of_ours)
{
	int real = sv_holders_fd(sv_holders_get());
	cr_assert_geq(real, 0);
	struct stat sb;
	cr_assert_eq(fstat(real, &sb), 0);
	const unsigned all = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	const size_t none = (size_t)-1;

	int fd = fake_table(real, sb.st_size, all, none, 0);
	cr_assert_not_null(sv_holders_attach(fd), "a faithful copy refused: fakes prove nothing");
	close(fd);
	struct {
		off_t size;
		unsigned seals;
		size_t at;
		uint32_t with;
		const char *what;
	} fakes[] = {
		{sb.st_size + 4096, all, none, 0, "a larger table"},
		{sb.st_size - 4096, all, none, 0, "a smaller table"},
		{sb.st_size, 0, none, 0, "an unsealed table"},
		{sb.st_size, F_SEAL_SHRINK | F_SEAL_GROW, none, 0, "a table that can be unsealed"},
		{sb.st_size, F_SEAL_SEAL, none, 0, "a table that can be resized"},
		{sb.st_size, all, 0, 0x12345678u, "a wrong magic"},
		{sb.st_size, all, 8, 0x7fffffffu, "a wrong version"},
		{sb.st_size, all, 12, (uint32_t)getuid() + 1, "another user's table"},
		{sb.st_size, all, 16, (uint32_t)getgid() + 1, "another group's table"},
	};
	for (size_t i = 0; i < sizeof(fakes) / sizeof(fakes[0]); i++) {
		fd = fake_table(real, fakes[i].size, fakes[i].seals, fakes[i].at, fakes[i].with);
		cr_assert_null(sv_holders_attach(fd), "%s was taken", fakes[i].what);
		close(fd);
	}

	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_null(sv_holders_attach(p[0]), "a pipe was taken");
	int null = open("/dev/null", O_RDWR);
	cr_assert_geq(null, 0);
	cr_assert_null(sv_holders_attach(null), "/dev/null was taken");
	cr_assert_null(sv_holders_attach(-1));
	cr_assert_null(sv_holders_attach(1 << 20), "a closed fd was taken");
}

/* ---- An exec'd image's checks and claims --------------------------------------- */

/* The child that adopted a handed connection, after an exec (same pid):
 * its entry is checked against what it was told. Anything but this
 * generation, this pid, this exact connection, unspoiled, is refused. */
Test(holders, check_accepts_only_the_adopters_unspoiled_entry)
{
	struct sv_holders *h = sv_holders_get();
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.6", 40040);
	struct sockaddr_storage srv2 = v4("10.77.0.1", 81), cli2 = v4("10.77.0.6", 40041);
	struct sv_hand hd;
	cr_assert_eq(sv_holders_hand(h, &srv, &cli, &hd), 0);
	int up[2], go[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		/* Only the parent's ends: a failed parent leaves no child
		 * waiting for ever. */
		close(up[0]);
		close(go[1]);
		struct sv_hand old = hd, next = hd;
		old.gen--;
		next.gen++;
		char r[8], c;
		r[0] = sv_holders_check(&hd, &srv, &cli) ? 'y' : 'n'; /* not adopted yet */
		r[1] = sv_holders_adopt(&hd) ? 'y' : 'n';
		r[2] = sv_holders_check(&hd, &srv, &cli) ? 'y' : 'n';
		r[3] = sv_holders_check(&old, &srv, &cli) ? 'y' : 'n';
		r[4] = sv_holders_check(&next, &srv, &cli) ? 'y' : 'n';
		r[5] = sv_holders_check(&hd, &srv, &cli2) ? 'y' : 'n';
		r[6] = sv_holders_check(&hd, &srv2, &cli) ? 'y' : 'n';
		r[7] = sv_holders_check(&hd, &cli, &srv) ? 'y' : 'n';
		sv_holders_claim(&hd, 64040);
		if (write(up[1], r, 8) != 8 || read(go[0], &c, 1) != 1)
			_exit(2);
		c = sv_holders_check(&hd, &srv, &cli) ? 'y' : 'n'; /* released */
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		c = sv_holders_check(&hd, &srv, &cli) ? 'y' : 'n'; /* spoiled */
		_exit(write(up[1], &c, 1) == 1 ? 0 : 2);
	}
	close(up[1]);
	close(go[0]);
	char r[8] = {0}, c = 0;
	cr_assert_eq(read(up[0], r, 8), 8);
	cr_assert_eq(r[0], 'n', "an entry nobody adopted passed");
	cr_assert_eq(r[1], 'y', "the child could not adopt");
	cr_assert_eq(r[2], 'y', "the adopter's own entry was refused");
	cr_assert_eq(r[3], 'n', "an older generation passed");
	cr_assert_eq(r[4], 'n', "a newer generation passed");
	cr_assert_eq(r[5], 'n', "another client passed");
	cr_assert_eq(r[6], 'n', "another server port passed");
	cr_assert_eq(r[7], 'n', "the roles swapped passed");
	cr_assert_not(sv_holders_check(&hd, &srv, &cli), "passed in the parent, not its adopter");
	sv_holders_release_first(&hd);
	cr_assert_eq(write(go[1], "x", 1), 1);
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(c, 'y', "refused once the parent released it (its flags moved)");
	sv_holders_spoil(&hd);
	cr_assert_eq(write(go[1], "x", 1), 1);
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(c, 'n', "a spoiled entry passed");
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Issue 53, finding 7: a descendant that drops its ids (a worker that
 * setuid()s without exec) may then be taken over by whoever it serves.
 * Once it left its family's table it writes nothing its family reads,
 * however it writes (here: every byte of the old mapping), and reads
 * nothing they write; its own children share a fresh table of its new
 * ids, on a memfd of its new user's. */
static void drop_ids(void)
{
	if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
		_exit(20);
}

Test(holders, a_child_that_dropped_its_ids_writes_nothing_its_family_reads)
{
	if (geteuid() != 0)
		cr_skip_test("dropping ids needs root");
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	struct sockaddr_storage srv = v4("10.77.0.1", 80), cli = v4("10.77.0.6", 40040);
	struct sockaddr_storage forged = v4("10.77.0.6", 40041), mine = v4("10.77.0.6", 40042);
	cr_assert_geq(sv_holders_add(h, &srv, &cli, 61040), 0);
	int fd = sv_holders_fd(h);
	cr_assert_geq(fd, 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		drop_ids();
		if (sv_holders_leave_family() != 0)
			_exit(21);
		if (sv_holders_find(h, &srv, &cli) != 0)
			_exit(22); /* reads what the family wrote */
		/* A fresh table: shared with a child of ours, on a memfd of
		 * the new user's. */
		int nfd = sv_holders_fd(h);
		struct stat sb;
		if (nfd < 0 || fstat(nfd, &sb) != 0 || sb.st_uid != 65534)
			_exit(23);
		int up[2], go[2];
		if (pipe(up) != 0 || pipe(go) != 0)
			_exit(24);
		pid_t g = fork();
		if (g == 0) {
			char c = sv_holders_add(h, &srv, &mine, 61042) >= 0 ? 'y' : 'n';
			_exit(write(up[1], &c, 1) == 1 && read(go[0], &c, 1) == 1 ? 0 : 1);
		}
		char c = 0;
		if (read(up[0], &c, 1) != 1 || c != 'y')
			_exit(25);
		if (sv_holders_find(h, &srv, &mine) != 61042)
			_exit(26); /* its child's entry */
		int st;
		if (write(go[1], "g", 1) != 1 || waitpid(g, &st, 0) != g || !WIFEXITED(st) ||
		    WEXITSTATUS(st) != 0)
			_exit(27);
		/* Now as an attacker: an entry, then every byte. */
		if (sv_holders_add(h, &srv, &forged, 61041) < 0)
			_exit(28);
		memset(h, 0xff, 4096);
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st));
	cr_assert_eq(WEXITSTATUS(st), 0, "the child failed at step %d", WEXITSTATUS(st));
	cr_assert_eq(sv_holders_find(h, &srv, &forged), 0, "the child's forged entry reached the family");
	cr_assert_eq(sv_holders_find(h, &srv, &cli), 61040, "the child's bytes reached the family");
	cr_assert_eq(sv_holders_fd(h), fd, "the parent's table moved");
	cr_assert(sv_holders_is_table(fd));
}

/* A TCP connection on loopback: its server side's fd in *fd, its
 * addresses as the holders' table keys them. */
static void loopback_conn(int lfd, int *cfd, int *fd, struct sockaddr_storage *srv,
			  struct sockaddr_storage *cli)
{
	struct sockaddr_storage at;
	socklen_t len = sizeof(at);
	cr_assert_eq(getsockname(lfd, (struct sockaddr *)&at, &len), 0);
	*cfd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(*cfd, (struct sockaddr *)&at, len), 0);
	*fd = accept(lfd, NULL, NULL);
	cr_assert_geq(*fd, 0);
	len = sizeof(*srv);
	cr_assert_eq(getsockname(*fd, (struct sockaddr *)srv, &len), 0);
	len = sizeof(*cli);
	cr_assert_eq(getpeername(*fd, (struct sockaddr *)cli, &len), 0);
}

/* nginx's workers: they inherit the listening socket, then drop root.
 * Left out of the table, each still tells the connections it accepts over
 * the family's channel, and the table's maker enters only those the
 * sender really holds: a claim on a sibling's connection, whose port
 * would send that client to the liar, is not entered. */
Test(holders, a_child_that_dropped_its_ids_tells_only_the_connections_it_holds)
{
	if (geteuid() != 0)
		cr_skip_test("dropping ids needs root");
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_storage lo = v4("127.0.0.1", 0);
	cr_assert_eq(bind(lfd, (struct sockaddr *)&lo, sizeof(struct sockaddr_in)), 0);
	cr_assert_eq(listen(lfd, 4), 0);
	int c1, c2, mine, sibling;
	struct sockaddr_storage srv1, cli1, srv2, cli2;
	loopback_conn(lfd, &c1, &mine, &srv1, &cli1);
	loopback_conn(lfd, &c2, &sibling, &srv2, &cli2);
	int up[2], go[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(up[0]); /* a parent that failed ends our reads */
		close(go[1]);
		close(sibling); /* the sibling's: this child does not hold it */
		drop_ids();
		if (sv_holders_leave_family() != 0)
			_exit(21);
		if (sv_holders_era() != 1)
			_exit(22);
		if (sv_holders_tell(&srv1, &cli1, 61050, false) != SV_HOLDERS_TOLD ||
		    sv_holders_tell(&srv2, &cli2, 61051, false) != SV_HOLDERS_TOLD)
			_exit(23);
		char c = 'y';
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(24);
		if (sv_holders_tell(&srv1, &cli1, 0, true) != SV_HOLDERS_TOLD)
			_exit(25);
		if (write(up[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(26);
		_exit(0);
	}
	close(up[1]);
	close(go[0]);
	char c = 0;
	cr_assert_eq(read(up[0], &c, 1), 1, "the child failed before telling");
	cr_assert_eq(sv_holders_find(h, &srv1, &cli1), 0, "entered before it was collected");
	sv_holders_collect();
	cr_assert_eq(sv_holders_find(h, &srv1, &cli1), 61050, "the child's own connection");
	cr_assert_eq(sv_holders_find(h, &srv2, &cli2), 0, "the child's claim on its sibling's");
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(read(up[0], &c, 1), 1, "the child failed before telling it gone");
	sv_holders_collect();
	cr_assert_eq(sv_holders_find(h, &srv1, &cli1), 0, "told gone, still found");
	cr_assert_eq(write(go[1], "q", 1), 1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st));
	cr_assert_eq(WEXITSTATUS(st), 0, "the child failed at step %d", WEXITSTATUS(st));
	close(c1);
	close(c2);
	close(mine);
	close(sibling);
	close(lfd);
}
