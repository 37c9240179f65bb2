/* The QP breaks at a random point of a transfer in both directions, on
 * RDMA: after a random number of delivered messages, or with one side's
 * last few messages in flight (lost). The connection resumes over TCP:
 * both ends read every byte of the other's stream, unchanged, then its
 * EOF, and no call of either end fails. Nothing hangs. */
#include "harness.h"
#include "config.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(qp_break, .init = h_setup, .fini = h_teardown, .timeout = 120);

struct break_case {
	unsigned seed;
	long after;           /* messages delivered before the break */
	enum fake_side held;  /* instead: this side's messages stay in flight,
			       * and the break comes with `after` of them */
};

#define BREAK_CASES 100

ParameterizedTestParameters(qp_break, at_a_random_point)
{
	static struct break_case cases[BREAK_CASES];
	for (unsigned i = 0; i < BREAK_CASES; i++) {
		srand(1000 + i);
		cases[i].seed = 1000 + i;
		cases[i].held = i % 4 == 3 ? FAKE_CLIENT : i % 4 == 2 ? FAKE_SERVER : FAKE_NONE;
		/* The whole transfer takes some 260 messages; a side's window
		 * lets 3 of its messages be in flight at least. */
		cases[i].after = cases[i].held == FAKE_NONE ? 1 + rand() % 200 : 1 + rand() % 3;
	}
	return cr_make_param_array(struct break_case, cases, BREAK_CASES);
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

/* What `r` read of the stream `w` wrote is all of it, unchanged, then
 * its EOF; neither end was told of any error. */
static void judge(const struct break_case *bc, const struct side *r, const struct side *w,
		  const char *dir)
{
	cr_assert(!r->bad, "seed %u %s: byte %zu of %zu read differs from the one written",
		  bc->seed, dir, r->bad_at, r->got);
	cr_assert_eq(r->got, r->len, "seed %u %s: %zu of %zu bytes read (end %ld; writer wrote %ld, "
		     "shutdown %d)", bc->seed, dir, r->got, r->len, r->end, w->w.written, w->w.end);
	cr_assert_eq(r->end, 0, "seed %u %s: all bytes, then %ld instead of EOF", bc->seed, dir,
		     r->end);
	cr_assert(!told(r) && !told(w), "seed %u %s: a call failed (reader: read end %ld, wrote "
		  "%ld of %zu, shutdown %d; writer: read end %ld, wrote %ld, shutdown %d)", bc->seed,
		  dir, r->end, r->w.written, r->w.len, r->w.end, w->end, w->w.written, w->w.end);
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
	/* Each resumed over TCP, for a cause the statistics tell; or, when
	 * the peer's FIN had come with nothing of its own in flight, the QP
	 * ended normally for it and it only told its record. */
	cr_assert(p.c->fo.started || p.c->fo.announced || p.c->fo.announce_due,
		  "seed %u: the client did not resume", bc->seed);
	cr_assert(p.s->fo.started || p.s->fo.announced || p.s->fo.announce_due,
		  "seed %u: the server did not resume", bc->seed);
	cr_assert(p.c->fo.started || p.s->fo.started, "seed %u: neither end resumed", bc->seed);
	cr_assert(!p.c->fo.started || p.c->fo.cause != SV_FO_NONE);
	cr_assert(!p.s->fo.started || p.s->fo.cause != SV_FO_NONE);
	cr_assert_eq(p.c->fo.outcome, 0);
	cr_assert_eq(p.s->fo.outcome, 0);
	h_pair_free(&p);
}

#define REFUSE_CASES 40

ParameterizedTestParameters(qp_break, when_posts_are_refused)
{
	static struct break_case cases[REFUSE_CASES];
	for (unsigned i = 0; i < REFUSE_CASES; i++) {
		srand(2000 + i);
		cases[i].seed = 2000 + i;
		cases[i].after = 1 + rand() % 200;
	}
	return cr_make_param_array(struct break_case, cases, REFUSE_CASES);
}

/* From a random point on, every post of a send fails (and sends nothing):
 * each end resumes over TCP, and both read every byte of the other's
 * stream, unchanged, then its EOF. */
ParameterizedTest(struct break_case *bc, qp_break, when_posts_are_refused)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_refuse_posts_after(bc->after);
	enum { N = 400000 };
	struct side c, s;
	side_start(&c, p.c, p.cfd, bc->seed, bc->seed + 1, N);
	side_start(&s, p.s, p.sfd, bc->seed + 1, bc->seed, N);
	pthread_join(c.t, NULL);
	pthread_join(s.t, NULL);
	judge(bc, &s, &c, "client to server");
	judge(bc, &c, &s, "server to client");
	h_pair_free(&p);
}

/* Our receive call pushes out our coalesced bytes, and that post is
 * refused: the break is learnt inside the read. The peer's bytes the QP
 * delivered are still read, then TCP's; it is no end of the stream. */
Test(qp_break, a_read_that_learns_of_the_break_still_reads)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t out[1000], got[1000], b[10];
	h_pattern(out, sizeof(out), 11, 0);
	h_pattern(b, sizeof(b), 12, 0);
	cr_assert_eq(h_write_all(p.s, out, 600), 600);
	cr_assert_eq(h_write(p.c, b, sizeof(b), MSG_MORE), (long)sizeof(b)); /* stays coalesced */
	fake_net_refuse_posts_after(0);
	long end;
	cr_assert_eq(h_read_all(p.c, got, 600, &end), 600, "end %ld", end);
	cr_assert(h_pattern_ok(got, 600, 11, 0));
	/* The server resumes too (its record is on TCP, or its next post is
	 * refused): the rest of both streams goes over TCP. */
	cr_assert_eq(h_write_all(p.s, out + 600, 400), 400);
	cr_assert_eq(h_read_all(p.c, got + 600, 400, &end), 400, "end %ld", end);
	cr_assert(h_pattern_ok(got, sizeof(got), 11, 0));
	cr_assert_eq(h_read_all(p.s, got, sizeof(b), &end), (long)sizeof(b), "end %ld", end);
	cr_assert(h_pattern_ok(got, sizeof(b), 12, 0));
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	cr_assert_eq(h_read(p.c, got, 1, 0), 0);
	cr_assert_eq(h_read(p.s, got, 1, 0), 0);
	cr_assert(p.c->fo.started && p.c->error == 0 && p.s->error == 0);
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

/* One end loses its device while the other waits in a read, idle: no
 * disconnect reaches the reader, its QP stays up and it sends nothing. The
 * resume record on TCP wakes it, it resumes too, and the writer's bytes in
 * flight arrive over TCP. Each direction once. */
struct idle_reader {
	struct sv_stream *s;
	unsigned delay_us; /* before the read */
	uint8_t buf[3000];
	size_t got;
	long end;
};

static void *idle_read(void *arg)
{
	struct idle_reader *ir = arg;
	usleep(ir->delay_us);
	ir->got = h_read_all(ir->s, ir->buf, sizeof(ir->buf), &ir->end);
	return NULL;
}

ParameterizedTestParameters(qp_break, the_peers_record_wakes_an_idle_reader)
{
	static enum fake_side lost[] = {FAKE_CLIENT, FAKE_SERVER};
	return cr_make_param_array(enum fake_side, lost, 2);
}

ParameterizedTest(enum fake_side *lost, qp_break, the_peers_record_wakes_an_idle_reader)
{
	struct pair p;
	h_pair_rdma(&p);
	bool client_lost = *lost == FAKE_CLIENT;
	struct sv_stream *w = client_lost ? p.c : p.s;
	struct idle_reader ir = {.s = client_lost ? p.s : p.c};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, idle_read, &ir), 0);
	fake_net_hold(*lost); /* the writer's messages stay in flight ... */
	uint8_t out[3000];
	h_pattern(out, sizeof(out), 5, 0);
	cr_assert_eq(h_write_all(w, out, sizeof(out)), (long)sizeof(out));
	usleep(20000); /* the reader is usually asleep in its read by now (not needed) */
	fake_net_lose_device(*lost); /* ... and are lost with the device */
	pthread_join(t, NULL);
	cr_assert_eq(ir.got, sizeof(out), "the reader got %zu bytes (end %ld)", ir.got, ir.end);
	cr_assert(h_pattern_ok(ir.buf, sizeof(out), 5, 0), "the bytes in flight arrived over TCP");
	struct sv_stream *r = ir.s;
	cr_assert_eq(h_state(r), SV_CONN_BROKEN);
	cr_assert_eq(r->fo.cause, SV_FO_PEER, "the reader learnt it from the record, not %s",
		     sv_failover_name(r->fo.cause));
	/* The lost side hears of it from rdma_cm or from its own flushed
	 * work requests, whichever it looks at first. */
	cr_assert(w->fo.cause == SV_FO_DEVICE || w->fo.cause == SV_FO_QP_ERROR, "writer: %s",
		  sv_failover_name(w->fo.cause));
	cr_assert_eq(r->error, 0);
	cr_assert_eq(w->error, 0);
	h_pair_free(&p);
}

/* ---- Resuming: the edges ------------------------------------------------------ */
/* One end loses its device while the other's application makes no call
 * at all (its QP stays up, idle): the helper watches the idle end's TCP
 * socket, reads the record and answers, so the lost end resumes. Its poll
 * never says readable while its read would say EAGAIN. */
Test(qp_break, the_helper_wakes_an_idle_peer_for_the_record)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_lose_device(FAKE_CLIENT);
	uint64_t until = h_ms() + 5000;
	while (h_state(p.c) == SV_CONN_RDMA && h_ms() < until)
		usleep(1000);
	if (h_state(p.c) == SV_CONN_RESUMING) {
		short own, kernel;
		uint64_t gen;
		sv_stream_poll_split(p.c, POLLIN, &own, &kernel, &gen);
		uint8_t b[16];
		long r = h_read(p.c, b, sizeof(b), MSG_DONTWAIT);
		cr_expect(!((own & POLLIN) && r == -EAGAIN),
			  "poll says readable (own %#x) and the read says %ld: a spin", own, r);
	}
	/* The server's application makes no call. */
	enum sv_conn_state st = h_wait_state(p.c, SV_CONN_BROKEN, 5000);
	cr_assert_eq(st, SV_CONN_BROKEN, "the client is still %s; the server %s",
		     sv_conn_state_name(st), sv_conn_state_name(h_state(p.s)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_BROKEN, 5000), SV_CONN_BROKEN);
	cr_assert_eq(p.s->fo.cause, SV_FO_PEER, "the server heard it from the record");
	cr_assert_eq(p.c->error, 0);
	cr_assert_eq(p.s->error, 0);
	h_pair_free(&p);
}

/* The peer closes normally (its FIN over the QP, then its disconnect)
 * while we are open with nothing in flight: the QP's normal end. As with
 * TCP, the socket shows no error and the first write after the peer's
 * close succeeds (our record goes with it, never unprompted). */
Test(qp_break, a_normal_close_is_no_reset)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t b[100];
	h_pattern(b, sizeof(b), 3, 0);
	cr_assert_eq(h_write_all(p.s, b, sizeof(b)), (long)sizeof(b));
	cr_assert_eq(sv_stream_close(p.s, p.sfd), 0);
	long end;
	cr_assert_eq(h_read_all(p.c, b, sizeof(b), &end), sizeof(b));
	cr_assert_eq(h_read(p.c, b, 1, 0), 0, "EOF");
	usleep(300000); /* the disconnect, the record, the reset */
	struct pollfd pf = {.fd = p.cfd, .events = POLLOUT};
	poll(&pf, 1, 0);
	int err = 0;
	socklen_t el = sizeof(err);
	cr_assert_eq(getsockopt(p.cfd, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	cr_expect_eq(err, 0, "the client's TCP socket got %s after a clean close; announced %d",
		     strerror(err), p.c->fo.announced);
	cr_expect_not(pf.revents & POLLERR, "POLLERR on a clean close");
	/* TCP: the first write to a peer that closed succeeds (its reset
	 * follows); here it fails at once (EPIPE, and SIGPIPE without
	 * MSG_NOSIGNAL). */
	long wr = h_write(p.c, b, 10, 0);
	cr_expect_eq(wr, 10, "the first write after the peer's close: %ld", wr);
	h_pair_free(&p);
}

/* Until `cond` holds for the stream, or ms pass. */
static bool wait_fo(struct sv_stream *s, bool (*cond)(struct sv_stream *), int ms)
{
	uint64_t end = h_ms() + (uint64_t)ms;
	for (;;) {
		sv_lock(&s->lock);
		bool ok = cond(s);
		sv_unlock(&s->lock);
		if (ok || h_ms() >= end)
			return ok;
		usleep(1000);
	}
}

static bool qp_over(struct sv_stream *s)
{
	return s->fo.announce_due || s->fo.announced || s->fo.started;
}

/* Both ends close at once: the server's FIN came over the QP and the
 * server, done, disconnected while our FIN was still in flight. Only our
 * FIN is in question, never a byte, and the peer closed: the QP's normal
 * end, no failover (the statistics would tell one that never happened). */
Test(qp_break, closing_together_is_a_normal_end)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_hold(FAKE_CLIENT); /* the client's FIN stays in flight */
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	uint8_t b[100];
	h_pattern(b, sizeof(b), 3, 0);
	cr_assert_eq(h_write_all(p.s, b, sizeof(b)), (long)sizeof(b));
	cr_assert_eq(sv_stream_close(p.s, p.sfd), 0); /* lingers until its FIN is in */
	long end;
	cr_assert_eq(h_read_all(p.c, b, sizeof(b), &end), sizeof(b));
	cr_assert(h_pattern_ok(b, sizeof(b), 3, 0));
	cr_assert_eq(h_read(p.c, b, 1, 0), 0, "EOF");
	cr_assert(wait_fo(p.c, qp_over, 5000), "the client never saw the QP end");
	cr_expect_not(p.c->fo.started, "the client resumed (%s) after a normal close",
		      sv_failover_name(p.c->fo.cause));
	cr_expect_eq(p.c->fo.cause, SV_FO_NONE, "failover=%s", sv_failover_name(p.c->fo.cause));
	cr_expect_eq(h_state(p.c), SV_CONN_RDMA, "client %s", sv_conn_state_name(h_state(p.c)));
	cr_expect_eq(p.c->error, 0);
	cr_assert_eq(sv_stream_close(p.c, p.cfd), 0);
	h_pair_free(&p);
}

/* Both shut their sending down, the server's FIN arrived, ours was in
 * flight when the QP failed: the server still reads, so it resumes. The
 * client answers its record with its own, then TCP's FIN: the server
 * reads its EOF at once, not when the client closes. */
Test(qp_break, a_peer_that_lacks_our_fin_reads_it_over_tcp)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_hold(FAKE_CLIENT);
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_WR), 0);
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	uint8_t b[16];
	cr_assert_eq(h_read(p.c, b, 1, 0), 0, "the server's FIN");
	fake_net_break_all(); /* the client's FIN is lost */
	uint64_t t0 = h_ms();
	long r = h_read(p.s, b, 1, 0);
	cr_assert_eq(r, 0, "the server read %ld instead of EOF", r);
	cr_expect_lt(h_ms() - t0, 30000, "EOF only after %llu ms",
		     (unsigned long long)(h_ms() - t0));
	cr_assert_eq(h_state(p.s), SV_CONN_BROKEN, "the server resumed");
	cr_assert_eq(p.s->error, 0);
	cr_assert_eq(p.c->error, 0);
	cr_assert_eq(h_read(p.c, b, 1, 0), 0, "the client still reads EOF");
	h_pair_free(&p);
}

/* Have both ends read the other's resume record? */
static bool records_in(struct pair *p)
{
	bool in = true;
	struct sv_stream *ss[2] = {p->c, p->s};
	for (int i = 0; i < 2; i++) {
		sv_lock(&ss[i]->lock);
		in = in && ss[i]->fo.in_got == SV_RESUME_SIZE;
		sv_unlock(&ss[i]->lock);
	}
	return in;
}

static bool wait_records(struct pair *p, int ms)
{
	uint64_t end = h_ms() + (uint64_t)ms;
	while (!records_in(p) && h_ms() < end)
		usleep(1000);
	return records_in(p);
}

/* A receiver that pauses (flow control) after the resume, while the kept
 * bytes do not fit in TCP's buffers: the exchange's deadline is for a
 * peer that never answers, not for one that reads slowly. */
Test(qp_break, a_slow_reader_after_the_resume_is_not_reset)
{
	sv_cfg.window = 32;
	sv_cfg.buf_start = sv_cfg.buf_size = 4096;
	struct pair p;
	h_listen(&p, true);
	h_connect_sockets(&p);
	int small = 4096;
	cr_assert_eq(setsockopt(p.cfd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	cr_assert_eq(setsockopt(p.sfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	p.c = sv_stream_new(p.cfd, true);
	p.s = sv_stream_new(p.sfd, false);
	h_start_server(p.s, p.l);
	sv_stream_start_client(p.c);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	fake_net_hold(FAKE_CLIENT);
	static uint8_t out[256 * 1024];
	h_pattern(out, sizeof(out), 9, 0);
	long w = 0;
	while (w < (long)sizeof(out)) {
		long r = h_write(p.c, out + w, sizeof(out) - (size_t)w, MSG_DONTWAIT);
		if (r <= 0)
			break;
		w += r;
	}
	cr_assert_gt(w, 100000, "in flight: %ld", w);
	fake_net_break_all();
	/* Both helpers exchange the records (the applications make no call),
	 * then the client's owed bytes wait for TCP's room. */
	cr_assert(wait_records(&p, 10000), "the records were not exchanged");
	/* The server reads nothing for 65 s (its application is busy). */
	h_warp_ms(65000);
	cr_assert_eq(h_state(p.c), SV_CONN_RESUMING, "the client %s after the silence",
		     sv_conn_state_name(h_state(p.c)));
	static uint8_t in[256 * 1024];
	long end;
	size_t got = h_read_all(p.s, in, (size_t)w, &end);
	cr_expect_eq(got, (size_t)w, "the server read %zu of %ld (end %ld); client error %d",
		     got, w, end, p.c->error);
	h_pair_free(&p);
}

/* shutdown(SHUT_RDWR) on RDMA, then the QP is lost with our bytes in
 * flight: TCP's reading stays open for the peer's record, and the peer
 * reads every byte. */
Test(qp_break, shut_rdwr_then_a_break_loses_nothing)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_hold(FAKE_CLIENT);
	uint8_t out[3000];
	h_pattern(out, sizeof(out), 11, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	cr_assert_eq(sv_stream_shutdown(p.c, SHUT_RDWR), 0);
	fake_net_lose_device(FAKE_CLIENT); /* the client resumes first */
	usleep(200000);
	bool dropped = h_state(p.c) == SV_CONN_BROKEN && p.c->error == 0;
	/* Without a close the server's read would wait for ever (no FIN
	 * after peer_gone): close, as the application would next. */
	sv_stream_close(p.c, p.cfd);
	uint8_t in[3000];
	long end;
	size_t got = h_read_all(p.s, in, sizeof(in), &end);
	cr_expect_eq(got, sizeof(out), "the server read %zu of %zu, then %ld (client dropped its kept "
		     "bytes: %d)", got, sizeof(out), end, dropped);
	h_pair_free(&p);
}

/* The process exits (sv_stream_exit_flush) while a connection resumes:
 * the kept bytes go out first. */
Test(qp_break, exit_waits_for_the_exchange)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_hold(FAKE_CLIENT);
	uint8_t out[3000];
	h_pattern(out, sizeof(out), 13, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	struct idle_reader lr = {.s = p.s, .delay_us = 300000};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, idle_read, &lr), 0);
	fake_net_lose_device(FAKE_CLIENT);
	/* Usually still resuming here (the server's answer may be quick). */
	uint64_t until = h_ms() + 2000;
	while (h_state(p.c) == SV_CONN_RDMA && h_ms() < until)
		usleep(1000);
	uint64_t t0 = h_ms();
	sv_stream_exit_flush(p.c);
	uint64_t took = h_ms() - t0;
	enum sv_conn_state st = h_state(p.c);
	cr_expect_neq(st, SV_CONN_RESUMING,
		      "exit_flush returned after %llu ms with the exchange under way (3000 bytes "
		      "kept, unsent): the process ends here", (unsigned long long)took);
	pthread_join(t, NULL);
	cr_assert_eq(lr.got, sizeof(out), "the server read %zu of %zu (end %ld)", lr.got,
		     sizeof(out), lr.end);
	cr_assert(h_pattern_ok(lr.buf, sizeof(out), 13, 0));
	h_pair_free(&p);
}

/* A lingering close whose look finds the QP lost: it waits for the
 * exchange, and the kept bytes reach the peer. */
Test(qp_break, a_lingering_close_waits_for_the_exchange)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_hold(FAKE_CLIENT);
	uint8_t out[3000];
	h_pattern(out, sizeof(out), 19, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	sv_lock(&p.c->lock);
	p.c->cl.app_closed = true; /* as sv_stream_close did */
	p.c->cl.linger_deadline_us = sv_now_us() + 30000000u;
	fake_net_qp_error_quiet(FAKE_CLIENT);
	bool done = false;
	sv_stream_linger(p.c, sv_now_us(), &done);
	enum sv_conn_state st = p.c->state;
	sv_unlock(&p.c->lock);
	cr_expect_not(done, "the linger finished (state %s): the TCP socket is closed with 3000 "
		      "bytes kept and unsent", sv_conn_state_name(st));
	uint8_t in[3000];
	long end;
	size_t got = h_read_all(p.s, in, sizeof(in), &end);
	cr_expect_eq(got, sizeof(out), "the server read %zu of %zu, then %ld", got, sizeof(out),
		     end);
	h_pair_free(&p);
}

/* The peer's FIN came over the QP before the break: after the QP's part
 * the read says EOF. */
Test(qp_break, eof_after_a_fin_then_a_break, .timeout = 20)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t out[100];
	h_pattern(out, sizeof(out), 23, 0);
	cr_assert_eq(h_write_all(p.s, out, sizeof(out)), (long)sizeof(out));
	cr_assert_eq(sv_stream_shutdown(p.s, SHUT_WR), 0);
	usleep(50000);
	fake_net_hold(FAKE_CLIENT); /* the client's bytes in flight: not the QP's normal end */
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	fake_net_break_all();
	usleep(50000);
	uint8_t in[200];
	long end;
	size_t got = h_read_all(p.c, in, sizeof(out), &end);
	cr_assert_eq(got, sizeof(out));
	cr_expect_eq(h_read(p.c, in, 1, 0), 0, "EOF");
	h_pair_free(&p);
}
