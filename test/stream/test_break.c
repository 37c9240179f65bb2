/* The QP breaks at a random point of a transfer in both directions. Either
 * every byte arrives (the connection goes on over TCP), or the reader is
 * told: what it read is always the stream's beginning, never changed, and
 * a short stream never ends in a clean EOF. Nothing hangs. */
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
	enum fake_side held;  /* this side's messages stay in flight: lost */
};

ParameterizedTestParameters(qp_break, at_a_random_point)
{
	static struct break_case cases[16];
	for (unsigned i = 0; i < 16; i++) {
		srand(1000 + i);
		cases[i].seed = 1000 + i;
		cases[i].after = 1 + rand() % 400;
		cases[i].held = i % 4 == 3 ? FAKE_CLIENT : i % 4 == 2 ? FAKE_SERVER : FAKE_NONE;
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
	if (bc->held != FAKE_NONE)
		fake_net_hold(bc->held);
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	if (bc->held == FAKE_NONE) {
		cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
		cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	}
	fake_net_break_after(bc->after);
	enum { N = 400000 };
	struct side c, s;
	side_start(&c, p.c, p.cfd, bc->seed, bc->seed + 1, N);
	side_start(&s, p.s, p.sfd, bc->seed + 1, bc->seed, N);
	/* Held messages are the ones in flight when the link goes: a break
	 * must come for them to be lost rather than stay in flight. */
	if (bc->held != FAKE_NONE) {
		usleep(20000);
		fake_net_break_all();
	}
	pthread_join(c.t, NULL);
	pthread_join(s.t, NULL);
	judge(bc, &s, &c, "client to server");
	judge(bc, &c, &s, "server to client");
	h_pair_free(&p);
}
