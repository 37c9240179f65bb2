/* A client holds its writes after its TO_RDMA until the server proves it is
 * the TCP peer (docs/protocol.md, section 3, step 4). Whenever that proof
 * can no longer come, the hold must end at once and the writes go on TCP,
 * every byte once and in order: a failed check of the server's switch, and
 * a server whose sending finished on TCP before the switch. */
#include "harness.h"

#include "config.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(held, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* Wait (bounded) until n sends are held in flight on the fake network. */
static void wait_in_flight(unsigned n)
{
	uint64_t until = h_ms() + 10000;
	while (fake_net_in_flight() < n && h_ms() < until)
		usleep(1000);
	cr_assert_geq(fake_net_in_flight(), n, "the client's TO_RDMA was never sent");
}

/* Wait (bounded) until the kernel has the peer's FIN on fd (after both
 * FINs Linux hands the connection to a time-wait socket: CLOSE). */
static void wait_peer_fin(int fd)
{
	uint64_t until = h_ms() + 10000;
	for (;;) {
		struct tcp_info ti;
		socklen_t tl = sizeof(ti);
		cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl), 0);
		if (ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_TIME_WAIT ||
		    ti.tcpi_state == TCP_CLOSING || ti.tcpi_state == TCP_LAST_ACK ||
		    ti.tcpi_state == TCP_CLOSE)
			return;
		cr_assert_lt(h_ms(), until, "the peer's FIN never came (TCP state %u)",
			     (unsigned)ti.tcpi_state);
		usleep(1000);
	}
}

static enum sv_medium tx_medium(struct sv_stream *s)
{
	sv_lock(&s->lock);
	enum sv_medium m = sv_stream_tx_medium(s);
	sv_unlock(&s->lock);
	return m;
}

/* Two streams on a TCP connection, their upgrade not started: the test
 * acts first. The upgrade's deadline lies beyond the test's own: a hold
 * that waited for it fails the test rather than pass slowly. */
static void streams(struct pair *p, enum fake_side held)
{
	sv_cfg.upgrade_timeout_ms = 600000;
	fake_net_hold(held);
	h_listen(p, true);
	h_connect_sockets(p);
	p->c = sv_stream_new(p->cfd, true);
	p->s = sv_stream_new(p->sfd, false);
}

static void start(struct pair *p)
{
	h_start_server(p->s, p->l);
	sv_stream_start_client(p->c);
}

/* The client stays on TCP for the reason fb, and writes no longer wait. */
static void client_on_tcp(struct pair *p, enum sv_fallback fb)
{
	cr_assert_eq(h_wait_state(p->c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(p->c)));
	cr_assert_eq(h_fallback(p->c), fb, "fallback=%s", sv_fallback_name(h_fallback(p->c)));
	cr_assert_neq(tx_medium(p->c), SV_MEDIUM_HELD, "the client's writes are still held");
}

/* The server reads n bytes of pattern seed, then TCP's end. */
static void server_reads(struct pair *p, size_t n, uint64_t seed)
{
	uint8_t in[8000];
	long end;
	cr_assert_leq(n, sizeof(in));
	cr_assert_eq(h_read_all(p->s, in, n, &end), n, "server: end %ld", end);
	cr_assert(h_pattern_ok(in, n, seed, 0), "the server read other bytes");
	cr_assert_eq(h_read_all(p->s, in, 1, &end), 0);
	cr_assert_eq(end, 0, "the server's end: %ld", end);
}

/* How the server's switch fails the client's check. */
enum bad_switch {
	WRONG_ECHO,   /* the bytes after its switch point are not our challenge */
	POINT_BEYOND, /* its switch point lies further ahead than TCP can hold */
};

ParameterizedTestParameters(held, a_failed_check_sends_the_client_back_to_tcp)
{
	static enum bad_switch how[] = {WRONG_ECHO, POINT_BEYOND};
	return cr_make_param_array(enum bad_switch, how, 2);
}

/* The server's switch fails the client's check: the client resets the QP
 * and stays on TCP ("challenge-failed"). Its writes, held since its
 * TO_RDMA, go on TCP at once: the server's application reads the client's
 * bytes from before the switch and after it, each once, in order, and
 * nothing of the client's went over the QP; its shutdown ends TCP. What
 * the client took for an echo is the TCP peer's data, and reaches its
 * application first. */
ParameterizedTest(enum bad_switch *how, held, a_failed_check_sends_the_client_back_to_tcp)
{
	struct pair p;
	streams(&p, FAKE_CLIENT); /* its TO_RDMA, and so its echo, wait */
	uint8_t out[6000];
	h_pattern(out, sizeof(out), 40, 0);
	const size_t before = 2500;
	cr_assert_eq(h_write_all(p.c, out, before), (long)before); /* TCP: no QP yet */
	if (*how == POINT_BEYOND) {
		sv_lock(&p.s->lock);
		p.s->tcp_tx = UINT64_MAX - 1000; /* the server's TO_RDMA names it */
		sv_unlock(&p.s->lock);
	}
	start(&p);
	wait_in_flight(1);
	/* The bytes the server will write after its switch point. */
	uint8_t echo[SV_CHALLENGE_SIZE];
	sv_lock(&p.s->lock);
	if (*how == WRONG_ECHO)
		p.s->sw.peer_challenge[3] ^= 0x5a;
	memcpy(echo, p.s->sw.peer_challenge, sizeof(echo));
	sv_unlock(&p.s->lock);
	fake_net_release();

	client_on_tcp(&p, SV_FB_CHALLENGE);
	/* Not even a moment's wait: the write goes on TCP now. */
	long w = h_write(p.c, out + before, sizeof(out) - before, MSG_DONTWAIT);
	cr_assert_eq(w, (long)(sizeof(out) - before), "the client's write: %ld", w);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	server_reads(&p, sizeof(out), 40);
	cr_assert_eq(h_counts(p.c).rdma_tx, 0, "the client's bytes went over the QP");
	if (*how == WRONG_ECHO) {
		/* (A point beyond fails before the server's echo, which its
		 * server may or may not write before the RESET reaches it.) */
		uint8_t got[SV_CHALLENGE_SIZE];
		long end;
		cr_assert_eq(h_read_all(p.c, got, sizeof(got), &end), sizeof(got),
			     "client: end %ld", end);
		cr_assert_eq(memcmp(got, echo, sizeof(got)), 0, "the client read other bytes");
	}
	h_pair_free(&p);
}

/* The client shut its sending down while it was held (its FIN went over
 * the QP), then the server's switch failed its check: TCP carries the end
 * of the client's stream, right after the bytes before its switch. */
Test(held, a_failed_check_after_a_shutdown_ends_tcp)
{
	struct pair p;
	streams(&p, FAKE_CLIENT);
	uint8_t out[1000];
	h_pattern(out, sizeof(out), 41, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	start(&p);
	wait_in_flight(1);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	sv_lock(&p.s->lock);
	p.s->sw.peer_challenge[0] ^= 0x5a;
	sv_unlock(&p.s->lock);
	fake_net_release();
	client_on_tcp(&p, SV_FB_CHALLENGE);
	wait_peer_fin(p.sfd); /* the client's FIN, on TCP */
	server_reads(&p, sizeof(out), 41);
	cr_assert_eq(h_write(p.c, "x", 1, MSG_DONTWAIT), -EPIPE);
	h_pair_free(&p);
}

/* When the server's sending finished on TCP: before the client's QP came
 * up, or while the client's TO_RDMA was on its way. */
enum server_end { FIN_BEFORE_QP, FIN_WHILE_SWITCHING };

ParameterizedTestParameters(held, a_server_done_on_tcp_does_not_hold_the_client)
{
	static enum server_end when[] = {FIN_BEFORE_QP, FIN_WHILE_SWITCHING};
	return cr_make_param_array(enum server_end, when, 2);
}

/* A server that wrote everything and shut its sending down on TCP (`nc -N
 * -l` serving a small file) can never write its echo after TCP's FIN. The
 * client, whose application has not read the file yet, must not hold its
 * writes for the upgrade's deadline: it stays on TCP ("shut down before
 * the upgrade"), its bytes reach the server, and it reads the file and
 * TCP's end. A FIN that came before the client's QP did: no switch
 * begins at all. */
ParameterizedTest(enum server_end *when, held, a_server_done_on_tcp_does_not_hold_the_client)
{
	struct pair p;
	streams(&p, *when == FIN_WHILE_SWITCHING ? FAKE_CLIENT : FAKE_NONE);
	uint8_t file[3000], out[4000], in[3000];
	h_pattern(file, sizeof(file), 42, 0);
	h_pattern(out, sizeof(out), 43, 0);
	if (*when == FIN_WHILE_SWITCHING) {
		start(&p);
		wait_in_flight(1); /* the client's TO_RDMA: its writes are held */
	}
	cr_assert_eq(h_write_all(p.s, file, sizeof(file)), (long)sizeof(file));
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	wait_peer_fin(p.cfd);
	if (*when == FIN_BEFORE_QP)
		start(&p);
	else
		fake_net_release();
	client_on_tcp(&p, SV_FB_SHUTDOWN);
	if (*when == FIN_BEFORE_QP)
		cr_assert_eq(fake_net_delivered(), 0, "a switch began: nothing in-band was due");
	long w = h_write(p.c, out, sizeof(out), MSG_DONTWAIT);
	cr_assert_eq(w, (long)sizeof(out), "the client's write: %ld", w);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	server_reads(&p, sizeof(out), 43);
	long end;
	cr_assert_eq(h_read_all(p.c, in, sizeof(in), &end), sizeof(in), "client: end %ld", end);
	cr_assert(h_pattern_ok(in, sizeof(in), 42, 0), "the client read other bytes");
	cr_assert_eq(h_read_all(p.c, in, 1, &end), 0);
	cr_assert_eq(end, 0);
	struct h_counts c = h_counts(p.c), s = h_counts(p.s);
	cr_assert_eq(c.rdma_tx + s.rdma_tx, 0, "bytes went over the QP");
	h_pair_free(&p);
}

/* Both ends finish around the switch (`nc -N` against `nc -N -l`): the
 * client shut its sending down while held (its FIN went over the QP), the
 * server had finished on TCP. The client's sending ends on TCP too, no
 * TO_TCP after its FIN, and neither end is reset: each reads the other's
 * bytes and the end. */
Test(held, a_client_shut_down_while_held_by_a_server_done_on_tcp)
{
	struct pair p;
	streams(&p, FAKE_CLIENT);
	uint8_t file[3000], out[2000], in[3000];
	h_pattern(file, sizeof(file), 44, 0);
	h_pattern(out, sizeof(out), 45, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	start(&p);
	wait_in_flight(1);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	cr_assert_eq(h_write_all(p.s, file, sizeof(file)), (long)sizeof(file));
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	wait_peer_fin(p.cfd);
	fake_net_release();
	client_on_tcp(&p, SV_FB_SHUTDOWN);
	wait_peer_fin(p.sfd); /* the client's FIN, on TCP */
	server_reads(&p, sizeof(out), 45);
	long end;
	cr_assert_eq(h_read_all(p.c, in, sizeof(in), &end), sizeof(in), "client: end %ld", end);
	cr_assert(h_pattern_ok(in, sizeof(in), 44, 0), "the client read other bytes");
	cr_assert_eq(h_read_all(p.c, in, 1, &end), 0);
	cr_assert_eq(end, 0, "the client's end: %ld", end);
	h_pair_free(&p);
}

/* A rogue that answers the client's TO_RDMA at once: its switch fails the
 * client's check (here its point lies behind what TCP delivered) before
 * the client's own TO_RDMA completed, so the client's echo was never
 * written, and never will be. Nothing waits for it: the client's bytes
 * and its TCP FIN reach the TCP peer, which reads exactly what the
 * client's application wrote. */
Test(held, a_failed_check_before_our_echo_leaves_nothing_owed)
{
	struct pair p;
	streams(&p, FAKE_CLIENT); /* its TO_RDMA stays in flight */
	uint8_t out[3000], in[100];
	h_pattern(out, sizeof(out), 46, 0);
	h_pattern(in, sizeof(in), 47, 0);
	cr_assert_eq(h_write_all(p.s, in, sizeof(in)), (long)sizeof(in));
	long end;
	cr_assert_eq(h_read_all(p.c, in, sizeof(in), &end), sizeof(in)); /* TCP: 100 read */
	cr_assert_eq(h_write_all(p.c, out, 1000), 1000);
	start(&p);
	wait_in_flight(1);
	/* The "server" switches at 0: behind the 100 bytes the client read. */
	sv_lock(&p.s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	cr_assert_eq(sv_proto_send_to_rdma(p.s->proto, 0, &clk), 0);
	sv_unlock(&p.s->lock);
	client_on_tcp(&p, SV_FB_CHALLENGE);
	long w = h_write(p.c, out + 1000, sizeof(out) - 1000, MSG_DONTWAIT);
	cr_assert_eq(w, (long)(sizeof(out) - 1000), "the client's write: %ld", w);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	wait_peer_fin(p.sfd);
	server_reads(&p, sizeof(out), 46);
	h_pair_free(&p);
}
