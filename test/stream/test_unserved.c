/* Calls that hand a connection to something libsovia does not serve take it
 * back to plain TCP first (preload/unserved.c): the receiver then has the
 * whole connection in the kernel's socket. Here the descriptors passed
 * over a Unix socket (SCM_RIGHTS), and the children of system() and
 * popen(), which glibc spawns past the interposed fork and exec. */
#include "preload_harness.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(unserved, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* One message on u carrying `fds` (nfds of them) in SCM_RIGHTS, split in
 * two control messages when `split`. */
static void fill_rights(struct msghdr *m, struct iovec *iov, void *ctl, size_t ctl_len,
			const int *fds, int nfds, bool split)
{
	memset(ctl, 0, ctl_len);
	*m = (struct msghdr){.msg_iov = iov, .msg_iovlen = 1, .msg_control = ctl};
	int first = split ? 1 : nfds;
	size_t len = CMSG_SPACE(sizeof(int) * (size_t)first);
	if (split)
		len += CMSG_SPACE(sizeof(int) * (size_t)(nfds - first));
	cr_assert_leq(len, ctl_len);
	m->msg_controllen = len;
	struct cmsghdr *c = CMSG_FIRSTHDR(m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)first);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)first);
	if (split) {
		c = CMSG_NXTHDR(m, c);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)(nfds - first));
		memcpy(CMSG_DATA(c), fds + first, sizeof(int) * (size_t)(nfds - first));
	}
}

/* The fds that came with a message on u, in order. */
static int take_rights(int u, int *out, int max)
{
	char b[1], ctl[256];
	struct iovec iov = {b, 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
			   .msg_controllen = sizeof(ctl)};
	cr_assert_eq(recvmsg(u, &m, 0), 1);
	int n = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k && n < max; i++)
			memcpy(&out[n++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	return n;
}

/* The client's stream (seed) went over the QP; its reader read `consumed`
 * bytes before its socket was passed on. The passed socket (a plain kernel
 * socket in the receiver: not in libsovia's table) then gives the rest,
 * and what the client writes after, in order. */
static void check_passed(struct pair *p, int got_fd, uint64_t seed, size_t len, size_t consumed)
{
	cr_assert(sv_stream_kernel_only(p->s), "the passed socket's connection is still "
		  "libsovia's (%s)", sv_conn_state_name(h_state(p->s)));
	cr_assert_null(ph_stream(got_fd), "the received fd is not libsovia's");
	uint8_t *in = malloc(len + 4);
	cr_assert_eq(h_wait_state(p->c, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED);
	cr_assert_eq(write(p->cfd, "more", 4), 4);
	cr_assert_eq(ph_read_all(got_fd, in, len - consumed + 4), len - consumed + 4);
	cr_assert(h_pattern_ok(in, len - consumed, seed, consumed), "the passed socket's bytes");
	cr_assert_eq(memcmp(in + len - consumed, "more", 4), 0);
	free(in);
}

/* Two connections on RDMA, their server ends passed in one message (one
 * control message each), with a plain fd beside them. */
static void pass_two(bool mmsg)
{
	struct pair a, b;
	ph_pair_rdma(&a);
	ph_pair_rdma(&b);
	enum { LEN = 6000, READ = 100 };
	uint8_t out[LEN];
	h_pattern(out, LEN, 21, 0);
	cr_assert_eq(ph_write_all(a.cfd, out, LEN), LEN);
	h_pattern(out, LEN, 22, 0);
	cr_assert_eq(ph_write_all(b.cfd, out, LEN), LEN);
	uint8_t in[READ];
	cr_assert_eq(ph_read_all(a.sfd, in, READ), READ);
	cr_assert(h_pattern_ok(in, READ, 21, 0));
	cr_assert_gt(h_counts(a.c).rdma_tx, 0);

	int u[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, u), 0);
	int fds[3] = {a.sfd, u[0], b.sfd};
	char one = 'x', ctl[256];
	struct iovec iov = {&one, 1};
	struct msghdr m;
	fill_rights(&m, &iov, ctl, sizeof(ctl), fds, 3, true);
	if (mmsg) {
		struct mmsghdr mm = {.msg_hdr = m};
		cr_assert_eq(sendmmsg(u[0], &mm, 1, 0), 1);
	} else {
		cr_assert_eq(sendmsg(u[0], &m, 0), 1);
	}
	int got[3];
	cr_assert_eq(take_rights(u[1], got, 3), 3);
	check_passed(&a, got[0], 21, LEN, READ);
	check_passed(&b, got[2], 22, LEN, 0);
	for (int i = 0; i < 3; i++)
		close(got[i]);
	close(u[0]);
	close(u[1]);
	ph_pair_close(&a);
	ph_pair_close(&b);
}

Test(unserved, sendmsg_scm_rights_takes_each_passed_connection_back_first)
{
	pass_two(false);
}

Test(unserved, sendmmsg_scm_rights_takes_each_passed_connection_back_first)
{
	pass_two(true);
}

/* A shell spawned with the client's socket: `run` starts it with `cmd`
 * and returns its status once it is done. */
typedef int (*spawn_fn)(const char *cmd);

static int run_system(const char *cmd)
{
	char quiet[128];
	snprintf(quiet, sizeof(quiet), "%s >/dev/null", cmd);
	return system(quiet);
}

static int run_popen(const char *cmd)
{
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	char line[16] = {0};
	cr_assert_not_null(fgets(line, sizeof(line), f));
	cr_assert_str_eq(line, "done\n", "popen's pipe");
	return pclose(f);
}

/* The client's socket survives into the shell (no FD_CLOEXEC), which
 * writes to it: the server reads the client's bytes that went over the
 * QP, then the shell's, then the client's again, in order. A second
 * connection whose sockets have FD_CLOEXEC is not the shell's and stays
 * on RDMA. */
static void spawn_with_a_connection(spawn_fn run)
{
	struct pair a, b;
	ph_pair_rdma(&a);
	ph_pair_rdma(&b);
	cr_assert_eq(fcntl(b.cfd, F_SETFD, FD_CLOEXEC), 0);
	cr_assert_eq(fcntl(b.sfd, F_SETFD, FD_CLOEXEC), 0); /* both ends are this process's */
	enum { LEN = 5000 };
	uint8_t out[LEN], in[LEN + 10];
	h_pattern(out, LEN, 31, 0);
	cr_assert_eq(ph_write_all(a.cfd, out, LEN), LEN);
	cr_assert_gt(h_counts(a.c).rdma_tx, 0);

	char cmd[80]; /* bash: dash's redirections take one digit */
	snprintf(cmd, sizeof(cmd), "bash -c 'printf child >&%d' && echo done", a.cfd);
	int st = run(cmd);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the shell: status %d", st);
	cr_assert(sv_stream_kernel_only(a.c), "the shell's connection is still libsovia's (%s)",
		  sv_conn_state_name(h_state(a.c)));
	cr_assert_eq(h_state(b.c), SV_CONN_RDMA, "a close-on-exec connection stays on RDMA (%s)",
		     sv_conn_state_name(h_state(b.c)));
	cr_assert_eq(write(a.cfd, "after", 5), 5);
	cr_assert_eq(ph_read_all(a.sfd, in, LEN + 10), LEN + 10);
	cr_assert(h_pattern_ok(in, LEN, 31, 0), "the client's bytes before the shell's");
	cr_assert_eq(memcmp(in + LEN, "childafter", 10), 0, "then the shell's, then the client's");
	ph_pair_close(&a);
	ph_pair_close(&b);
}

Test(unserved, system_takes_the_shells_connections_back_first)
{
	spawn_with_a_connection(run_system);
}

Test(unserved, popen_takes_the_shells_connections_back_first)
{
	spawn_with_a_connection(run_popen);
}
