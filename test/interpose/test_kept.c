/* A fork that keeps the parent's connections on RDMA (src/shares.h): the
 * child gets a copy of each socket, which it claims at its first use; the
 * parent then takes the connection back to plain TCP and the child reads
 * and writes the kernel's socket, every byte once and in order. A child
 * that never uses its copy costs the parent nothing. The interposed fork()
 * runs here, over the fake network, whose QPs a fork leaves to the parent
 * (fake_net_fork_keeps). */
#include "share.h"
#include "kept_util.h"
#include "preload_harness.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(kept, .init = kept_setup, .fini = h_teardown, .timeout = 60);

/* A pair on RDMA, bytes both ways, then a fork whose child leaves at once
 * (as a snapshot child or a helper that execs). */
static void fork_a_child_that_leaves(struct pair *p, uint64_t seed)
{
	ph_pair_rdma(p);
	exchange_on_rdma(p, seed);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(0);
	child_ok(pid);
}

Test(kept, a_child_that_never_uses_its_copy_leaves_the_parent_on_rdma)
{
	struct pair p;
	fork_a_child_that_leaves(&p, 1);
	exchange_on_rdma(&p, 2);
	cr_assert_eq(h_state(p.s), SV_CONN_RDMA);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA);
	cr_assert_eq(h_counts(p.s).gave_back + h_counts(p.c).gave_back, 0);
	ph_pair_close(&p);
}

/* The client wrote LEN bytes, of which the parent's server read READ
 * before the fork; the child reads the rest from its copy, then writes. */
enum { LEN = 6000, READ = 100, SEED = 7 };

/* The child reads the rest of the client's bytes on its copy; with `go`,
 * once the parent closed its own, which hands the connection on: the
 * child then holds it alone, and its read makes it a stream of its own. */
static void child_reads_the_rest(int sfd, int go)
{
	char c;
	if (go >= 0)
		CHILD_CHECK(10, read(go, &c, 1) == 1);
	static uint8_t in[LEN];
	/* A read that never gets its bytes ends instead of hanging. */
	struct timeval tv = {.tv_sec = 20};
	CHILD_CHECK(11, setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
	CHILD_CHECK(12, ph_read_all(sfd, in, LEN - READ) == LEN - READ);
	CHILD_CHECK(13, h_pattern_ok(in, LEN - READ, SEED, READ));
	/* Else the kernel's socket now; the entry stays while the parent,
	 * which holds a copy too, follows who holds it. */
	const char *ops = ph_ops_name(sfd);
	CHILD_CHECK(14, go >= 0 ? ops && strcmp(ops, "stream") == 0
				: !ops || strcmp(ops, "stream") != 0);
	CHILD_CHECK(15, write(sfd, "child", 5) == 5);
	_exit(0);
}

/* A pair on RDMA whose server holds unread bytes of the client's. */
static void pair_with_bytes_unread(struct pair *p)
{
	ph_pair_rdma(p);
	static uint8_t out[LEN];
	uint8_t in[READ];
	h_pattern(out, LEN, SEED, 0);
	cr_assert_eq(ph_write_all(p->cfd, out, LEN), LEN);
	cr_assert_eq(ph_read_all(p->sfd, in, READ), READ);
	cr_assert(h_pattern_ok(in, READ, SEED, 0));
	cr_assert_eq(h_counts(p->c).rdma_tx, LEN);
}

Test(kept, a_child_that_reads_its_copy_gets_the_connection_on_tcp)
{
	struct pair p;
	pair_with_bytes_unread(&p);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_reads_the_rest(p.sfd, -1);
	child_ok(pid);
	cr_assert_eq(h_state(p.s), SV_CONN_DETACHED);
	cr_assert_gt(h_counts(p.c).got_back, 0, "the bytes the parent held went back");
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	ph_pair_close(&p);
}

Test(kept, closing_the_parents_copy_leaves_the_connection_to_the_child)
{
	struct pair p;
	pair_with_bytes_unread(&p);
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_reads_the_rest(p.sfd, go[0]);
	/* The parent's close must not end the connection the child holds. */
	cr_assert_eq(close(p.sfd), 0);
	p.sfd = -1;
	cr_assert_eq(h_wait_state(p.c, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	char b[6];
	cr_assert_eq(ph_read_all(p.cfd, b, 6), 5, "the child's bytes, then the end");
	cr_assert_eq(memcmp(b, "child", 5), 0);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

Test(kept, once_the_child_is_gone_the_parents_close_ends_the_connection_over_rdma)
{
	struct pair p;
	fork_a_child_that_leaves(&p, 3);
	cr_assert_eq(ph_write_all(p.sfd, "last", 4), 4);
	cr_assert_eq(close(p.sfd), 0);
	p.sfd = -1;
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 4, "the last bytes, then the end");
	cr_assert_eq(memcmp(b, "last", 4), 0);
	cr_assert_eq(h_counts(p.c).got_back, 0, "no way back");
	cr_assert_neq(h_state(p.c), SV_CONN_DETACHED);
	ph_pair_close(&p);
}

/* A child that forks again: the grandchild's copy is listed too, and its
 * use claims the connection as the child's would. */
Test(kept, a_grandchild_claims_as_a_child_does)
{
	struct pair p;
	pair_with_bytes_unread(&p);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		pid_t g = fork();
		CHILD_CHECK(20, g >= 0);
		if (g == 0)
			child_reads_the_rest(p.sfd, -1);
		close(p.sfd); /* the child's own copy goes; the grandchild's stays */
		int st;
		CHILD_CHECK(21, waitpid(g, &st, 0) == g);
		CHILD_CHECK(WIFEXITED(st) ? WEXITSTATUS(st) : 22, WIFEXITED(st) && WEXITSTATUS(st) == 0);
		_exit(0);
	}
	child_ok(pid);
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	ph_pair_close(&p);
}

/* Without a kernel that keeps pinned pages at a fork, every connection
 * goes back to TCP before it, as it always did. */
Test(kept, without_fork_support_the_fork_takes_it_back_first)
{
	fake_net_fork_keeps(false);
	struct pair p;
	pair_with_bytes_unread(&p);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(0);
	cr_assert_eq(h_state(p.s), SV_CONN_DETACHED);
	child_ok(pid);
	ph_pair_close(&p);
}

/* A claim answered while another fork of the parent is between its
 * prepare and its end (as another thread's would be): the connection
 * reaches plain TCP meanwhile, and the entry is settled once that fork
 * ends, so the claimer goes on. */
Test(kept, a_claim_answered_during_another_fork_is_settled_when_it_ends)
{
	struct pair p;
	pair_with_bytes_unread(&p);
	cr_assert(sv_share_keep_for_fork(p.s)); /* the other fork, prepared */
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_reads_the_rest(p.sfd, -1);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	sv_share_forked(p.s, -1); /* the other fork failed */
	child_ok(pid);
	ph_pair_close(&p);
}

/* A copy whose owner was killed before giving the connection back is
 * lost: it and its dup fail with ECONNRESET rather than read the socket
 * with a gap. The owner is a child of the test (the test's own process
 * cannot be killed), the copy its child, which reports on a pipe. */
Test(kept, a_lost_copy_and_its_dup_read_econnreset)
{
	int rep[2];
	cr_assert_eq(pipe(rep), 0);
	pid_t owner = fork();
	cr_assert_geq(owner, 0);
	if (owner == 0) {
		struct pair p;
		pair_with_bytes_unread(&p);
		/* Open in the owner alone once the copy closed its end: EOF
		 * there says the owner is dead. */
		int dead[2];
		CHILD_CHECK(42, pipe(dead) == 0);
		pid_t copy = fork();
		CHILD_CHECK(40, copy >= 0);
		if (copy == 0) {
			char b[16], v = 0;
			/* A read of the bare socket would wait for ever (this
			 * process holds both ends' copies): it ends instead. */
			struct timeval tv = {.tv_sec = 10};
			CHILD_CHECK(41, setsockopt(p.sfd, SOL_SOCKET, SO_RCVTIMEO, &tv,
						   sizeof(tv)) == 0);
			/* The copy is used once the owner is dead: a claim made
			 * while it lived could be answered (the connection given
			 * back, its bytes read) before the kill. */
			close(dead[1]);
			CHILD_CHECK(43, read(dead[0], b, 1) == 0);
			if (read(p.sfd, b, sizeof(b)) != -1 || errno != ECONNRESET)
				v = 1;
			int d = dup(p.sfd);
			if (d < 0 || read(d, b, sizeof(b)) != -1 || errno != ECONNRESET)
				v = v ? v : 2;
			(void)!write(rep[1], &v, 1);
			_exit(0);
		}
		kill(getpid(), SIGKILL);
	}
	close(rep[1]);
	int st;
	cr_assert_eq(waitpid(owner, &st, 0), owner);
	cr_assert(WIFSIGNALED(st), "the owner was not killed");
	char v = 9;
	cr_assert_eq(read(rep[0], &v, 1), 1, "the copy never reported");
	cr_assert_eq(v, 0, "the lost copy's check %d failed", v);
	close(rep[0]);
}

/* ---- Alone again: back to RDMA ---------------------------------------------------- */

/* Until `ms` pass on the library's clock, moved on in steps (each after a
 * round of the helper, which looks at the holders and asks again by its
 * timers): fd's stream is a new one (not `old`), on RDMA. */
static struct sv_stream *wait_successor_on_rdma(int fd, struct sv_stream *old, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms, real_end = h_ms() + 30000;
	for (;;) {
		struct sv_stream *s = ph_stream(fd);
		if (s && s != old && h_state(s) == SV_CONN_RDMA)
			return s;
		if (h_now_ms() >= end || h_ms() >= real_end)
			return NULL;
		if (s && s != old && h_exchanging(s))
			usleep(1000); /* the clock stands still while it switches */
		else
			h_warp_ms(H_WARP_STEP_MS);
	}
}

/* Both ends are new streams (not oc, os) on RDMA again, whose bytes both
 * ways go over the QP. */
static void both_again_on_rdma(struct pair *p, struct sv_stream *oc, struct sv_stream *os,
			       uint64_t seed)
{
	/* A server's end that its own child held moves once it looked at
	 * its holders again and its client asked again ("later"): each backs
	 * off to 3.2 s. */
	p->c = wait_successor_on_rdma(p->cfd, oc, 20000);
	cr_assert_not_null(p->c, "the client did not move to RDMA again");
	p->s = wait_successor_on_rdma(p->sfd, os, 20000);
	cr_assert_not_null(p->s, "the server did not move to RDMA again");
	exchange_on_rdma(p, seed);
}

/* The child waiting on go[0] may leave; once it is gone, both ends move
 * to RDMA again (both_again_on_rdma). Then the test's end. */
static void let_go_then_both_on_rdma(struct pair *p, pid_t pid, int go[2], struct sv_stream *oc,
				     struct sv_stream *os, uint64_t seed)
{
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	both_again_on_rdma(p, oc, os, seed);
	close(go[0]);
	close(go[1]);
	ph_pair_close(p);
}

/* The child writes on its copy of the client's end (the claim takes the
 * connection back to TCP for it), then waits for `go` (if >= 0) and
 * leaves. */
static void child_writes_then_leaves(int cfd, int go)
{
	CHILD_CHECK(50, write(cfd, "child", 5) == 5);
	CHILD_CHECK(51, strcmp(ph_ops_name(cfd), "kept by the parent") == 0);
	char c;
	if (go >= 0)
		CHILD_CHECK(52, read(go, &c, 1) == 1);
	_exit(0);
}

/* A pair on RDMA, bytes both ways, then a child that writes on its copy
 * of the client's end (its claim takes the connection back to TCP),
 * waits for go[1] and leaves; the server read its bytes. The child. */
static pid_t a_writing_child(struct pair *p, uint64_t seed, int go[2])
{
	ph_pair_rdma(p);
	exchange_on_rdma(p, seed);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_writes_then_leaves(p->cfd, go[0]);
	char b[5];
	cr_assert_eq(ph_read_all(p->sfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	return pid;
}

/* Bytes each way on TCP, the server's unread at the fork going back
 * first: the stream offsets the successors count from must be the ones
 * each reader stands at, or the switch would misplace bytes. */
Test(kept, a_parent_left_alone_by_the_child_that_used_its_copy_is_back_on_rdma)
{
	struct pair p;
	pair_with_bytes_unread(&p); /* the server holds LEN - READ of the client's */
	struct sv_stream *oc = p.c, *os = p.s;
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_writes_then_leaves(p.cfd, -1);
	child_ok(pid);
	cr_assert_eq(h_state(oc), SV_CONN_DETACHED);
	/* The server reads the rest of the client's bytes, then the child's,
	 * and answers; all on TCP. */
	static uint8_t in[LEN];
	cr_assert_eq(ph_read_all(p.sfd, in, LEN - READ), LEN - READ);
	cr_assert(h_pattern_ok(in, LEN - READ, SEED, READ));
	char b[5];
	cr_assert_eq(ph_read_all(p.sfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	cr_assert_eq(ph_write_all(p.sfd, "answer", 6), 6);
	char a[6];
	cr_assert_eq(ph_read_all(p.cfd, a, 6), 6);
	cr_assert_eq(memcmp(a, "answer", 6), 0);
	/* Alone again: both ends are new streams on a new QP. */
	both_again_on_rdma(&p, oc, os, 9);
	ph_pair_close(&p);
}

/* While the child holds its copy, the parent stays on TCP; once the child
 * is gone, on RDMA again. */
Test(kept, a_parent_stays_on_tcp_while_the_child_holds_its_copy)
{
	struct pair p;
	int go[2];
	pid_t pid = a_writing_child(&p, 10, go);
	struct sv_stream *oc = p.c, *os = p.s;
	/* Several of the parent's looks at its holders. */
	h_warp_steps_ms(600);
	cr_assert_eq(ph_stream(p.cfd), oc, "moved while the child holds a copy");
	cr_assert_eq(h_state(oc), SV_CONN_DETACHED);
	enum { N = 3000 };
	static uint8_t out[N], in[N];
	h_pattern(out, N, 11, 0);
	cr_assert_eq(ph_write_all(p.cfd, out, N), N);
	cr_assert_eq(ph_read_all(p.sfd, in, N), N);
	cr_assert(h_pattern_ok(in, N, 11, 0));
	let_go_then_both_on_rdma(&p, pid, go, oc, os, 12);
}

/* Without a kernel that keeps pinned pages at a fork, the fork takes a
 * client's end back to TCP first; the child uses its copy; once it is
 * gone, the parent moves the connection to RDMA again, as after a claim
 * (sv_stream_share_for_fork). Only the client's end is forked: the
 * server's is another process's in real use. */
Test(kept, a_client_the_fork_took_back_is_on_rdma_again_once_the_child_is_gone)
{
	fake_net_fork_keeps(false);
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 15);
	struct sv_stream *oc = p.c, *os = p.s;
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t pid = ph_fork_one(p.cfd);
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child_writes_then_leaves(p.cfd, go[0]);
	cr_assert_eq(h_state(oc), SV_CONN_DETACHED);
	char b[5];
	cr_assert_eq(ph_read_all(p.sfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	/* Several of the parent's looks at its holders. */
	h_warp_steps_ms(600);
	cr_assert_eq(ph_stream(p.cfd), oc, "moved while the child holds a copy");
	let_go_then_both_on_rdma(&p, pid, go, oc, os, 16);
}

/* Both ends forked (here one process holds both): the child uses its copy
 * of each, so both parents share their connection with it. The client's
 * request, once it is alone again, must wait until the server end is
 * alone again too, then both move to RDMA. */
Test(kept, both_ends_left_alone_move_to_rdma_again)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 13);
	struct sv_stream *oc = p.c, *os = p.s;
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		CHILD_CHECK(60, write(p.cfd, "to-server", 9) == 9);
		CHILD_CHECK(61, write(p.sfd, "to-client", 9) == 9);
		_exit(0);
	}
	child_ok(pid);
	char b[9];
	cr_assert_eq(ph_read_all(p.sfd, b, 9), 9);
	cr_assert_eq(memcmp(b, "to-server", 9), 0);
	cr_assert_eq(ph_read_all(p.cfd, b, 9), 9);
	cr_assert_eq(memcmp(b, "to-client", 9), 0);
	both_again_on_rdma(&p, oc, os, 14);
	ph_pair_close(&p);
}

/* An application's read inside the kernel's socket when the connection
 * could move to RDMA again: the successor takes its counts, and asks or
 * answers, only once that read is over (the read could otherwise take the
 * switch's echo for data). */
struct blocked_read {
	int fd;
	char got[8];
	long n;
};

static void *read_once(void *arg)
{
	struct blocked_read *b = arg;
	b->n = read(b->fd, b->got, sizeof(b->got));
	return NULL;
}

/* A pair on RDMA; the child writes on its copy of the client's end and
 * leaves while a thread of one end (the server's, or the client's) is
 * inside a read. Neither end reaches RDMA again until the other end's
 * bytes, on TCP, end that read; then both do. */
static void read_under_way(bool on_server, uint64_t seed)
{
	struct pair p;
	int go[2];
	pid_t pid = a_writing_child(&p, seed, go);
	struct sv_stream *oc = p.c, *os = p.s;
	struct blocked_read r = {.fd = on_server ? p.sfd : p.cfd};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, read_once, &r), 0);
	usleep(100000); /* inside the kernel's read by now, most likely */
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	cr_assert_null(wait_successor_on_rdma(p.cfd, oc, 1000),
		       "the client reached RDMA while a read was under way");
	cr_assert_eq(write(on_server ? p.cfd : p.sfd, "tcp", 3), 3);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_eq(r.n, 3);
	cr_assert_eq(memcmp(r.got, "tcp", 3), 0);
	both_again_on_rdma(&p, oc, os, seed + 1);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

Test(kept, a_read_under_way_on_the_server_goes_first)
{
	read_under_way(true, 15);
}

Test(kept, a_read_under_way_on_the_client_goes_first)
{
	read_under_way(false, 17);
}

/* ---- Copies the parent must still follow ---------------------------------------- */

/* The child claims (write), then dup()s its copy and closes the original,
 * keeping the dup (dup2(fd, 1); close(fd) as inetd-like code does): the
 * child still holds the socket, and the parent must not think it alone. */
Test(kept, a_dup_in_the_child_keeps_the_parent_on_tcp)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 30);
	struct sv_stream *oc = p.c;
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		CHILD_CHECK(70, write(p.cfd, "child", 5) == 5);
		int d = dup(p.cfd);
		CHILD_CHECK(71, d >= 0);
		CHILD_CHECK(72, close(p.cfd) == 0);
		char c;
		CHILD_CHECK(73, read(go[0], &c, 1) == 1);
		CHILD_CHECK(74, write(d, "late!", 5) == 5);
		_exit(0);
	}
	char b[5];
	cr_assert_eq(ph_read_all(p.sfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	struct sv_stream *n = wait_successor_on_rdma(p.cfd, oc, 1500);
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	cr_assert_null(n, "the client moved to RDMA again while the child holds a dup of its copy");
	ph_pair_close(&p);
}

/* The server's process forked a child (that holds its copy of the server's
 * end, unused) before the client's child claimed the client's end: the
 * server's end is detached by the client's BACK while its own child
 * still holds the socket. The client, alone, asks: the server must not be
 * revived until its child is gone ("later"); then both move. */
Test(kept, a_server_whose_own_child_holds_a_copy_stays_on_tcp_until_it_is_gone)
{
	struct pair p;
	ph_pair_rdma(&p);
	exchange_on_rdma(&p, 31);
	struct sv_stream *oc = p.c, *os = p.s;
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t holder = fork(); /* holds only the server's end */
	cr_assert_geq(holder, 0);
	if (holder == 0) {
		CHILD_CHECK(80, close(p.cfd) == 0);
		char c;
		CHILD_CHECK(81, read(go[0], &c, 1) == 1);
		_exit(0);
	}
	pid_t user = fork(); /* uses the client's end, then leaves */
	cr_assert_geq(user, 0);
	if (user == 0) {
		CHILD_CHECK(82, close(p.sfd) == 0);
		CHILD_CHECK(83, write(p.cfd, "child", 5) == 5);
		_exit(0);
	}
	child_ok(user);
	char b[5];
	cr_assert_eq(ph_read_all(p.sfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	struct sv_stream *nc = wait_successor_on_rdma(p.cfd, oc, 1500);
	struct sv_stream *ns = wait_successor_on_rdma(p.sfd, os, 1500);
	cr_assert_null(ns, "the server moved to RDMA again while its own child holds a copy");
	cr_assert_null(nc, "the client moved to RDMA again while the server's child holds a copy");
	let_go_then_both_on_rdma(&p, holder, go, oc, os, 32);
}

/* A pair on RDMA, bytes both ways, then a fork whose child (0 returned
 * there) drops its copy of the client's end and keeps the server's; go
 * is a pipe for the parent's word to it. */
static pid_t a_server_child(struct pair *p, uint64_t seed, int go[2])
{
	ph_pair_rdma(p);
	exchange_on_rdma(p, seed);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		CHILD_CHECK(120, close(p->cfd) == 0);
	return pid;
}

/* The server's child uses its copy (its claim takes the connection back
 * to TCP, the server's BACK first), then leaves: the client, taken back
 * by its peer, asks again, is told "later" while the child holds its
 * copy, and both move to RDMA again once the server holds it alone. */
Test(kept, a_server_left_alone_by_the_child_that_used_its_copy_is_back_on_rdma)
{
	struct pair p;
	int go[2];
	pid_t pid = a_server_child(&p, 33, go);
	struct sv_stream *oc = p.c, *os = p.s;
	if (pid == 0) {
		CHILD_CHECK(121, write(p.sfd, "child", 5) == 5);
		char c;
		CHILD_CHECK(122, read(go[0], &c, 1) == 1);
		_exit(0);
	}
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	cr_assert_null(wait_successor_on_rdma(p.sfd, os, 1000),
		       "the server moved to RDMA again while its child holds a copy");
	let_go_then_both_on_rdma(&p, pid, go, oc, os, 34);
}

/* The server's application sleeps in poll() on its fd when the entry is
 * swapped (nc does, all the time): the poll is the kernel's, on the
 * socket, and must see the client's bytes and echo arrive there. Nothing
 * of ours may read them ahead while it sleeps, or it sleeps for ever
 * while the connection moves to RDMA under it. */
struct sleeping_poll {
	int fd;
	int ready;
	char got[8];
	long n;
};

static void *poll_then_read(void *arg)
{
	struct sleeping_poll *sp = arg;
	struct pollfd pfd = {.fd = sp->fd, .events = POLLIN};
	sp->ready = poll(&pfd, 1, 20000);
	if (sp->ready == 1)
		sp->n = read(sp->fd, sp->got, sizeof(sp->got));
	return NULL;
}

Test(kept, a_poll_asleep_on_the_server_sees_the_switch)
{
	struct pair p;
	int go[2];
	pid_t pid = a_writing_child(&p, 19, go);
	struct sv_stream *oc = p.c, *os = p.s;
	struct sleeping_poll sp = {.fd = p.sfd};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, poll_then_read, &sp), 0);
	usleep(100000); /* asleep in the kernel's poll by now, most likely */
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	p.c = wait_successor_on_rdma(p.cfd, oc, 10000);
	cr_assert_not_null(p.c, "the client did not move to RDMA again");
	cr_assert_eq(write(p.cfd, "qp", 2), 2);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_eq(sp.ready, 1, "the poll asleep on the old entry never woke");
	cr_assert_eq(sp.n, 2);
	cr_assert_eq(memcmp(sp.got, "qp", 2), 0);
	p.s = wait_successor_on_rdma(p.sfd, os, 10000);
	cr_assert_not_null(p.s, "the server did not move to RDMA again");
	exchange_on_rdma(&p, 20);
	close(go[0]);
	close(go[1]);
	ph_pair_close(&p);
}

/* A client's large blocking write, part of it over the QP, sleeps for
 * room when the server's child takes the connection back: the client's
 * end then gets a successor (its server went back first: it asks again),
 * and the rest of the write must be counted by it (a write on the old
 * entry past its counts would misplace the switch). */
enum { BIG = 4 << 20 };

struct big_write {
	int fd;
	long n;
};

static void *write_big(void *arg)
{
	struct big_write *w = arg;
	uint8_t *out = malloc(BIG);
	h_pattern(out, BIG, 37, 0);
	w->n = ph_write_all(w->fd, out, BIG);
	free(out);
	return NULL;
}

Test(kept, a_write_asleep_when_the_server_goes_back_is_counted_by_the_successor)
{
	struct pair p;
	int go[2];
	pid_t pid = a_server_child(&p, 36, go);
	struct sv_stream *oc = p.c, *os = p.s;
	if (pid == 0) {
		char c;
		CHILD_CHECK(131, read(go[0], &c, 1) == 1);
		CHILD_CHECK(132, write(p.sfd, "child", 5) == 5);
		CHILD_CHECK(133, read(go[0], &c, 1) == 1);
		_exit(0);
	}
	struct big_write w = {.fd = p.cfd};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, write_big, &w), 0);
	/* The writer sleeps for credits: nobody reads. */
	cr_assert(h_wait_asleep(p.c, 10000), "the writer never slept");
	cr_assert_eq(write(go[1], "g", 1), 1);
	uint8_t *in = malloc(BIG);
	cr_assert_eq(ph_read_all(p.sfd, in, BIG), BIG);
	cr_assert(h_pattern_ok(in, BIG, 37, 0), "the server read other bytes");
	free(in);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_eq(w.n, BIG);
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	let_go_then_both_on_rdma(&p, pid, go, oc, os, 38);
}

/* Issue 53, finding 7: a child that drops its ids leaves its parent's
 * table of kept connections, after which it could claim nothing. So the
 * interposed setuid claims its copy first: the parent takes the
 * connection back to TCP before the child ever uses it, and the child
 * then reads the rest and writes, every byte once. */
Test(kept, a_child_that_drops_its_ids_claims_its_copy_as_it_leaves_the_family)
{
	if (geteuid() != 0)
		cr_skip_test("dropping ids needs root");
	struct pair p;
	pair_with_bytes_unread(&p);
	int up[2], go[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(up[0]);
		close(go[1]); /* the parent's end: its failure is our EOF */
		CHILD_CHECK(20, setgid(65534) == 0 && setuid(65534) == 0);
		char c;
		CHILD_CHECK(21, write(up[1], "u", 1) == 1 && read(go[0], &c, 1) == 1);
		child_reads_the_rest(p.sfd, -1);
	}
	char c;
	cr_assert_eq(read(up[0], &c, 1), 1);
	cr_assert_eq(h_state(p.s), SV_CONN_DETACHED,
		     "the child left its family with its copy unclaimed (server %s)",
		     sv_conn_state_name(h_state(p.s)));
	cr_assert_eq(write(go[1], "g", 1), 1);
	child_ok(pid);
	char b[5];
	cr_assert_eq(ph_read_all(p.cfd, b, 5), 5);
	cr_assert_eq(memcmp(b, "child", 5), 0);
	for (int i = 0; i < 2; i++) {
		close(up[i]);
		close(go[i]);
	}
	ph_pair_close(&p);
}
