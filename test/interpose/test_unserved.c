/* Calls that hand a connection to something libsovia does not serve take it
 * back to plain TCP first (preload/unserved.c): the receiver then has the
 * whole connection in the kernel's socket. Here the descriptors passed
 * over a Unix socket (SCM_RIGHTS), the children of system(), popen() and
 * wordexp(), which glibc spawns past the interposed fork and exec, those
 * of posix_spawn(), and daemon() and forkpty(), whose fork is glibc's
 * internal one. */
#include "preload_harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wordexp.h>

extern char **environ;

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
	/* The client, taken back by its server, asks again (SOVIA_ASK_AGAIN)
	 * as a new stream; the server's end went to the receiver and is
	 * never revived, so the server refuses at once (its deadline would
	 * end it as a timeout, the client's writes held meanwhile). */
	struct sv_stream *n = NULL;
	for (int waited = 0; waited < 10000 && (!n || n == p->c); waited += 10) {
		usleep(10000);
		n = ph_stream(p->cfd);
	}
	cr_assert(n && n != p->c, "the client did not ask again");
	cr_assert_eq(h_wait_state(n, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "%s",
		     sv_conn_state_name(h_state(n)));
	cr_assert_eq(h_fallback(n), SV_FB_REJECTED, "the request was not refused: %s",
		     sv_fallback_name(h_fallback(n)));
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

/* The shell of a command substitution: its output is wordexp's word. */
static int run_wordexp(const char *cmd)
{
	char words[128];
	snprintf(words, sizeof(words), "$(%s)", cmd);
	wordexp_t we;
	int r = wordexp(words, &we, 0);
	cr_assert_eq(r, 0, "wordexp: %d", r);
	cr_assert_eq(we.we_wordc, 1);
	cr_assert_str_eq(we.we_wordv[0], "done", "the substitution's output");
	wordfree(&we);
	return 0;
}

static int run_posix_spawn(const char *cmd)
{
	char quiet[128];
	snprintf(quiet, sizeof(quiet), "%s >/dev/null", cmd);
	char *argv[] = {"sh", "-c", quiet, NULL};
	pid_t pid;
	int r = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ);
	cr_assert_eq(r, 0, "posix_spawn: %d", r);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return st;
}

/* A shell on a terminal of its own, as terminal emulators and expect
 * start theirs. */
static int run_forkpty(const char *cmd)
{
	char quiet[128];
	snprintf(quiet, sizeof(quiet), "%s >/dev/null", cmd);
	int master;
	pid_t pid = forkpty(&master, NULL, NULL, NULL);
	cr_assert_geq(pid, 0, "forkpty: %s", strerror(errno));
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", quiet, (char *)NULL);
		_exit(127);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	close(master);
	return st;
}

/* The client's socket survives into the shell (no FD_CLOEXEC), which
 * writes to it: the server reads the client's bytes that went over the
 * QP, then the shell's, then the client's again, in order. A second
 * connection whose sockets have FD_CLOEXEC is not the shell's and stays
 * on RDMA, unless `every` (posix_spawn: its file actions may hand any fd
 * over, so all go back). */
static void spawn_with_a_connection_of(spawn_fn run, bool every)
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
	if (every)
		cr_assert(sv_stream_kernel_only(b.c), "a close-on-exec connection is still "
			  "libsovia's (%s)", sv_conn_state_name(h_state(b.c)));
	else
		cr_assert_eq(h_state(b.c), SV_CONN_RDMA, "a close-on-exec connection stays on "
			     "RDMA (%s)", sv_conn_state_name(h_state(b.c)));
	cr_assert_eq(write(a.cfd, "after", 5), 5);
	cr_assert_eq(ph_read_all(a.sfd, in, LEN + 10), LEN + 10);
	cr_assert(h_pattern_ok(in, LEN, 31, 0), "the client's bytes before the shell's");
	cr_assert_eq(memcmp(in + LEN, "childafter", 10), 0, "then the shell's, then the client's");
	ph_pair_close(&a);
	ph_pair_close(&b);
}

static void spawn_with_a_connection(spawn_fn run)
{
	spawn_with_a_connection_of(run, false);
}

Test(unserved, system_takes_the_shells_connections_back_first)
{
	spawn_with_a_connection(run_system);
}

Test(unserved, popen_takes_the_shells_connections_back_first)
{
	spawn_with_a_connection(run_popen);
}

Test(unserved, wordexp_takes_the_substitutions_connections_back_first)
{
	spawn_with_a_connection(run_wordexp);
}

/* Words with no command substitution start no shell: the connections
 * stay on RDMA. */
Test(unserved, wordexp_without_a_command_leaves_the_connections_alone)
{
	struct pair a;
	ph_pair_rdma(&a);
	wordexp_t we;
	cr_assert_eq(wordexp("~ $HOME x", &we, 0), 0);
	wordfree(&we);
	cr_assert_eq(wordexp("$(echo no)", &we, WRDE_NOCMD), WRDE_CMDSUB);
	cr_assert_eq(h_state(a.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(a.c)));
	ph_pair_close(&a);
}

Test(unserved, forkpty_takes_every_connection_back_first)
{
	spawn_with_a_connection_of(run_forkpty, true);
}

Test(unserved, posix_spawn_takes_every_connection_back_first)
{
	spawn_with_a_connection_of(run_posix_spawn, true);
}

/* The daemon's own checks (no Criterion there, and no one waits for it):
 * 0 when the rest of the client's bytes, then what it writes now, come
 * through the inherited sockets in order, else the number of the check
 * that failed. */
static char daemon_checks(struct pair *p, size_t len, size_t consumed, uint64_t seed)
{
	if (ph_stream(p->sfd) || ph_stream(p->cfd))
		return 1; /* the parent's streams are not this process's */
	/* A read that never gets its bytes ends instead of hanging. */
	struct timeval tv = {.tv_sec = 10};
	if (setsockopt(p->sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0)
		return 2;
	uint8_t *in = malloc(len + 5);
	if (!in)
		return 3;
	char r = 0;
	if (write(p->cfd, "after", 5) != 5)
		r = 4;
	else if (ph_read_all(p->sfd, in, len - consumed + 5) != len - consumed + 5)
		r = 5;
	else if (!h_pattern_ok(in, len - consumed, seed, consumed))
		r = 6;
	else if (memcmp(in + len - consumed, "after", 5) != 0)
		r = 7;
	free(in);
	return r;
}

/* The application (a child of the test, so that daemon's parent may
 * leave): a connection of its own on RDMA, part read, then daemon(). */
static void daemon_app(int report)
{
	enum { LEN = 6000, READ = 100, SEED = 41 };
	struct pair a;
	ph_pair_rdma(&a);
	uint8_t out[LEN], in[READ];
	h_pattern(out, LEN, SEED, 0);
	if (ph_write_all(a.cfd, out, LEN) != LEN || h_counts(a.c).rdma_tx == 0)
		_exit(20);
	if (ph_read_all(a.sfd, in, READ) != READ || !h_pattern_ok(in, READ, SEED, 0))
		_exit(21);
	if (daemon(1, 1) != 0)
		_exit(22);
	char v = daemon_checks(&a, LEN, READ, SEED);
	(void)!write(report, &v, 1);
	_exit(0);
}

/* daemon() forks past the interposed fork and its parent leaves at once
 * by glibc's own _exit: the daemon carries on with the connections, which
 * went back to plain TCP first with nothing lost. */
Test(unserved, daemon_takes_every_connection_back_first)
{
	int rep[2];
	cr_assert_eq(pipe(rep), 0);
	pid_t pid = fork(); /* no connection yet: nothing goes back */
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(rep[0]);
		daemon_app(rep[1]);
	}
	close(rep[1]);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the application: status %#x", st);
	char v = -1;
	cr_assert_eq(read(rep[0], &v, 1), 1, "the daemon reported nothing");
	cr_assert_eq(v, 0, "the daemon's check %d failed", v);
	close(rep[0]);
}
