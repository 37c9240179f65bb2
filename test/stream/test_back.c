/* The way back (BACK and RETURN): a connection on RDMA becomes plain TCP
 * again with every byte where its reader will look for it. */
#include "harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(back, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* Read n bytes from a plain socket (the kernel's own recv). */
static size_t raw_read_all(int fd, uint8_t *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = recv(fd, buf + got, n - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return got;
}

/* Bytes each side sent and the other did not read yet (some in the
 * peer's receive buffers, some still coalesced) come back and go out on
 * TCP: afterwards the kernel's sockets alone carry the whole stream. The
 * peer's half is answered by its helper thread, its application being
 * idle. */
Test(back, unread_bytes_both_ways_reach_their_readers_over_tcp)
{
	struct pair p;
	h_pair_rdma(&p);
	enum { A = 9000, B = 5000, MORE = 3000 };
	uint8_t out[A + MORE], in[A + MORE];
	h_pattern(out, A, 10, 0);
	cr_assert_eq(h_write_all(p.c, out, A), A);
	h_pattern(out, B, 11, 0);
	cr_assert_eq(h_write_all(p.s, out, B), B);
	/* The client reads a little of what the server sent before going
	 * back: the rest must still come, in order. */
	long end;
	cr_assert_eq(h_read_all(p.c, in, 100, &end), 100);
	cr_assert(h_pattern_ok(in, 100, 11, 0));

	cr_assert_eq(sv_stream_detach(p.c, "test"), 0);
	cr_assert_eq(h_state(p.c), SV_CONN_DETACHED);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_DETACHED, 10000), SV_CONN_DETACHED, "server: %s",
		     sv_conn_state_name(h_state(p.s)));
	cr_assert(sv_stream_kernel_only(p.c) && sv_stream_kernel_only(p.s));

	/* From here the kernel's sockets are the connection. */
	h_pattern(out, MORE, 10, A);
	cr_assert_eq(send(p.cfd, out, MORE, 0), MORE);
	cr_assert_eq(raw_read_all(p.sfd, in, A + MORE), A + MORE);
	cr_assert(h_pattern_ok(in, A + MORE, 10, 0), "the client's stream changed going back");
	cr_assert_eq(raw_read_all(p.cfd, in, B - 100), B - 100);
	cr_assert(h_pattern_ok(in, B - 100, 11, 100), "the server's stream changed going back");

	struct h_counts c = h_counts(p.c), s = h_counts(p.s);
	cr_assert_eq(c.gave_back + s.gave_back, (A + B - 100) - (c.tcp_tx + s.tcp_tx),
		     "gave back %lu+%lu", (unsigned long)c.gave_back, (unsigned long)s.gave_back);
	cr_assert_eq(c.got_back, s.gave_back);
	h_pair_free(&p);
}

/* A connection still on TCP (its upgrade never came: no RDMA listener)
 * has nothing to give back: the way back is immediate. */
Test(back, a_tcp_connection_needs_none)
{
	struct pair p;
	h_listen(&p, false);
	h_connect(&p);
	cr_assert_eq(sv_stream_detach(p.s, "posix_spawn"), 0);
	cr_assert(sv_stream_kernel_only(p.s));
	/* The call that kept it on TCP is named (issue 54, item 3). */
	struct sv_conn_view v;
	sv_stream_view(p.s, &v);
	cr_assert_str_eq(v.fallback, "unsupported-call");
	cr_assert_not_null(v.call, "the view does not name the call");
	cr_assert_str_eq(v.call, "posix_spawn");
	uint8_t b = 7, g = 0;
	cr_assert_eq(send(p.sfd, &b, 1, 0), 1);
	long end;
	cr_assert_eq(h_read_all(p.c, &g, 1, &end), 1);
	cr_assert_eq(g, 7);
	h_pair_free(&p);
}

/* A peer that never answers our BACK (its messages never arrive: a
 * stopped or hostile process) does not hold the connection detaching,
 * with the application's writes held, for ever: after the peer's
 * allowed silence the connection is reset, and a write says so. The
 * silence passes on the library's clock (h_warp_ms). */
struct detacher {
	struct sv_stream *s;
	int r;
};

static void *detach_main(void *arg)
{
	struct detacher *d = arg;
	d->r = sv_stream_detach(d->s, "test");
	return NULL;
}

Test(back, a_peer_that_never_answers_is_given_up)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t out[1000];
	h_pattern(out, sizeof(out), 12, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	long end;
	cr_assert_eq(h_read_all(p.s, out, sizeof(out), &end), sizeof(out));
	fake_net_hold(FAKE_SERVER);
	uint64_t t0 = h_now_ms();
	/* The detach waits for the peer's BACK until the upgrade's deadline
	 * (5 s): in a thread, so that the clock moves past it too. */
	struct detacher d = {.s = p.c};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, detach_main, &d), 0);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_DETACHING, 10000), SV_CONN_DETACHING,
		     "our BACK never went: %s", sv_conn_state_name(h_state(p.c)));
	/* Just short of the allowed silence: the detach gives up waiting,
	 * the connection still waits for the peer. */
	h_warp_ms(59000 - (h_now_ms() - t0));
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_neq(d.r, 0, "detached without the peer's BACK");
	h_helper_round();
	cr_assert_eq(h_state(p.c), SV_CONN_DETACHING, "given up before the allowed silence (%s)",
		     sv_conn_state_name(h_state(p.c)));
	/* Past it. */
	h_warp_ms(2000);
	enum sv_conn_state st = h_wait_state(p.c, SV_CONN_BROKEN, 10000);
	cr_assert_eq(st, SV_CONN_BROKEN, "still %s after %llu ms", sv_conn_state_name(st),
		     (unsigned long long)(h_now_ms() - t0));
	cr_assert_geq(h_now_ms() - t0, 59000, "given up before the allowed silence");
	cr_assert_lt(h_write(p.c, out, 10, 0), 0, "a write on the reset connection succeeded");
	h_pair_free(&p);
}
