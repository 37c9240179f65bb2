/* dup2, dup3 and fcntl(F_DUPFD*) at their edges on a connection libsovia
 * serves (preload/descriptors.c): onto the same number they copy nothing
 * and change nothing, a copy onto a served fd ends that connection as
 * close() would (its bytes delivered, then the end), a call the kernel
 * refuses leaves both fds as they were, and F_DUPFD copies are the same
 * stream. */
#include "preload_harness.h"
#include "preload.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(dup, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* `len` bytes of pattern `seed` written on `wfd` arrive on `rfd`, in order. */
static void bytes_arrive(int wfd, int rfd, size_t len, uint64_t seed)
{
	uint8_t *out = malloc(len), *in = malloc(len);
	h_pattern(out, len, seed, 0);
	cr_assert_eq(ph_write_all(wfd, out, len), (long)len);
	cr_assert_eq(ph_read_all(rfd, in, len), len);
	cr_assert(h_pattern_ok(in, len, seed, 0), "the bytes of pattern %lu", (unsigned long)seed);
	free(out);
	free(in);
}

/* The peer of a closed connection reads its end: EOF, nothing more. */
static void peer_sees_the_end(int fd)
{
	char b;
	cr_assert_eq(read(fd, &b, 1), 0, "the peer reads the end");
}

Test(dup, dup2_onto_itself_returns_it_and_changes_nothing)
{
	struct pair a;
	ph_pair_rdma(&a);
	struct sv_stream *s = ph_stream(a.cfd);
	int before = h_open_fds();
	cr_assert_eq(dup2(a.cfd, a.cfd), a.cfd);
	cr_assert_eq(h_open_fds(), before, "dup2(fd, fd) opened a descriptor");
	cr_assert_eq(ph_stream(a.cfd), s);
	cr_assert_eq(h_state(s), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(s)));
	bytes_arrive(a.cfd, a.sfd, 5000, 51);
	/* One close still ends the connection: no copy was made. */
	cr_assert_eq(close(a.cfd), 0);
	a.cfd = -1;
	peer_sees_the_end(a.sfd);
	ph_pair_close(&a);
}

Test(dup, dup3_onto_itself_is_einval_and_changes_nothing)
{
	struct pair a;
	ph_pair_rdma(&a);
	struct sv_stream *s = ph_stream(a.cfd);
	int before = h_open_fds();
	errno = 0;
	cr_assert_eq(dup3(a.cfd, a.cfd, 0), -1);
	cr_assert_eq(errno, EINVAL);
	cr_assert_eq(dup3(a.cfd, a.cfd, O_CLOEXEC), -1);
	cr_assert_eq(errno, EINVAL);
	cr_assert_eq(h_open_fds(), before, "a refused dup3 opened a descriptor");
	cr_assert_eq(ph_stream(a.cfd), s);
	bytes_arrive(a.cfd, a.sfd, 5000, 52);
	ph_pair_close(&a);
}

/* A dup3 the kernel refuses for its flags must not have closed fd2's
 * connection first. */
Test(dup, dup3_with_a_bad_flag_leaves_the_target_connection_open)
{
	struct pair a;
	ph_pair_rdma(&a);
	int other = open("/dev/null", O_RDWR);
	cr_assert_geq(other, 0);
	struct sv_stream *s = ph_stream(a.sfd);
	errno = 0;
	cr_assert_eq(dup3(other, a.sfd, 0x40000000), -1);
	cr_assert_eq(errno, EINVAL);
	cr_assert_eq(ph_stream(a.sfd), s, "the target's connection was closed");
	cr_assert_eq(h_state(s), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(s)));
	bytes_arrive(a.cfd, a.sfd, 5000, 53);
	bytes_arrive(a.sfd, a.cfd, 5000, 54);
	close(other);
	ph_pair_close(&a);
}

/* dup2 onto a served fd closes its connection as close() does: the bytes
 * written before (still coalesced, or in flight) reach the peer, then the
 * end; the number is the other file's afterwards. */
static void dup_onto_served(bool three)
{
	struct pair a;
	ph_pair_rdma(&a);
	enum { LEN = 3000, TAIL = 100 };
	uint8_t out[LEN + TAIL], in[LEN + TAIL];
	h_pattern(out, LEN + TAIL, 55, 0);
	cr_assert_eq(ph_write_all(a.cfd, out, LEN), LEN);
	/* Below the coalescing size: held by libsovia when the copy comes. */
	cr_assert_eq(ph_write_all(a.cfd, out + LEN, TAIL), TAIL);
	int other = open("/dev/null", O_RDWR);
	cr_assert_geq(other, 0);
	if (three)
		cr_assert_eq(dup3(other, a.cfd, O_CLOEXEC), a.cfd);
	else
		cr_assert_eq(dup2(other, a.cfd), a.cfd);
	cr_assert_null(ph_stream(a.cfd), "the number is /dev/null's now");
	cr_assert_eq(write(a.cfd, "x", 1), 1, "/dev/null takes it");
	cr_assert_eq(ph_read_all(a.sfd, in, LEN + TAIL), LEN + TAIL);
	cr_assert(h_pattern_ok(in, LEN + TAIL, 55, 0), "the bytes written before the dup");
	peer_sees_the_end(a.sfd);
	close(other);
	ph_pair_close(&a);
}

Test(dup, dup2_onto_a_served_fd_delivers_its_bytes_then_the_end)
{
	dup_onto_served(false);
}

Test(dup, dup3_onto_a_served_fd_delivers_its_bytes_then_the_end)
{
	dup_onto_served(true);
}

/* fcntl(F_DUPFD, F_DUPFD_CLOEXEC): a copy at or above the number asked,
 * the same stream, its own FD_CLOEXEC; the connection lives until the
 * last copy is closed, and the bytes of all copies arrive in order. */
static void fcntl_dup(int cmd)
{
	struct pair a;
	ph_pair_rdma(&a);
	int c = fcntl(a.cfd, cmd, 200);
	cr_assert_geq(c, 200);
	cr_assert_eq(ph_stream(c), ph_stream(a.cfd), "the copy is the same stream");
	cr_assert_eq(fcntl(c, F_GETFD) & FD_CLOEXEC, cmd == F_DUPFD_CLOEXEC ? FD_CLOEXEC : 0);
	cr_assert_eq(fcntl(a.cfd, F_GETFD) & FD_CLOEXEC, 0);
	bytes_arrive(a.cfd, a.sfd, 3000, 56);
	bytes_arrive(c, a.sfd, 3000, 57);
	cr_assert_eq(close(a.cfd), 0);
	a.cfd = -1;
	bytes_arrive(c, a.sfd, 3000, 58);
	bytes_arrive(a.sfd, c, 3000, 59);
	cr_assert_eq(h_state(ph_stream(c)), SV_CONN_RDMA);
	cr_assert_eq(close(c), 0);
	peer_sees_the_end(a.sfd);
	ph_pair_close(&a);
}

Test(dup, fcntl_dupfd_makes_the_same_stream)
{
	fcntl_dup(F_DUPFD);
}

Test(dup, fcntl_dupfd_cloexec_makes_the_same_stream)
{
	fcntl_dup(F_DUPFD_CLOEXEC);
}

/* A copy on stdout whose glibc FILE was used already (bytes may sit in
 * its buffer): glibc's stdout writes fd 1 with its internal calls, past
 * the interposer, so the stream goes back to plain TCP and both fds are
 * the kernel's socket: bytes written before the copy, then through either
 * fd, arrive in order. */
Test(dup, a_copy_on_a_used_stdout_takes_the_stream_back_to_tcp)
{
	struct pair a;
	ph_pair_rdma(&a);
	bytes_arrive(a.cfd, a.sfd, 5000, 53);
	fflush(stdout);
	cr_assert_lt(fwide(stdout, -1), 0); /* used: byte-oriented from now on */
	int saved = dup(STDOUT_FILENO);
	cr_assert_geq(saved, 0);
	int r = dup2(a.cfd, STDOUT_FILENO);
	struct sv_stream *on_out = ph_stream(STDOUT_FILENO), *on_c = ph_stream(a.cfd);
	enum sv_conn_state st = h_state(a.c);
	/* stdout back before any assertion can print. */
	bool raw = write(STDOUT_FILENO, "raw", 3) == 3; /* the kernel's, as stdio's would be */
	cr_assert_eq(dup2(saved, STDOUT_FILENO), STDOUT_FILENO);
	close(saved);
	cr_assert_eq(r, STDOUT_FILENO);
	cr_assert_not(sv_stdio_ours(STDOUT_FILENO), "a used FILE is never replaced");
	cr_assert_null(on_out, "the copy on stdout is a stream");
	cr_assert_null(on_c, "the original is still a stream");
	cr_assert_eq(st, SV_CONN_DETACHED, "%s", sv_conn_state_name(st));
	cr_assert(raw);
	char b[3];
	cr_assert_eq(ph_read_all(a.sfd, b, 3), 3);
	cr_assert(!memcmp(b, "raw", 3));
	bytes_arrive(a.cfd, a.sfd, 5000, 54);
	ph_pair_close(&a);
}

/* ftpd -D's child: its control connection dup2()ed onto 0 and 1, then
 * commands read with fgets(stdin) and replies written with printf. glibc's
 * FILEs were never used: libsovia's take their place at the dup2, the
 * copies are the same stream, and every byte goes over the QP. */
Test(dup, copies_on_an_unused_stdin_and_stdout_stay_on_rdma)
{
	struct pair a;
	ph_pair_rdma(&a);
	bytes_arrive(a.cfd, a.sfd, 5000, 55);
	struct h_counts before = h_counts(a.s);
	int saved_in = dup(STDIN_FILENO), saved_out = dup(STDOUT_FILENO);
	cr_assert(saved_in >= 0 && saved_out >= 0);
	cr_assert_not(sv_stdio_ours(STDIN_FILENO) || sv_stdio_ours(STDOUT_FILENO));
	int r0 = dup2(a.sfd, STDIN_FILENO), r1 = dup2(a.sfd, STDOUT_FILENO);
	bool ours = sv_stdio_ours(STDIN_FILENO) && sv_stdio_ours(STDOUT_FILENO);
	struct sv_stream *on_in = ph_stream(STDIN_FILENO), *on_out = ph_stream(STDOUT_FILENO);
	bool printed = printf("220 ready\r\n") == 11 && fflush(stdout) == 0;
	char reply[11], line[64] = "";
	size_t got = ph_read_all(a.cfd, reply, sizeof(reply));
	bool sent = ph_write_all(a.cfd, "USER x\r\nPASS y\r\n", 16) == 16;
	bool read1 = fgets(line, sizeof(line), stdin) != NULL;
	bool line1 = strcmp(line, "USER x\r\n") == 0;
	bool read2 = fgets(line, sizeof(line), stdin) != NULL && strcmp(line, "PASS y\r\n") == 0;
	enum sv_conn_state st = h_state(a.s);
	struct h_counts after = h_counts(a.s);
	/* stdout and stdin back (our FILEs stay, on whatever the fds are)
	 * before any assertion can print. */
	cr_assert_eq(dup2(saved_out, STDOUT_FILENO), STDOUT_FILENO);
	cr_assert_eq(dup2(saved_in, STDIN_FILENO), STDIN_FILENO);
	close(saved_in);
	close(saved_out);
	cr_assert(r0 == STDIN_FILENO && r1 == STDOUT_FILENO);
	cr_assert(ours, "libsovia's FILEs took stdin's and stdout's place");
	cr_assert(on_in == a.s && on_out == a.s, "the copies are the same stream");
	cr_assert(printed);
	cr_assert_eq(got, sizeof(reply));
	cr_assert(!memcmp(reply, "220 ready\r\n", sizeof(reply)));
	cr_assert(sent && read1 && read2, "the commands read through stdin (first: [%s])", line);
	cr_assert(line1);
	cr_assert_eq(st, SV_CONN_RDMA, "%s", sv_conn_state_name(st));
	cr_assert_eq(after.rdma_tx - before.rdma_tx, sizeof(reply), "the reply over the QP");
	cr_assert_eq(after.rdma_rx - before.rdma_rx, 16, "the commands over the QP");
	cr_assert_eq(after.tcp_tx, before.tcp_tx);
	cr_assert_eq(after.tcp_rx, before.tcp_rx);
	bytes_arrive(a.cfd, a.sfd, 5000, 56);
	ph_pair_close(&a);
}
