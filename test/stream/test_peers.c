/* A known peer's first bytes (peers.h): a connection whose peer's host took
 * connections to RDMA before holds its first writes for its QP, within
 * SOVIA_PEER_HOLD_MS, so that all its bytes go over RDMA; an unknown peer
 * never waits. Each test runs in its own process: its peer table is its own
 * and starts empty (h_setup). */
#include "config.h"
#include "harness.h"
#include "peers.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(peers, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* The table says 127.0.0.1 took a connection to RDMA in `took` us. */
static void know_loopback_took(uint32_t took)
{
	struct sockaddr_storage ss = {0};
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sv_peers_learn(&ss, true, took);
	uint32_t setup;
	cr_assert(sv_peers_expect(&ss, true, &setup) && setup == took, "the table lost it");
}

/* ... in 1 ms. */
static void know_loopback(void)
{
	know_loopback_took(1000);
}

/* Would poll() say the stream is writable? Each direction is judged by
 * libsovia or by the kernel, as the interposer's poll does. */
static bool writable(struct sv_stream *s, int fd)
{
	short own, kernel;
	uint64_t gen;
	sv_stream_poll_split(s, POLLOUT, &own, &kernel, &gen);
	if (!(kernel & POLLOUT))
		return own & POLLOUT;
	struct pollfd pf = {.fd = fd, .events = POLLOUT};
	return poll(&pf, 1, 0) == 1 && (pf.revents & POLLOUT);
}

#define N (256u * 1024u)

/* A listener with an RDMA side, and a non-blocking connect() to it from
 * p->cfd: its result (0, or -1 with errno), the address in *a. */
static int connect_nonblocking(struct pair *p, struct sockaddr_in *a)
{
	h_listen(p, true);
	socklen_t al = sizeof(*a);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)a, &al), 0);
	p->cfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	return connect(p->cfd, (struct sockaddr *)a, sizeof(*a));
}

/* Both ends write at once, while this process's rdma_cm is still starting:
 * each end's writes wait, then every byte goes over the QP. */
Test(peers, a_known_peer_gets_its_first_bytes_over_rdma)
{
	know_loopback();
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	uint8_t b = 7;
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), -EAGAIN, "the client's write went on TCP");
	cr_assert_eq(h_write(p.s, &b, 1, MSG_DONTWAIT), -EAGAIN, "the server's write went on TCP");
	cr_assert(!writable(p.c, p.cfd));
	cr_assert(!writable(p.s, p.sfd));
	struct h_writer wc = {.s = p.c, .len = N, .seed = 1}, ws = {.s = p.s, .len = N, .seed = 2};
	h_writer_start(&wc);
	h_writer_start(&ws);
	fake_net_start_now();
	uint8_t *got = malloc(N);
	long end;
	cr_assert_eq(h_read_all(p.s, got, N, &end), N);
	cr_assert(h_pattern_ok(got, N, 1, 0));
	cr_assert_eq(h_read_all(p.c, got, N, &end), N);
	cr_assert(h_pattern_ok(got, N, 2, 0));
	h_writer_join(&wc);
	h_writer_join(&ws);
	cr_assert_eq(wc.written, N);
	cr_assert_eq(ws.written, N);
	struct h_counts c = h_counts(p.c), s = h_counts(p.s);
	cr_assert_eq(c.tcp_tx, 0, "client: %llu bytes on TCP", (unsigned long long)c.tcp_tx);
	cr_assert_eq(s.tcp_tx, 0, "server: %llu bytes on TCP", (unsigned long long)s.tcp_tx);
	cr_assert_eq(c.rdma_tx, N);
	cr_assert_eq(s.rdma_tx, N);
	cr_assert_gt(p.c->st.to_rdma_us, 0, "the time to RDMA was not taken");
	cr_assert_gt(p.s->st.to_rdma_us, 0, "the time to RDMA was not taken");
	free(got);
	h_pair_free(&p);
}

/* A first contact: the bytes go on TCP at once, whatever the upgrade does;
 * once on RDMA, the table knows the peer. */
Test(peers, an_unknown_peer_never_waits)
{
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	uint8_t b = 7;
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), 1);
	cr_assert_eq(h_write(p.s, &b, 1, MSG_DONTWAIT), 1);
	cr_assert(writable(p.c, p.cfd));
	uint32_t setup;
	cr_assert(!sv_peers_expect(&p.c->tuple.peer, true, &setup));
	fake_net_start_now();
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert(sv_peers_expect(&p.c->tuple.peer, true, &setup), "not learnt");
	cr_assert(sv_peers_expect(&p.s->tuple.peer, false, &setup), "not learnt");
	cr_assert_eq(h_counts(p.c).tcp_tx, 1);
	cr_assert_eq(h_counts(p.s).tcp_tx, 1);
	h_pair_free(&p);
}

/* A server's first contact with a client on an RDMA link: its answer
 * waits for the client's request (a client asks once its rdma_cm started),
 * and every byte of it goes over the QP; the host is then known. */
Test(peers, a_first_contact_on_an_rdma_link_answers_over_rdma)
{
	fake_net_rdma_links(true);
	sv_cfg.peer_hold_ms = 60000;
	sv_peers_note_startup(10000000); /* only the switch ends the hold */
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	uint8_t b = 7, g;
	long end;
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), 1, "the client held its request");
	cr_assert_eq(h_read_all(p.s, &g, 1, &end), 1);
	cr_assert_eq(h_write(p.s, &b, 1, MSG_DONTWAIT), -EAGAIN, "the answer went on TCP");
	struct h_writer ws = {.s = p.s, .len = N, .seed = 2};
	h_writer_start(&ws);
	fake_net_start_now();
	uint8_t *got = malloc(N);
	cr_assert_eq(h_read_all(p.c, got, N, &end), N);
	cr_assert(h_pattern_ok(got, N, 2, 0));
	h_writer_join(&ws);
	cr_assert_eq(ws.written, N);
	struct h_counts s = h_counts(p.s);
	cr_assert_eq(s.tcp_tx, 0, "server: %llu bytes on TCP", (unsigned long long)s.tcp_tx);
	cr_assert_eq(s.rdma_tx, N);
	cr_assert(!sv_peers_first_contact(&p.s->tuple.peer), "the host was not learnt");
	free(got);
	h_pair_free(&p);
}

/* A plain client on an RDMA link: the server's first answer waits out the
 * hold once, then goes on TCP; the host is marked, and the next connection
 * from it does not wait. Off the RDMA links nothing waits at all
 * (an_unknown_peer_never_waits). */
Test(peers, a_plain_client_on_an_rdma_link_is_held_once)
{
	fake_net_rdma_links(true);
	sv_peers_note_startup(1); /* a hold of 50 ms */
	struct pair p;
	h_listen(&p, true);
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p.lfd, (struct sockaddr *)&a, &al), 0);
	for (int round = 0; round < 2; round++) {
		int cfd = socket(AF_INET, SOCK_STREAM, 0);
		cr_assert_eq(connect(cfd, (struct sockaddr *)&a, sizeof(a)), 0);
		int sfd = accept(p.lfd, NULL, NULL);
		cr_assert_geq(sfd, 0);
		struct sv_stream *s = sv_stream_new(sfd, false);
		h_start_server(s, p.l);
		uint8_t b = 7, g = 0;
		long w = h_write(s, &b, 1, MSG_DONTWAIT);
		if (round == 0) {
			cr_assert_eq(w, -EAGAIN, "a first contact on an RDMA link did not hold");
			cr_assert_eq(h_write(s, &b, 1, 0), 1, "the held answer never went");
		} else {
			cr_assert_eq(w, 1, "a known plain client was held again");
		}
		cr_assert_eq(h_counts(s).tcp_tx, 1);
		cr_assert_eq(read(cfd, &g, 1), 1);
		cr_assert_eq(g, 7);
		cr_assert(!sv_peers_first_contact(&s->tuple.peer), "the plain client was not marked");
		sv_stream_put(s);
		close(cfd);
	}
	h_pair_free(&p);
}

/* The QP does not come in time: the held writes go on TCP when the hold is
 * over, and a non-blocking writer is told it may write. */
Test(peers, a_hold_ends_on_time)
{
	know_loopback();
	sv_cfg.peer_hold_ms = 100;
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	uint8_t b = 7;
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), -EAGAIN);
	/* A blocking write waits out the hold, then goes on TCP (small
	 * enough for the socket buffers: nobody reads yet). */
	enum { M = 16384 };
	uint8_t *got = malloc(M), *out = malloc(M);
	h_pattern(out, M, 2, 0);
	cr_assert_eq(h_write(p.s, out, M, 0), M, "the server's held write never went");
	cr_assert_eq(h_counts(p.s).tcp_tx, M);
	long end;
	cr_assert_eq(h_read_all(p.c, got, M, &end), M);
	cr_assert(h_pattern_ok(got, M, 2, 0));
	uint64_t until = h_ms() + 10000;
	while (!writable(p.c, p.cfd) && h_ms() < until)
		usleep(1000);
	cr_assert(writable(p.c, p.cfd), "the hold's end did not make the client writable");
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), 1);
	fake_net_start_now(); /* the upgrade goes on afterwards */
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	free(got);
	free(out);
	h_pair_free(&p);
}

/* This process's rdma_cm starts for longer than the hold would last (a
 * fresh process: no RDMA listener, no route of ours yet): the hold counts
 * from when it is ready, so the first bytes still go over the QP. */
Test(peers, a_hold_counts_from_when_rdma_cm_is_ready)
{
	know_loopback_took(250000); /* a hold of 1,050 ms */
	sv_cfg.peer_hold_ms = 30000;
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	struct h_writer w = {.s = p.c, .len = N, .seed = 3};
	h_writer_start(&w);
	cr_assert(h_wait_asleep(p.c, 10000), "the writer did not wait for the hold");
	/* Past the hold had it counted from the connect. */
	h_warp_sleeper_ms(1500, p.c);
	cr_assert_eq(h_counts(p.c).tcp_tx, 0, "the hold ended while rdma_cm was starting");
	fake_net_start_now();
	uint8_t *got = malloc(N);
	long end;
	cr_assert_eq(h_read_all(p.s, got, N, &end), N);
	cr_assert(h_pattern_ok(got, N, 3, 0));
	h_writer_join(&w);
	cr_assert_eq(w.written, N);
	cr_assert_eq(h_counts(p.c).tcp_tx, 0, "client: %llu bytes on TCP",
		     (unsigned long long)h_counts(p.c).tcp_tx);
	cr_assert_eq(h_counts(p.c).rdma_tx, N);
	free(got);
	h_pair_free(&p);
}

/* A plain server on a host that speaks libsovia: the client learns that
 * port, and its next connection there holds nothing. */
Test(peers, a_plain_port_on_a_known_host_is_remembered)
{
	know_loopback();
	struct pair p;
	h_listen(&p, false);
	h_connect(&p);
	uint8_t b = 7, g;
	long end;
	cr_assert_eq(h_write_all(p.c, &b, 1), 1);
	cr_assert_eq(h_read_all(p.s, &g, 1, &end), 1);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.c), SV_FB_REJECTED);
	uint32_t setup;
	cr_assert(!sv_peers_expect(&p.c->tuple.peer, true, &setup), "the plain port was not kept");
	struct sockaddr_storage other = p.c->tuple.peer;
	((struct sockaddr_in *)&other)->sin_port ^= htons(1);
	cr_assert(sv_peers_expect(&other, true, &setup), "the host was forgotten");
	h_pair_free(&p);
}

/* A non-blocking connect to a known peer: its writes wait from the start
 * (the address asked for names the peer before the kernel does), and its
 * bytes all go over the QP. */
Test(peers, a_non_blocking_connect_to_a_known_peer_holds_from_the_start)
{
	know_loopback();
	fake_net_slow_start();
	struct pair p;
	struct sockaddr_in a;
	int r = connect_nonblocking(&p, &a);
	cr_assert(r == 0 || errno == EINPROGRESS);
	p.c = sv_stream_new(p.cfd, true);
	if (r == 0)
		sv_stream_start_client(p.c);
	else
		sv_stream_start_connecting(p.c, (struct sockaddr *)&a, sizeof(a));
	p.sfd = accept(p.lfd, NULL, NULL);
	p.s = sv_stream_new(p.sfd, false);
	h_start_server(p.s, p.l);
	uint8_t b[3] = {1, 2, 3}, g[3];
	cr_assert_eq(h_write(p.c, b, 3, MSG_DONTWAIT), -EAGAIN, "the write went on TCP");
	fake_net_start_now();
	uint64_t until = h_ms() + 10000;
	long w;
	while ((w = h_write(p.c, b, 3, MSG_DONTWAIT)) == -EAGAIN && h_ms() < until)
		usleep(1000);
	cr_assert_eq(w, 3);
	long end;
	cr_assert_eq(h_read_all(p.s, g, 3, &end), 3);
	cr_assert_eq(memcmp(b, g, 3), 0);
	cr_assert_eq(h_counts(p.c).tcp_tx, 0);
	cr_assert_eq(h_counts(p.c).rdma_tx, 3);
	h_pair_free(&p);
}

/* A server whose accept() waits for the client's first bytes
 * (TCP_DEFER_ACCEPT): a held client would wait out its hold, and its
 * request could match nothing. The server's libsovia tells it to write
 * first: the bytes go on TCP, the accept returns, the next request gets
 * the connection to RDMA. */
Test(peers, a_server_that_accepts_on_data_gets_the_first_bytes_on_tcp)
{
	know_loopback_took(100000000);
	sv_cfg.peer_hold_ms = 60000; /* only the server's answer can end it */
	struct pair p;
	h_listen(&p, true);
	int secs = 30;
	cr_assert_eq(setsockopt(p.lfd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &secs, sizeof(secs)), 0);
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p.lfd, (struct sockaddr *)&a, &al), 0);
	p.cfd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(p.cfd, (struct sockaddr *)&a, sizeof(a)), 0);
	p.c = sv_stream_new(p.cfd, true);
	sv_stream_start_client(p.c);
	uint8_t b[3] = {1, 2, 3}, g[3];
	cr_assert_eq(h_write(p.c, b, 3, 0), 3); /* held until the server's answer */
	p.sfd = accept(p.lfd, NULL, NULL);
	cr_assert_geq(p.sfd, 0);
	p.s = sv_stream_new(p.sfd, false);
	h_start_server(p.s, p.l);
	long end;
	cr_assert_eq(h_read_all(p.s, g, 3, &end), 3);
	cr_assert_eq(memcmp(b, g, 3), 0);
	cr_assert_eq(h_counts(p.c).tcp_tx, 3);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(h_write_all(p.c, b, 3), 3);
	cr_assert_eq(h_read_all(p.s, g, 3, &end), 3);
	cr_assert_eq(h_counts(p.c).rdma_tx, 3);
	h_pair_free(&p);
}

/* A program that polls for POLLOUT to learn that its connect completed
 * (tnftp does) is told so by the kernel while its first writes are held:
 * only a write that was refused makes poll say "not writable". */
Test(peers, a_held_connection_is_writable_until_a_write_is_refused)
{
	know_loopback_took(100000000);
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert(writable(p.c, p.cfd), "the connect's completion was not told");
	uint8_t b = 7;
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), -EAGAIN);
	cr_assert(!writable(p.c, p.cfd), "a held stream said writable after a refused write");
	fake_net_start_now();
	uint64_t until = h_ms() + 10000;
	while (!writable(p.c, p.cfd) && h_ms() < until)
		usleep(1000);
	cr_assert_eq(h_write(p.c, &b, 1, MSG_DONTWAIT), 1);
	cr_assert_eq(h_counts(p.c).tcp_tx, 0);
	h_pair_free(&p);
}

/* A non-blocking connect whose connection carried its bytes and ended
 * while this process's rdma_cm was still starting: the kernel names no
 * peer for it any more. That is no sign of a missing RDMA route, and the
 * host must not be remembered as one (later connections would skip
 * RDMA for a minute). */
Test(peers, a_connection_that_ended_before_its_upgrade_is_no_missing_route)
{
	fake_net_slow_start();
	struct pair p;
	struct sockaddr_in a;
	int r = connect_nonblocking(&p, &a);
	cr_assert(r < 0 && errno == EINPROGRESS, "a loopback connect completed at once");
	p.c = sv_stream_new(p.cfd, true);
	sv_stream_start_connecting(p.c, (struct sockaddr *)&a, sizeof(a));
	p.sfd = accept(p.lfd, NULL, NULL);
	cr_assert_geq(p.sfd, 0);
	uint8_t b = 7, g = 0;
	cr_assert_eq(h_write(p.c, &b, 1, 0), 1);
	cr_assert_eq(shutdown(p.cfd, SHUT_WR), 0);
	cr_assert_eq(read(p.sfd, &g, 1), 1);
	cr_assert_eq(g, 7);
	cr_assert_eq(close(p.sfd), 0);
	p.sfd = -1;
	/* Both FINs: the client's socket is closed in the kernel's eyes. */
	struct sockaddr_storage peer;
	socklen_t pl = sizeof(peer);
	uint64_t until = h_ms() + 10000;
	while (getpeername(p.cfd, (struct sockaddr *)&peer, &pl) == 0 && h_ms() < until) {
		usleep(1000);
		pl = sizeof(peer);
	}
	cr_assert_eq(errno, ENOTCONN);
	fake_net_start_now();
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.c), SV_FB_SHUTDOWN, "fallback=%s",
		     sv_fallback_name(h_fallback(p.c)));
	struct sockaddr_storage ss = {0};
	memcpy(&ss, &a, sizeof(a));
	cr_assert_not(sv_peers_plain(&ss), "the host is remembered as having no RDMA route");
	h_pair_free(&p);
}
