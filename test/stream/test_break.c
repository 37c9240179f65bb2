/* The QP breaks at a random point of a transfer in both directions, on
 * RDMA: after a random number of delivered messages, or with one side's
 * last few messages in flight (lost). Either every byte arrives (the
 * connection goes on over TCP), or the reader is told: what it read is
 * always the stream's beginning, never changed, and a short stream never
 * ends in a clean EOF. Nothing hangs. */
#include "harness.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(qp_break, .init = h_setup, .fini = h_teardown, .timeout = 60);

struct break_case {
	unsigned seed;
	long after;           /* messages delivered before the break */
	enum fake_side held;  /* instead: this side's messages stay in flight,
			       * and the break comes with `after` of them */
};

ParameterizedTestParameters(qp_break, at_a_random_point)
{
	static struct break_case cases[16];
	for (unsigned i = 0; i < 16; i++) {
		srand(1000 + i);
		cases[i].seed = 1000 + i;
		cases[i].held = i % 4 == 3 ? FAKE_CLIENT : i % 4 == 2 ? FAKE_SERVER : FAKE_NONE;
		/* The whole transfer takes some 260 messages; a side's window
		 * lets 3 of its messages be in flight at least. */
		cases[i].after = cases[i].held == FAKE_NONE ? 1 + rand() % 200 : 1 + rand() % 3;
	}
	return cr_make_param_array(struct break_case, cases, 16);
}

/* One end as an application: a writer thread, and a reader that reads
 * the peer's stream to its end; then, once its writer is done, it closes
 * (an error ends the connection with a reset, as TCP's abort). */
struct side {
	struct sv_stream *s;
	int fd;
	size_t len, got;
	uint64_t seed; /* of the stream it reads */
	long end;      /* EOF 0, or the error */
	bool bad;      /* the bytes read differ from the peer's */
	size_t bad_at;
	struct h_writer w;
	pthread_t t;
};

static void *side_main(void *arg)
{
	struct side *d = arg;
	uint8_t *buf = malloc(d->len);
	d->got = h_read_all(d->s, buf, d->len, &d->end);
	if (d->got == d->len && d->end == 1) {
		uint8_t x; /* the end: EOF, or the error that ended the stream */
		d->end = h_read(d->s, &x, 1, 0);
	}
	for (d->bad_at = 0; d->bad_at < d->got; d->bad_at++)
		if (!h_pattern_ok(buf + d->bad_at, 1, d->seed, d->bad_at))
			break;
	d->bad = d->bad_at < d->got;
	free(buf);
	h_writer_join(&d->w);
	sv_stream_close(d->s, d->fd);
	return NULL;
}

static void side_start(struct side *d, struct sv_stream *s, int fd, uint64_t wseed,
		       uint64_t rseed, size_t len)
{
	*d = (struct side){.s = s, .fd = fd, .len = len, .seed = rseed};
	d->w = (struct h_writer){.s = s, .fd = fd, .len = len, .seed = wseed};
	h_writer_start(&d->w);
	cr_assert_eq(pthread_create(&d->t, NULL, side_main, d), 0);
}

/* Did a call of this end fail? (The connection's error is reported once,
 * as the kernel reports a socket's: to whichever call comes first.) */
static bool told(const struct side *d)
{
	return d->end < 0 || d->w.written < (long)d->w.len || d->w.end < 0;
}

/* What `r` read of the stream `w` wrote is its beginning, unchanged; a
 * short stream means an end was told: never silent. */
static void judge(const struct break_case *bc, const struct side *r, const struct side *w,
		  const char *dir)
{
	cr_assert(!r->bad, "seed %u %s: byte %zu of %zu read differs from the one written",
		  bc->seed, dir, r->bad_at, r->got);
	if (r->got == r->len) {
		cr_assert_eq(r->end, 0, "seed %u %s: all bytes, then %ld instead of EOF", bc->seed,
			     dir, r->end);
		return;
	}
	cr_assert(told(r) || told(w), "seed %u %s: %zu of %zu bytes, then a clean end, and no "
		  "call of either end failed: bytes lost silently", bc->seed, dir, r->got, r->len);
}

ParameterizedTest(struct break_case *bc, qp_break, at_a_random_point)
{
	struct pair p;
	h_pair_rdma(&p);
	uint64_t delivered = fake_net_delivered();
	if (bc->held != FAKE_NONE)
		fake_net_hold(bc->held);
	else
		fake_net_break_after(bc->after);
	enum { N = 400000 };
	struct side c, s;
	side_start(&c, p.c, p.cfd, bc->seed, bc->seed + 1, N);
	side_start(&s, p.s, p.sfd, bc->seed + 1, bc->seed, N);
	if (bc->held != FAKE_NONE) {
		uint64_t until = h_ms() + 10000;
		while (fake_net_in_flight() < (unsigned)bc->after && h_ms() < until)
			usleep(100);
		cr_assert_geq(fake_net_in_flight(), (unsigned)bc->after,
			      "seed %u: the held side sent nothing", bc->seed);
		fake_net_break_all(); /* what is in flight is lost */
	}
	pthread_join(c.t, NULL);
	pthread_join(s.t, NULL);
	if (bc->held == FAKE_NONE)
		cr_assert_geq(fake_net_delivered() - delivered, (uint64_t)bc->after,
			      "seed %u: the transfer ended before the break", bc->seed);
	judge(bc, &s, &c, "client to server");
	judge(bc, &c, &s, "server to client");
	h_pair_free(&p);
}

/* The peer shut its sending down (its FIN came over the QP), then the QP
 * ends while ours is still open, a corked write waiting in the coalescing
 * buffer: that is no close of the peer, which may still read. Our sending
 * goes on over TCP, the waiting bytes first; the peer reads every byte. */
Test(qp_break, after_the_peers_fin_our_sending_goes_on_over_tcp)
{
	struct pair p;
	h_pair_rdma(&p);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	uint8_t b[64];
	cr_assert_eq(h_read(p.s, b, sizeof(b), 0), 0, "the client's FIN");
	h_pattern(b, sizeof(b), 7, 0);
	cr_assert_eq(h_write(p.s, b, 10, MSG_MORE), 10); /* stays coalesced */
	fake_net_break_all();
	cr_assert_eq(h_write_all(p.s, b + 10, sizeof(b) - 10), (long)sizeof(b) - 10);
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	uint8_t got[64];
	long end;
	cr_assert_eq(h_read_all(p.c, got, sizeof(got), &end), sizeof(got));
	cr_assert(h_pattern_ok(got, sizeof(got), 7, 0));
	cr_assert_eq(h_read(p.c, got, 1, 0), 0, "EOF after the server's bytes");
	h_pair_free(&p);
}
