/* The calls that report a connection's state answer from libsovia's state
 * where the kernel's socket knows only TCP's part: getsockopt SO_ERROR and
 * TCP_INFO, ioctl SIOCOUTQ (preload/sovia_ops.c, src/stream_report.c). */
#include "preload_harness.h"

#include "log.h"
#include "real.h"
#include "stream.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(report, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* tcpi_state's values (the kernel's; <netinet/tcp.h>, which names them,
 * cannot be used with <linux/tcp.h>, whose struct tcp_info has the byte
 * counters). */
enum { ESTABLISHED = 1, FIN_WAIT1 = 4, FIN_WAIT2 = 5, CLOSE = 7, CLOSE_WAIT = 8, LAST_ACK = 9 };

static int outq(int fd, unsigned long req)
{
	int n = -1;
	cr_assert_eq(ioctl(fd, req, &n), 0);
	return n;
}

/* A write that went over the QP is in flight until its completion, and a
 * small one after it waits coalesced: both are the application's bytes the
 * peer does not have yet. Once they arrive, none is left. */
Test(report, siocoutq_counts_what_is_coalesced_and_in_flight)
{
	struct pair p;
	ph_pair_rdma(&p);
	cr_assert_eq(outq(p.cfd, SIOCOUTQ), 0);
	fake_net_hold(FAKE_CLIENT);
	enum { BIG = 2000, SMALL = 100 };
	uint8_t out[BIG + SMALL], in[BIG + SMALL];
	h_pattern(out, sizeof(out), 41, 0);
	cr_assert_eq(write(p.cfd, out, BIG), BIG);
	unsigned msgs = fake_net_in_flight();
	cr_assert_gt(msgs, 0, "the large write is in flight");
	cr_assert_eq(write(p.cfd, out + BIG, SMALL), SMALL);
	cr_assert_eq(fake_net_in_flight(), msgs, "the small write waits, coalesced");
	cr_assert_eq(outq(p.cfd, SIOCOUTQ), BIG + SMALL);
	cr_assert_eq(outq(p.cfd, TIOCOUTQ), BIG + SMALL);

	fake_net_release();
	cr_assert_eq(ph_read_all(p.sfd, in, sizeof(in)), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), 41, 0));
	uint64_t until = h_ms() + 10000;
	int left;
	while ((left = outq(p.cfd, SIOCOUTQ)) != 0 && h_ms() < until)
		usleep(1000);
	cr_assert_eq(left, 0, "every byte arrived, %d still counted", left);
	ph_pair_close(&p);
}

/* The server's TCP socket resets the connection (an abortive close's RST
 * without closing the fd). */
static void reset_peer_tcp(struct pair *p)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	struct sockaddr sa = {.sa_family = AF_UNSPEC};
	cr_assert_eq(sv_real.setsockopt(p->sfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	cr_assert_eq(sv_real.connect(p->sfd, &sa, sizeof(sa)), 0, "the peer's TCP resets");
}

/* The peer's connection was reset (its TCP reset, our QP lost): our
 * resume finds TCP reset, and the connection fails with ECONNRESET. The
 * application learns it from SO_ERROR, once, as from the kernel's pending
 * error; then the stream ends as a reset TCP socket's does. */
Test(report, so_error_tells_a_reset_of_the_connection_once)
{
	struct pair p;
	ph_pair_rdma(&p);
	sv_lock(&p.c->lock); /* nothing of ours looks at TCP in between */
	reset_peer_tcp(&p);
	sv_stream_break(p.c, -ECONNRESET); /* and our QP is lost */
	sv_unlock(&p.c->lock);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_BROKEN, 10000), SV_CONN_BROKEN);
	cr_assert_eq(p.c->error, -ECONNRESET, "the connection failed with %d", p.c->error);

	int err = -1;
	socklen_t el = sizeof(err);
	cr_assert_eq(getsockopt(p.cfd, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	cr_assert_eq(err, ECONNRESET, "SO_ERROR: %s", strerror(err));
	cr_assert_eq(el, sizeof(err));
	err = -1;
	cr_assert_eq(getsockopt(p.cfd, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	cr_assert_eq(err, 0, "reported once; then %s", strerror(err));
	char b;
	cr_assert_eq(read(p.cfd, &b, 1), 0, "after the error, the end");
	ph_pair_close(&p);
}

/* The same reset, first seen by the watch for a resume record (the
 * helper's look at an idle connection, or a sleep's): its peek takes the
 * kernel's pending error, which must stay the connection's, not turn into
 * the EPIPE of a later write. */
Test(report, so_error_tells_a_reset_the_record_watch_saw_first)
{
	struct pair p;
	ph_pair_rdma(&p);
	sv_lock(&p.c->lock);
	reset_peer_tcp(&p);
	sv_stream_resume_peek(p.c);
	cr_assert(p.c->fo.tcp_ended, "the watch did not see TCP's end");
	sv_stream_break(p.c, -ECONNRESET);
	sv_unlock(&p.c->lock);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_BROKEN, 10000), SV_CONN_BROKEN);
	int err = -1;
	socklen_t el = sizeof(err);
	cr_assert_eq(getsockopt(p.cfd, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	cr_assert_eq(err, ECONNRESET, "SO_ERROR: %s", strerror(err));
	ph_pair_close(&p);
}

static struct tcp_info tcp_info(int fd)
{
	struct tcp_info ti;
	memset(&ti, 0, sizeof(ti));
	socklen_t len = sizeof(ti);
	cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
	cr_assert_geq(len, offsetof(struct tcp_info, tcpi_notsent_bytes) + sizeof(uint32_t));
	return ti;
}

/* The kernel's sockets saw neither the bytes nor the FINs that went over
 * the QP: TCP_INFO counts the bytes, and its state follows the FINs. */
Test(report, tcp_info_follows_the_bytes_and_fins_over_the_qp)
{
	struct pair p;
	ph_pair_rdma(&p);
	enum { LEN = 5000 };
	uint8_t out[LEN], in[LEN];
	h_pattern(out, LEN, 42, 0);
	cr_assert_eq(ph_write_all(p.cfd, out, LEN), LEN);
	cr_assert_eq(ph_read_all(p.sfd, in, LEN), LEN);
	struct tcp_info c = tcp_info(p.cfd), s = tcp_info(p.sfd);
	cr_assert_eq(c.tcpi_state, ESTABLISHED);
	cr_assert_geq(c.tcpi_bytes_sent, LEN);
	cr_assert_geq(c.tcpi_bytes_acked, LEN);
	cr_assert_geq(s.tcpi_bytes_received, LEN);

	cr_assert_eq(shutdown(p.sfd, SHUT_WR), 0);
	char b;
	cr_assert_eq(read(p.cfd, &b, 1), 0, "the server's FIN");
	cr_assert_eq(tcp_info(p.cfd).tcpi_state, CLOSE_WAIT);
	uint8_t st = tcp_info(p.sfd).tcpi_state;
	cr_assert(st == FIN_WAIT1 || st == FIN_WAIT2, "the server, after its shutdown: %u", st);
	cr_assert_eq(shutdown(p.cfd, SHUT_WR), 0);
	cr_assert_eq(read(p.sfd, &b, 1), 0, "the client's FIN");
	st = tcp_info(p.cfd).tcpi_state;
	cr_assert(st == LAST_ACK || st == CLOSE, "the client, both FINs: %u", st);
	ph_pair_close(&p);
}

/* What a warning on fd 2 reaches: the bytes read at the other end of a
 * socket pair (`sock`) or a pipe put on fd 2 for the call, -1 if none. */
static ssize_t log_reaches(bool sock)
{
	int pair[2]; /* [0]: read here, [1]: fd 2 */
	if (sock)
		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair), 0);
	else
		cr_assert_eq(pipe2(pair, O_NONBLOCK), 0);
	int saved = dup(2);
	cr_assert_geq(saved, 0);
	cr_assert_eq(dup2(pair[1], 2), 2);
	sv_log_write(SV_LOG_WARN, "a warning");
	cr_assert_eq(dup2(saved, 2), 2);
	close(saved);
	char b[256];
	ssize_t n = read(pair[0], b, sizeof(b));
	close(pair[0]);
	close(pair[1]);
	return n;
}

/* An inetd service's stderr is its connection: libsovia's lines would be
 * bytes of the stream. */
Test(report, no_log_line_enters_a_socket_on_stderr)
{
	cr_assert_lt(log_reaches(true), 0, "the warning went into the socket");
	cr_assert_gt(log_reaches(false), 0, "the warning did not reach a pipe on stderr");
}

/* A plain loopback connection, the kernel's alone: *srv is the accepted end. */
static void kernel_pair(int *cli, int *srv)
{
	int ls = SV_REAL(socket)(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	cr_assert_eq(SV_REAL(bind)(ls, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(SV_REAL(listen)(ls, 1), 0);
	cr_assert_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
	*cli = SV_REAL(socket)(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(SV_REAL(connect)(*cli, (struct sockaddr *)&a, sizeof(a)), 0);
	*srv = SV_REAL(accept)(ls, NULL, NULL);
	cr_assert_geq(*srv, 0);
	SV_REAL(close)(ls);
}

static void expect_counts(int fd, uint64_t tx, uint64_t rx)
{
	uint64_t t = ~0ull, r = ~0ull;
	cr_assert_eq(sv_tcp_app_counts(fd, &t, &r), 0);
	cr_assert(t == tx && r == rx, "kernel counts %llu out, %llu in; the application moved "
	          "%llu, %llu", (unsigned long long)t, (unsigned long long)r,
	          (unsigned long long)tx, (unsigned long long)rx);
}

/* What an exec'd image continues from (preload/exec_hand.c): the bytes the
 * application of an accepted socket moved, whoever moved them, with unread
 * bytes queued and unacknowledged bytes in the send queue; past
 * ESTABLISHED the kernel counts the FIN too, and it says so. */
Test(report, kernel_counts_are_what_the_application_moved)
{
	int c, s;
	kernel_pair(&c, &s);
	expect_counts(s, 0, 0);

	static uint8_t buf[600000];
	enum { IN = 70000, READ = 30000 };
	size_t sent = 0;
	while (sent < IN) {
		ssize_t n = SV_REAL(write)(c, buf, IN - sent);
		cr_assert_gt(n, 0);
		sent += (size_t)n;
	}
	size_t got = 0;
	while (got < READ) {
		ssize_t n = SV_REAL(read)(s, buf, READ - got);
		cr_assert_gt(n, 0);
		got += (size_t)n;
	}
	int queued = 0;
	uint64_t until = h_ms() + 10000;
	while ((queued = outq(s, SIOCINQ)) < IN - READ && h_ms() < until)
		usleep(1000);
	cr_assert_eq(queued, IN - READ, "the rest of the bytes wait unread");
	expect_counts(s, 0, READ);

	/* The peer reads nothing: most of what the server writes stays queued. */
	cr_assert_eq(fcntl(s, F_SETFL, O_NONBLOCK), 0);
	size_t out = 0;
	ssize_t n;
	while ((n = SV_REAL(write)(s, buf, sizeof(buf))) > 0)
		out += (size_t)n;
	cr_assert_gt(outq(s, SIOCOUTQ), 0, "bytes wait in the send queue");
	expect_counts(s, out, READ);

	cr_assert_eq(SV_REAL(shutdown)(c, SHUT_WR), 0);
	uint64_t t, r;
	int res;
	until = h_ms() + 10000;
	while ((res = sv_tcp_app_counts(s, &t, &r)) == 0 && h_ms() < until)
		usleep(1000);
	cr_assert_eq(res, -ENOTCONN, "after the peer's FIN the counts are refused");
	SV_REAL(close)(c);
	SV_REAL(close)(s);
}
