/* A fork: the parent's connections go back to plain TCP first (as the
 * interposed fork() does), the child gets none of the parent's threads or
 * queue pairs, uses the inherited socket as plain TCP, and upgrades the
 * connections it makes itself. */
#include "share.h"
#include "harness.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

TestSuite(fork, .init = h_setup, .fini = h_teardown, .timeout = 60);

static void child(int inherited_fd)
{
	sv_share_atfork_child();
	/* The inherited socket is plain TCP: the kernel's own calls. */
	CHILD_CHECK(10, send(inherited_fd, "child", 5, 0) == 5);
	/* A connection of its own moves to RDMA with a helper of its own. */
	struct pair q;
	memset(&q, 0, sizeof(q));
	q.lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	CHILD_CHECK(11, bind(q.lfd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(q.lfd, 4) == 0);
	q.l = sv_upgrade_listen(q.lfd);
	CHILD_CHECK(12, q.l != NULL);
	CHILD_CHECK(13, getsockname(q.lfd, (struct sockaddr *)&a, &al) == 0);
	q.cfd = socket(AF_INET, SOCK_STREAM, 0);
	CHILD_CHECK(14, connect(q.cfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	q.sfd = accept(q.lfd, NULL, NULL);
	q.c = sv_stream_new(q.cfd, true);
	q.s = sv_stream_new(q.sfd, false);
	h_start_server(q.s, q.l);
	sv_stream_start_client(q.c);
	CHILD_CHECK(15, h_wait_state(q.c, SV_CONN_RDMA, 10000) == SV_CONN_RDMA);
	CHILD_CHECK(16, h_write(q.c, "rdma", 4, 0) == 4);
	char b[4];
	long end;
	CHILD_CHECK(17, h_read_all(q.s, b, 4, &end) == 4 && memcmp(b, "rdma", 4) == 0);
	CHILD_CHECK(18, h_counts(q.c).rdma_tx == 4);
	CHILD_CHECK(19, fake_net_violations() == 0); /* h_teardown runs in the parent only */
	_exit(0);
}

Test(fork, child_uses_plain_tcp_and_upgrades_its_own)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t out[3000], in[3005];
	h_pattern(out, sizeof(out), 40, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	/* As the interposed fork(): every connection back to plain TCP. */
	cr_assert_eq(sv_stream_detach(p.c, "test"), 0);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		child(p.cfd);
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed check %d",
		  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	/* The parent's side: the bytes sent before the fork, then the
	 * child's, in order, on the plain socket. */
	size_t got = 0;
	while (got < sizeof(in)) {
		ssize_t r = recv(p.sfd, in + got, sizeof(in) - got, 0);
		cr_assert_gt(r, 0);
		got += (size_t)r;
	}
	cr_assert(h_pattern_ok(in, sizeof(out), 40, 0));
	cr_assert_eq(memcmp(in + sizeof(out), "child", 5), 0);
	/* And the parent's own stream still works. */
	cr_assert_eq(h_write(p.c, "parent", 6, 0), 6);
	char b[6];
	long end;
	cr_assert_eq(h_read_all(p.s, b, 6, &end), 6);
	cr_assert_eq(memcmp(b, "parent", 6), 0);
	h_pair_free(&p);
}
