/* The switch to RDMA, in both directions, idle and under traffic. */
#include "harness.h"

#include "config.h"
#include "helper_int.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <unistd.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

TestSuite(switch, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* Both directions move to the QP; then each side's bytes reach the other
 * intact, every one of them over the QP. */
Test(switch, both_directions_carry_bytes_over_the_qp)
{
	struct pair p;
	h_pair_rdma(&p);
	enum { N = 300000 };
	uint8_t *in = malloc(N);
	struct h_writer w = {.s = p.c, .fd = p.cfd, .len = N, .seed = 1};
	h_writer_start(&w);
	long end;
	size_t got = h_read_all(p.s, in, N, &end);
	h_writer_join(&w);
	cr_assert_eq(w.written, N);
	cr_assert_eq(got, N);
	cr_assert(h_pattern_ok(in, N, 1, 0), "the client's bytes arrived changed");
	cr_assert_eq(h_read(p.s, in, 1, 0), 0, "EOF after the client's shutdown");

	struct h_writer back = {.s = p.s, .fd = p.sfd, .len = N, .seed = 2};
	h_writer_start(&back);
	got = h_read_all(p.c, in, N, &end);
	h_writer_join(&back);
	cr_assert_eq(got, N);
	cr_assert(h_pattern_ok(in, N, 2, 0), "the server's bytes arrived changed");

	struct h_counts c = h_counts(p.c), s = h_counts(p.s);
	cr_assert_eq(c.rdma_tx, N, "client: %lu bytes over the QP", (unsigned long)c.rdma_tx);
	cr_assert_eq(s.rdma_tx, N, "server: %lu bytes over the QP", (unsigned long)s.rdma_tx);
	cr_assert_eq(c.tcp_tx + s.tcp_tx, 0, "nothing went over TCP");
	cr_assert_eq(s.rdma_rx, N);
	free(in);
	h_pair_free(&p);
}

/* A client that writes from its first moment, and whose upgrade comes
 * while it writes: rdma_cm's start-up holds the upgrade until a quarter of
 * the bytes went over TCP; then the reader pauses, so the writer is still
 * blocked with most of its bytes (more than the kernel's socket buffers
 * hold) when the connection reaches RDMA. What TCP carried before the
 * switch point and what the QP carried after it are one stream. */
Test(switch, under_traffic_keeps_the_byte_stream)
{
	fake_net_slow_start();
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	enum { N = 32 << 20 };
	uint8_t *in = malloc(N);
	struct h_writer w = {.s = p.c, .fd = p.cfd, .len = N, .seed = 3};
	h_writer_start(&w);
	long end;
	size_t got = h_read_all(p.s, in, N / 4, &end);
	cr_assert_eq(got, N / 4);
	fake_net_start_now();
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	got += h_read_all(p.s, in + got, N - got, &end);
	h_writer_join(&w);
	cr_assert_eq(got, N);
	cr_assert(h_pattern_ok(in, N, 3, 0), "the stream changed across the switch");
	cr_assert_eq(h_read(p.s, in, 1, 0), 0);
	struct h_counts c = h_counts(p.c);
	cr_assert_eq(c.rdma_tx + c.tcp_tx, N);
	cr_assert_geq(c.tcp_tx, N / 4, "only %lu bytes over TCP", (unsigned long)c.tcp_tx);
	cr_assert_gt(c.rdma_tx, 0, "nothing went over the QP");
	cr_assert_eq(h_state(p.s), SV_CONN_RDMA);
	free(in);
	h_pair_free(&p);
}

/* A ping-pong of small messages on RDMA: each one answered, in order, with
 * coalescing and delayed ACKs on both sides. */
Test(switch, ping_pong)
{
	struct pair p;
	h_pair_rdma(&p);
	for (int i = 0; i < 2000; i++) {
		uint8_t msg[64], got[64];
		size_t n = 1 + (size_t)i % sizeof(msg);
		h_pattern(msg, n, 4, (uint64_t)i * 64);
		cr_assert_eq(h_write(p.c, msg, n, 0), (long)n);
		long end;
		cr_assert_eq(h_read_all(p.s, got, n, &end), n);
		cr_assert(h_pattern_ok(got, n, 4, (uint64_t)i * 64));
		cr_assert_eq(h_write(p.s, got, n, 0), (long)n);
		cr_assert_eq(h_read_all(p.c, got, n, &end), n);
		cr_assert(h_pattern_ok(got, n, 4, (uint64_t)i * 64), "reply %d", i);
	}
	cr_assert_eq(h_counts(p.c).tcp_tx, 0);
	h_pair_free(&p);
}

/* A pair whose client connects without blocking, its stream started as
 * the interposer does after connect(). Returns connect()'s result (on
 * loopback, -1 with EINPROGRESS). */
static int nb_pair(struct pair *p)
{
	h_listen(p, true);
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)&a, &al), 0);
	p->cfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int r = connect(p->cfd, (struct sockaddr *)&a, sizeof(a));
	cr_assert(r == 0 || errno == EINPROGRESS);
	p->c = sv_stream_new(p->cfd, true);
	if (r == 0)
		sv_stream_start_client(p->c);
	else
		sv_stream_start_connecting(p->c, (struct sockaddr *)&a, sizeof(a));
	p->sfd = accept(p->lfd, NULL, NULL);
	p->s = sv_stream_new(p->sfd, false);
	h_start_server(p->s, p->l);
	return r;
}

/* The client gets to RDMA and writes 3 bytes there. */
static void three_bytes_over_the_qp(struct pair *p)
{
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p->c)));
	uint64_t before = h_counts(p->c).rdma_tx;
	uint8_t b[3] = {1, 2, 3}, g[3];
	long w;
	uint64_t until = h_ms() + 10000;
	while ((w = h_write(p->c, b, 3, 0)) == -EAGAIN && h_ms() < until)
		;
	cr_assert_eq(w, 3);
	long end;
	cr_assert_eq(h_read_all(p->s, g, 3, &end), 3);
	cr_assert_eq(memcmp(b, g, 3), 0);
	cr_assert_eq(h_counts(p->c).rdma_tx - before, 3);
}

/* A non-blocking connect whose bytes move before the helper can look at it
 * (rdma_cm's first use keeps it busy): the connection is plain TCP all
 * along, its bytes go at once, and its upgrade follows when the helper is
 * ready. */
Test(switch, a_non_blocking_connect_carries_bytes_before_the_helper_looks)
{
	fake_net_slow_start();
	struct pair p;
	cr_assert_neq(nb_pair(&p), 0, "the connect completed at once: nothing was pending");
	cr_assert_eq(h_state(p.c), SV_CONN_TCP);
	uint8_t b[3] = {1, 2, 3}, g[3];
	long end;
	cr_assert_eq(h_write_all(p.s, b, 3), 3);
	cr_assert_eq(h_read_all(p.c, g, 3, &end), 3);
	cr_assert_eq(h_write_all(p.c, b, 3), 3);
	cr_assert_eq(h_read_all(p.s, g, 3, &end), 3);
	cr_assert_eq(h_state(p.c), SV_CONN_TCP);
	fake_net_start_now();
	three_bytes_over_the_qp(&p);
	cr_assert_eq(h_counts(p.c).tcp_tx, 3);
	h_pair_free(&p);
}

/* A non-blocking connect: the stream waits for it, then upgrades. */
Test(switch, after_a_non_blocking_connect)
{
	struct pair p;
	nb_pair(&p);
	three_bytes_over_the_qp(&p);
	h_pair_free(&p);
}

struct sleeper {
	struct sv_stream *s;
	long got;
};

static void *read_one(void *arg)
{
	struct sleeper *z = arg;
	uint8_t b;
	z->got = h_read(z->s, &b, 1, 0);
	return NULL;
}

/* A connection on RDMA costs no descriptor of libsovia's: every CQ reports
 * to the device's one channel, and a thread that sleeps is woken through
 * its own eventfd (src/hub.h). K connections on RDMA, each read by a
 * thread that slept on it, hold as many descriptors as K that stay on
 * TCP: their sockets. */
Test(switch, connections_on_rdma_cost_no_descriptors)
{
	enum { K = 8 };
	struct pair warm, tcp[K], rdma[K];
	/* What a process makes once (the helper, rdma_cm's channel, the
	 * device's channel) is made before counting. */
	h_pair_rdma(&warm);
	int base = h_open_fds();
	for (int i = 0; i < K; i++) {
		h_listen(&tcp[i], false);
		h_connect(&tcp[i]);
		/* After the client's retries (their timers). */
		cr_assert_eq(h_wait_state_warp(tcp[i].c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	}
	int on_tcp = h_open_fds() - base;
	base = h_open_fds();
	struct sleeper z[K];
	pthread_t t[K];
	for (int i = 0; i < K; i++) {
		h_pair_rdma(&rdma[i]);
		z[i] = (struct sleeper){.s = rdma[i].s};
		cr_assert_eq(pthread_create(&t[i], NULL, read_one, &z[i]), 0);
	}
	/* The readers' spins end in sleeps (in the kernel, the lock let go). */
	for (int i = 0; i < K; i++)
		cr_assert(h_wait_asleep(rdma[i].s, 10000), "reader %d never slept", i);
	for (int i = 0; i < K; i++) {
		cr_assert_eq(h_write_all(rdma[i].c, "x", 1), 1);
		pthread_join(t[i], NULL);
		cr_assert_eq(z[i].got, 1);
	}
	int on_rdma = h_open_fds() - base;
	for (int i = 0; i < K; i++) {
		cr_assert_eq(h_state(rdma[i].s), SV_CONN_RDMA);
		cr_assert_eq(h_counts(rdma[i].s).rdma_rx, 1, "the byte came over the QP");
	}
	cr_assert_eq(on_rdma, on_tcp, "%d connections on RDMA hold %d fds, on TCP %d", K, on_rdma,
		     on_tcp);
	for (int i = 0; i < K; i++) {
		h_pair_free(&tcp[i]);
		h_pair_free(&rdma[i]);
	}
	h_pair_free(&warm);
}

static uint64_t helper_polls(struct sv_stream *s)
{
	sv_lock(&s->lock);
	uint64_t n = s->st.helper_polls;
	sv_unlock(&s->lock);
	return n;
}

/* A connection whose upgrade waits (here, accepted streams whose clients
 * never ask) is looked at by its deadline or when its rdma_cm events kick
 * it, not at every wake-up of the helper: a burst of hundreds of new
 * connections must not cost each wake-up a look at each of them. */
Test(switch, a_waiting_upgrade_is_not_looked_at_every_wakeup)
{
	enum { K = 8, WAKES = 200 };
	struct pair p;
	h_listen(&p, true);
	int cfd[K], sfd[K];
	struct sv_stream *srv[K];
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p.lfd, (struct sockaddr *)&a, &al), 0);
	for (int i = 0; i < K; i++) {
		cfd[i] = socket(AF_INET, SOCK_STREAM, 0); /* a client without libsovia */
		cr_assert_eq(connect(cfd[i], (struct sockaddr *)&a, sizeof(a)), 0);
		sfd[i] = accept(p.lfd, NULL, NULL);
		cr_assert_geq(sfd[i], 0);
		srv[i] = sv_stream_new(sfd[i], false);
		cr_assert_not_null(srv[i]);
		h_start_server(srv[i], p.l);
	}
	usleep(100 * 1000); /* the helper takes them up */
	uint64_t before[K];
	for (int i = 0; i < K; i++) {
		cr_assert_eq(h_state(srv[i]), SV_CONN_TCP, "waiting for its request");
		before[i] = h_helper_looks(srv[i]);
	}
	for (int i = 0; i < WAKES; i++) {
		sv_helper_wake();
		usleep(500);
	}
	for (int i = 0; i < K; i++) {
		uint64_t n = h_helper_looks(srv[i]) - before[i];
		cr_assert_leq(n, 5, "stream %d was looked at %lu times in %d wake-ups", i,
			      (unsigned long)n, WAKES);
		cr_assert_eq(h_state(srv[i]), SV_CONN_TCP);
	}
	for (int i = 0; i < K; i++) {
		cr_assert_eq(sv_stream_close(srv[i], sfd[i]), 0);
		sv_stream_put(srv[i]);
		close(cfd[i]);
	}
	sv_upgrade_unlisten(p.l);
	close(p.lfd);
}

/* An idle connection on RDMA leaves the helper asleep: it arms the CQ and
 * sleeps on the hub until the connection's next completion (its own
 * looks, which wake the connection's waiters, must not wake it again). */
Test(switch, an_idle_connection_leaves_the_helper_asleep)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t b = 7;
	cr_assert_eq(h_write_all(p.c, &b, 1), 1);
	cr_assert_eq(h_read(p.s, &b, 1, 0), 1);
	cr_assert_eq(h_write_all(p.s, &b, 1), 1);
	cr_assert_eq(h_read(p.c, &b, 1, 0), 1);
	usleep(300 * 1000); /* the helper finds both idle and arms */
	uint64_t c0 = helper_polls(p.c), s0 = helper_polls(p.s);
	usleep(500 * 1000);
	uint64_t c = helper_polls(p.c) - c0, s = helper_polls(p.s) - s0;
	cr_assert_leq(c + s, 10, "the helper looked %lu times at the client and %lu at the server",
		      (unsigned long)c, (unsigned long)s);
	/* And the next message still gets through. */
	cr_assert_eq(h_write_all(p.c, &b, 1), 1);
	cr_assert_eq(h_read(p.s, &b, 1, 0), 1);
	h_pair_free(&p);
}

/* One of a stream's protocol statistics, under its lock. */
static uint64_t proto_stat(struct sv_stream *s, size_t offset)
{
	sv_lock(&s->lock);
	uint64_t v = *(const uint64_t *)((const char *)sv_proto_stats(s->proto) + offset);
	sv_unlock(&s->lock);
	return v;
}
#define PSTAT(s, field) proto_stat((s), offsetof(struct sv_proto_stats, field))

/* The client writes `rounds` times 4 KiB, the server reading each. */
static void bulk_rounds(struct pair *p, int rounds, uint64_t *off)
{
	enum { CHUNK = 4096 };
	uint8_t out[CHUNK], in[CHUNK];
	for (int i = 0; i < rounds; i++, *off += CHUNK) {
		h_pattern(out, CHUNK, 5, *off);
		cr_assert_eq(h_write_all(p->c, out, CHUNK), CHUNK);
		long end;
		cr_assert_eq(h_read_all(p->s, in, CHUNK, &end), CHUNK);
		cr_assert(h_pattern_ok(in, CHUNK, 5, *off), "bytes at %llu arrived changed",
			  (unsigned long long)*off);
	}
}

/* A pair on RDMA whose client's bulk (32 x 4 KiB) grew the server's
 * receive buffers, grown ones given back after idle_ms. */
static void grown_pair(struct pair *p, uint32_t idle_ms, uint64_t *off)
{
	sv_cfg.buf_idle_ms = idle_ms;
	h_pair_rdma(p);
	*off = 0;
	bulk_rounds(p, 32, off);
	cr_assert_eq(PSTAT(p->s, rx_grows), 1, "the bulk did not grow the server's buffers");
}

/* A connection whose bulk grew its buffers gives them back once its
 * sending was idle for SOVIA_BUF_IDLE_MS, with neither application calling
 * in: the helper looks at it by its deadline and sends the DRAINs. Then it
 * carries bytes over the QP as before, and grows again. */
Test(switch, an_idle_connection_gives_its_grown_buffers_back)
{
	struct pair p;
	uint64_t off;
	grown_pair(&p, 50, &off);
	cr_assert_eq(PSTAT(p.c, tx_grows), 1);
	cr_assert_eq(fake_net_shrinks(), 0);

	uint64_t until = h_ms() + 10000;
	while (fake_net_shrinks() < 2 && h_ms() < until)
		usleep(10000);
	cr_assert_eq(fake_net_shrinks(), 2, "%u of the 2 pools were given back",
		     fake_net_shrinks());
	cr_assert_eq(PSTAT(p.s, rx_shrinks), 1);
	cr_assert_eq(PSTAT(p.c, tx_shrinks), 1);
	cr_assert_gt(PSTAT(p.c, drains_sent), 0);

	unsigned grows = fake_net_grows();
	bulk_rounds(&p, 32, &off);
	cr_assert_gt(fake_net_grows(), grows, "the second bulk did not grow them again");
	struct h_counts c = h_counts(p.c);
	cr_assert_eq(c.rdma_tx, off, "%llu of %llu bytes over the QP",
		     (unsigned long long)c.rdma_tx, (unsigned long long)off);
	h_pair_free(&p);
}

/* After the QP breaks under a grown connection, which goes on over TCP,
 * a blocking read sleeps (not spinning on a stale idle deadline) and
 * gets the next byte. */
struct bg_reader {
	struct pair *p;
	long r;
	uint8_t b;
};
static void *bg_read_main(void *arg)
{
	struct bg_reader *rd = arg;
	rd->r = h_read(rd->p->c, &rd->b, 1, 0);
	return NULL;
}
Test(switch, a_broken_grown_connection_lets_its_reader_sleep)
{
	struct pair p;
	uint64_t off;
	grown_pair(&p, 200, &off);
	fake_net_break_all();
	struct bg_reader rd = {.p = &p};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, bg_read_main, &rd), 0);
	usleep(100 * 1000);
	sv_lock(&p.c->lock);
	uint64_t w0 = p.c->st.waits_slept;
	sv_unlock(&p.c->lock);
	usleep(900 * 1000);
	sv_lock(&p.c->lock);
	uint64_t w1 = p.c->st.waits_slept;
	sv_unlock(&p.c->lock);
	uint8_t b = 9;
	cr_assert_eq(h_write_all(p.s, &b, 1), 1);
	pthread_join(t, NULL);
	cr_assert_lt(w1 - w0, 100, "the reader woke %llu times in 0.9 s",
		     (unsigned long long)(w1 - w0));
	cr_assert_eq(rd.r, 1, "the read gave %ld", rd.r);
	cr_assert_eq(rd.b, 9);
	h_pair_free(&p);
}
