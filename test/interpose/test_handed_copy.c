/* A child left alone with a connection its parent kept on RDMA
 * (src/shares.h, sv_shares_hand and sv_shares_adopt): the parent let go
 * (its close, exit or exec) while the child holds a copy, and the child,
 * once no other process holds the socket, makes its fd a stream of its
 * own, which moves the connection to RDMA again (a server's end: at the
 * child's own RDMA listener, to which the parent's redirects the client).
 * The fake network is the parent's, so the child's upgrade finds no route
 * here and stays on TCP: these tests check who takes the connection over,
 * and that its bytes stay right; bed.fork_handed and bed.fork_server prove
 * the move to RDMA. */
#include "kept_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(handed_copy, .init = kept_setup, .fini = h_teardown, .timeout = 60);

/* The child's part: it drops its copy of the other end, writes "early"
 * on its copy of `mine` if `used_first` (its claim takes the connection
 * back to TCP while the parent holds it too), waits until the parent
 * closed its own (`go`), then writes "adopt": alone with the connection,
 * this write makes it a stream of the child's, which moves it to RDMA
 * again. Here that upgrade finds no route (the fake network is the
 * parent's) and it stays on TCP; the bed proves the move. Then it reads
 * the parent's answer through that stream. */
static void child_left_alone(int mine, int other, int go, bool used_first)
{
	fake_net_no_route(true);
	CHILD_CHECK(10, close(other) == 0);
	if (used_first)
		CHILD_CHECK(11, write(mine, "early", 5) == 5);
	char c;
	CHILD_CHECK(12, read(go, &c, 1) == 1);
	CHILD_CHECK(13, write(mine, "adopt", 5) == 5);
	const char *ops = ph_ops_name(mine);
	CHILD_CHECK(14, ops && strcmp(ops, "stream") == 0);
	char b[6];
	CHILD_CHECK(15, ph_read_all(mine, b, 6) == 6 && memcmp(b, "answer", 6) == 0);
	_exit(0);
}

/* The parent hands the client's end (or the server's) to its child: it
 * closes its own copy and talks to the child through the other end.
 * Without `keeps`, the kernel does not keep pinned pages at a fork, which
 * takes the connection back to TCP first. */
static void parent_lets_go(bool used_first, bool server, bool keeps, uint64_t seed)
{
	fake_net_fork_keeps(keeps);
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, seed);
	int *handed = server ? &p.sfd : &p.cfd, kept = server ? p.cfd : p.sfd;
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t pid = keeps ? fork() : ph_fork_one(*handed);
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		alarm(30); /* never outlives a failed test */
		child_left_alone(*handed, kept, go[0], used_first);
	}
	char b[5];
	if (used_first) {
		cr_assert_eq(ph_read_all(kept, b, 5), 5);
		cr_assert_eq(memcmp(b, "early", 5), 0);
	}
	cr_assert_eq(close(*handed), 0);
	*handed = -1;
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(ph_read_all(kept, b, 5), 5);
	cr_assert_eq(memcmp(b, "adopt", 5), 0);
	cr_assert_eq(ph_write_all(kept, "answer", 6), 6);
	child_ok(pid);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

Test(handed_copy, a_child_that_used_its_copy_takes_it_over_when_the_parent_closes)
{
	parent_lets_go(true, false, true, 40);
}

Test(handed_copy, a_child_that_uses_its_copy_after_the_parents_close_takes_it_over)
{
	parent_lets_go(false, false, true, 41);
}

/* A client's end that the fork took back to TCP is shared with the child
 * all the same (src/stream_keep.c, sv_stream_share_for_fork). */
Test(handed_copy, a_client_the_fork_took_back_is_taken_over_by_the_child_that_used_it)
{
	parent_lets_go(true, false, false, 45);
}

Test(handed_copy, a_client_the_fork_took_back_is_taken_over_by_the_child_after_the_close)
{
	parent_lets_go(false, false, false, 46);
}

/* An accept-then-fork server whose connection went to RDMA before the
 * fork: the parent closes its copy, and its child serves the client. */
Test(handed_copy, a_servers_child_that_used_its_copy_takes_it_over_when_the_parent_closes)
{
	parent_lets_go(true, true, true, 43);
}

Test(handed_copy, a_servers_child_that_uses_its_copy_after_the_parents_close_takes_it_over)
{
	parent_lets_go(false, true, true, 44);
}

/* Two children hold copies of the client's end when the parent closes
 * its own: neither may take it over while the other holds it; once one is
 * gone, the other does. */
Test(handed_copy, a_child_takes_it_over_only_once_its_sibling_is_gone)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 42);
	int go[2], go2[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(go2), 0);
	pid_t sib = fork();
	cr_assert_geq(sib, 0);
	if (sib == 0) {
		alarm(30);
		char c;
		CHILD_CHECK(20, read(go2[0], &c, 1) == 1);
		_exit(0);
	}
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		alarm(30);
		fake_net_no_route(true);
		CHILD_CHECK(21, close(p.sfd) == 0);
		char c;
		CHILD_CHECK(22, read(go[0], &c, 1) == 1);
		CHILD_CHECK(23, write(p.cfd, "one", 3) == 3);
		const char *ops = ph_ops_name(p.cfd);
		CHILD_CHECK(24, ops && strcmp(ops, "kept by the parent") == 0);
		CHILD_CHECK(25, read(go[0], &c, 1) == 1); /* the sibling is gone */
		usleep(50000); /* past the next look */
		CHILD_CHECK(26, write(p.cfd, "two", 3) == 3);
		ops = ph_ops_name(p.cfd);
		CHILD_CHECK(27, ops && strcmp(ops, "stream") == 0);
		_exit(0);
	}
	cr_assert_eq(close(p.cfd), 0);
	p.cfd = -1;
	cr_assert_eq(write(go[1], "g", 1), 1);
	char b[6];
	cr_assert_eq(ph_read_all(p.sfd, b, 3), 3);
	cr_assert_eq(memcmp(b, "one", 3), 0);
	cr_assert_eq(write(go2[1], "g", 1), 1);
	child_ok(sib);
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(ph_read_all(p.sfd, b, 3), 3);
	cr_assert_eq(memcmp(b, "two", 3), 0);
	child_ok(pid);
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(go2[i]);
	}
	ph_pair_close(&p);
}

/* A child that holds the client's end on two fds (a dup) when the parent
 * closes: a stream on one of them would leave the other on the kernel's
 * socket, so it is not taken over. */
Test(handed_copy, a_child_with_a_dup_of_its_copy_does_not_take_it_over)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 43);
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		alarm(30);
		fake_net_no_route(true);
		CHILD_CHECK(30, close(p.sfd) == 0);
		CHILD_CHECK(31, write(p.cfd, "dup", 3) == 3);
		int d = dup(p.cfd);
		CHILD_CHECK(32, d >= 0);
		char c;
		CHILD_CHECK(33, read(go[0], &c, 1) == 1);
		usleep(50000);
		CHILD_CHECK(34, write(p.cfd, "one", 3) == 3);
		usleep(50000);
		CHILD_CHECK(35, write(d, "two", 3) == 3);
		const char *ops = ph_ops_name(p.cfd);
		CHILD_CHECK(36, ops && strcmp(ops, "kept by the parent") == 0);
		ops = ph_ops_name(d);
		CHILD_CHECK(37, ops && strcmp(ops, "kept by the parent") == 0);
		_exit(0);
	}
	char b[9];
	cr_assert_eq(ph_read_all(p.sfd, b, 3), 3);
	cr_assert_eq(close(p.cfd), 0);
	p.cfd = -1;
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(ph_read_all(p.sfd, b, 6), 6);
	cr_assert_eq(memcmp(b, "onetwo", 6), 0);
	child_ok(pid);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

/* The first child of an owner that will fork a second one: it writes on
 * its copy of the client's end (back to TCP, shared), waits for `go`
 * (the owner let go), writes twice more, and says whether its fd became
 * a stream (it took the connection over). */
static bool first_child_took_it_over(struct pair *p, int go)
{
	alarm(30);
	fake_net_no_route(true);
	CHILD_CHECK(40, close(p->sfd) == 0);
	CHILD_CHECK(41, write(p->cfd, "c1", 2) == 2);
	char c;
	CHILD_CHECK(42, read(go, &c, 1) == 1);
	CHILD_CHECK(43, write(p->cfd, "x", 1) == 1);
	usleep(50000);
	CHILD_CHECK(44, write(p->cfd, "y", 1) == 1);
	const char *ops = ph_ops_name(p->cfd);
	return ops && strcmp(ops, "stream") == 0;
}

/* The owner forks a second child once the connection went back to TCP
 * (shared): that fork lists the second child's copy in the entry, and the
 * owner's fd stays its stream. The owner then lets go (a failed exec
 * here). The first child must not take the connection over while the
 * second holds it. */
Test(handed_copy, a_second_forks_copy_keeps_the_first_child_on_tcp)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 50);
	int go[2], go2[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(go2), 0);
	pid_t c1 = fork();
	cr_assert_geq(c1, 0);
	if (c1 == 0) {
		CHILD_CHECK(45, !first_child_took_it_over(&p, go[0]));
		_exit(0);
	}
	char b[4];
	cr_assert_eq(ph_read_all(p.sfd, b, 2), 2);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	pid_t c2 = fork();
	cr_assert_geq(c2, 0);
	if (c2 == 0) {
		alarm(30);
		char c;
		CHILD_CHECK(46, read(go2[0], &c, 1) == 1);
		_exit(0);
	}
	const char *ops = ph_ops_name(p.cfd);
	cr_assert(ops && strcmp(ops, "stream") == 0, "the second fork made the owner's fd %s",
		  ops ? ops : "the kernel's");
	cr_assert_eq(close(p.cfd), 0);
	p.cfd = -1;
	char *argv[] = {"none", NULL};
	cr_assert_eq(execv("/nonexistent/none", argv), -1);
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(ph_read_all(p.sfd, b, 2), 2);
	cr_assert_eq(memcmp(b, "xy", 2), 0);
	child_ok(c1);
	cr_assert_eq(write(go2[1], "g", 1), 1);
	child_ok(c2);
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(go2[i]);
	}
	ph_pair_close(&p);
}

/* A server's end, kept at a first fork whose child used its copy
 * (shared), is not handed to a second fork's child: the first child
 * still holds the socket, so the second must not adopt it. */
Test(handed_copy, a_servers_second_fork_does_not_hand_a_shared_connection)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 51);
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t c1 = fork();
	cr_assert_geq(c1, 0);
	if (c1 == 0) {
		alarm(30);
		fake_net_no_route(true);
		CHILD_CHECK(60, close(p.cfd) == 0);
		CHILD_CHECK(61, write(p.sfd, "c1", 2) == 2);
		char c;
		CHILD_CHECK(62, read(go[0], &c, 1) == 1);
		_exit(0);
	}
	char b[2];
	cr_assert_eq(ph_read_all(p.cfd, b, 2), 2);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	pid_t c2 = fork();
	cr_assert_geq(c2, 0);
	if (c2 == 0) {
		alarm(30);
		fake_net_no_route(true);
		const char *ops = ph_ops_name(p.sfd);
		CHILD_CHECK(63, !ops || strcmp(ops, "stream") != 0);
		_exit(0);
	}
	child_ok(c2);
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(c1);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

/* The same with the owner's exit: the owner is a child of the test, and
 * its first child tells on a pipe whether it took the connection over. */
Test(handed_copy, a_second_forks_copy_keeps_the_first_child_on_tcp_at_the_owners_exit)
{
	int go[2], go2[2], rep[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(go2), 0);
	cr_assert_eq(pipe(rep), 0);
	pid_t o = fork();
	cr_assert_geq(o, 0);
	if (o == 0) {
		alarm(30);
		struct pair p;
		ph_pair_rdma(&p);
		pid_t c1 = fork();
		CHILD_CHECK(50, c1 >= 0);
		if (c1 == 0) {
			char v = first_child_took_it_over(&p, go[0]) ? 'S' : 'k';
			CHILD_CHECK(56, write(rep[1], &v, 1) == 1);
			_exit(0);
		}
		char b[2];
		CHILD_CHECK(57, ph_read_all(p.sfd, b, 2) == 2);
		CHILD_CHECK(58, h_wait_state(p.c, SV_CONN_DETACHED, 10000) == SV_CONN_DETACHED);
		pid_t c2 = fork(); /* holds both sockets: the client's listed */
		CHILD_CHECK(59, c2 >= 0);
		if (c2 == 0) {
			alarm(30);
			char c;
			(void)!read(go2[0], &c, 1);
			_exit(0);
		}
		CHILD_CHECK(60, close(p.cfd) == 0);
		/* The owner's _exit lets go of its stream as exit() does
		 * (exit's LeakSanitizer check would count the entries a fork's
		 * child leaves on purpose). */
		_exit(0);
	}
	child_ok(o);
	cr_assert_eq(write(go[1], "g", 1), 1);
	close(rep[1]);
	char v = 0;
	cr_assert_eq(read(rep[0], &v, 1), 1);
	cr_assert_eq(write(go2[1], "g", 1), 1);
	cr_assert_eq(v, 'k', "the first child took the connection over while the second holds it");
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(go2[i]);
	}
	close(rep[0]);
}

/* write() may be called in a signal handler. One that writes on a copy
 * handed on, while the code it interrupted is inside malloc, must not
 * deadlock in the copy's look at its holders. A sibling holds a copy, so
 * every look fails and the looks go on. */
static int handler_fd;
static void write_in_handler(int sig)
{
	(void)sig;
	int e = errno;
	(void)!write(handler_fd, "s", 1);
	errno = e;
}

Test(handed_copy, a_signal_handlers_write_on_a_copy_handed_on_does_not_deadlock)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 60);
	int go2[2];
	cr_assert_eq(pipe(go2), 0);
	pid_t sib = fork();
	cr_assert_geq(sib, 0);
	if (sib == 0) {
		alarm(30);
		char c;
		(void)!read(go2[0], &c, 1);
		_exit(0);
	}
	pid_t c1 = fork();
	cr_assert_geq(c1, 0);
	if (c1 == 0) {
		alarm(30);
		fake_net_no_route(true);
		CHILD_CHECK(70, close(p.sfd) == 0);
		CHILD_CHECK(71, write(p.cfd, "c1", 2) == 2);
		handler_fd = p.cfd;
		struct sigaction sa = {.sa_handler = write_in_handler, .sa_flags = SA_RESTART};
		CHILD_CHECK(72, sigaction(SIGALRM, &sa, NULL) == 0);
		struct itimerval it = {{0, 500}, {0, 500}};
		CHILD_CHECK(73, setitimer(ITIMER_REAL, &it, NULL) == 0);
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		unsigned k = 0;
		do {
			for (int i = 0; i < 1000; i++) {
				volatile char *m = malloc(4096 + (k++ % 4096));
				m[0] = 1;
				free((void *)m);
			}
			clock_gettime(CLOCK_MONOTONIC, &t);
		} while (t.tv_sec - t0.tv_sec < 3);
		struct itimerval off = {0};
		setitimer(ITIMER_REAL, &off, NULL);
		_exit(0);
	}
	cr_assert_eq(close(p.cfd), 0);
	p.cfd = -1;
	char b[2];
	cr_assert_eq(ph_read_all(p.sfd, b, 2), 2);
	int st = 0, waited = 0;
	pid_t w;
	while ((w = waitpid(c1, &st, WNOHANG)) == 0 && waited < 20000) {
		char sink[4096]; /* the handler's bytes */
		(void)!recv(p.sfd, sink, sizeof(sink), MSG_DONTWAIT);
		usleep(10000);
		waited += 10;
	}
	if (w == 0) {
		kill(c1, SIGKILL);
		waitpid(c1, &st, 0);
	}
	cr_assert_eq(write(go2[1], "g", 1), 1);
	child_ok(sib);
	cr_assert_eq(w, c1, "the child hung (its signal handler deadlocked)");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's status: %d", st);
	close(go2[0]);
	close(go2[1]);
	ph_pair_close(&p);
}
