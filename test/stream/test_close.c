/* Lingering close: close() returns at once, and the helper thread delivers
 * what is still queued before the connection ends. */
#include "harness.h"

#include "config.h"
#include "ownfd.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(close, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* The writer closes right after its last write, with most of its bytes
 * still queued: the reader gets every one of them, then EOF. */
Test(close, delivers_what_was_queued_then_ends)
{
	struct pair p;
	h_pair_rdma(&p);
	enum { N = 200000 };
	uint8_t *buf = malloc(N);
	h_pattern(buf, N, 20, 0);
	/* The reader has not started: the window fills, the rest waits in
	 * the writer's send buffers and its last coalesced one. */
	struct h_writer w = {.s = p.c, .fd = p.cfd, .len = N, .seed = 20, .close_fd = true};
	h_writer_start(&w);
	usleep(20000);
	long end;
	size_t got = h_read_all(p.s, buf, N, &end);
	h_writer_join(&w);
	cr_assert_eq(w.written, N);
	cr_assert_eq(w.end, 0, "close gave %d", w.end);
	cr_assert_eq(got, N);
	cr_assert(h_pattern_ok(buf, N, 20, 0));
	cr_assert_eq(h_read(p.s, buf, 1, 0), 0, "EOF after the last byte");
	/* The helper finishes the closed connection: its socket closes. */
	uint64_t until = h_ms() + 10000;
	int fd;
	do {
		sv_lock(&p.c->lock);
		fd = p.c->fd;
		sv_unlock(&p.c->lock);
	} while (fd >= 0 && h_ms() < until && usleep(1000) == 0);
	cr_assert_lt(fd, 0, "the closed connection was never finished");
	cr_assert_eq(h_counts(p.c).tcp_tx, 0);
	free(buf);
	h_pair_free(&p);
}

/* close() itself never waits for the peer: it returns while the peer has
 * not read anything yet. */
Test(close, returns_at_once)
{
	struct pair p;
	h_pair_rdma(&p);
	/* Fill what the window and the send buffers take. */
	uint8_t b[1000];
	size_t sent = 0;
	long r;
	while ((r = h_write(p.c, b, sizeof(b), MSG_DONTWAIT)) > 0)
		sent += (size_t)r;
	cr_assert_eq(r, -EAGAIN);
	cr_assert_gt(sent, 0);
	uint64_t t0 = h_ms();
	cr_assert_eq(sv_stream_close(p.c, p.cfd), 0);
	cr_assert_lt(h_ms() - t0, 1000, "close waited %lu ms", (unsigned long)(h_ms() - t0));
	long end;
	uint8_t *in = malloc(sent);
	cr_assert_eq(h_read_all(p.s, in, sent, &end), sent);
	cr_assert_eq(h_read(p.s, in, 1, 0), 0);
	free(in);
	h_pair_free(&p);
}

/* No descriptor is free for the connection's own copy (EMFILE, every
 * number up to RLIMIT_NOFILE taken): close() must still succeed, never
 * fail with EMFILE nor wait (it used to finish in place for up to 2 s),
 * and the queued bytes and the end still arrive: the connection lingers
 * on the application's own number, given back when it is done. */
Test(close, without_a_free_descriptor_lingers_on_its_own)
{
	struct pair p;
	h_pair_rdma(&p);
	enum { N = 20000, FILL = 100 };
	uint8_t *buf = malloc(N);
	h_pattern(buf, N, 21, 0);
	/* More than the peer's window: the close cannot finish before the
	 * reader reads. */
	cr_assert_eq(h_write_all(p.c, buf, N), N);
	int fill[FILL], top = -1;
	for (int i = 0; i < FILL; i++) {
		fill[i] = dup(0);
		cr_assert_geq(fill[i], 0);
		top = fill[i] > top ? fill[i] : top;
	}
	struct rlimit was, low;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
	low = was;
	low.rlim_cur = (rlim_t)top + 1;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	cr_assert_eq(fcntl(p.cfd, F_DUPFD_CLOEXEC, 0), -1, "a descriptor was still free");
	uint64_t t0 = h_ms();
	int r = sv_stream_close(p.c, p.cfd);
	int err = errno;
	uint64_t took = h_ms() - t0;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
	for (int i = 0; i < FILL; i++)
		close(fill[i]);
	cr_assert_eq(r, 0, "close gave %d (errno %d)", r, err);
	cr_assert_lt(took, 500, "close waited %llu ms", (unsigned long long)took);
	long end;
	memset(buf, 0, N);
	size_t got = h_read_all(p.s, buf, N, &end);
	cr_assert_eq(got, N);
	cr_assert(h_pattern_ok(buf, N, 21, 0));
	cr_assert_eq(h_read(p.s, buf, 1, 0), 0, "EOF after the last byte");
	free(buf);
	h_pair_free(&p);
}

static int open_below(int top)
{
	int n = 0;
	for (int fd = 0; fd < top; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* Issue 53, finding 5: lingering closes whose peer takes nothing (here
 * its QP holds every send in flight; a hostile peer withholds credits)
 * cost the application's range at most a few fds, however many there
 * are; past that a close is abortive, as an orphan past the kernel's
 * bound is. Each close returns at once; the peer of an abortive one sees
 * a reset. */
Test(close, lingering_closes_take_few_of_the_applications_fds)
{
	enum { N = 24 };
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 1024) {
		rl.rlim_cur = rl.rlim_max < 1024 ? rl.rlim_max : 1024;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	/* libsovia's own range is taken already: the closes must look below. */
	int base = sv_ownfd_base(), null = open("/dev/null", O_RDONLY), mine = 0;
	int *fill = calloc((size_t)rl.rlim_cur, sizeof(int));
	for (int fd; (fd = sv_ownfd_dup_above(null)) >= 0;)
		fill[mine++] = fd;
	struct pair *p = calloc(N, sizeof(*p));
	h_listen(&p[0], true);
	for (int i = 0; i < N; i++) {
		p[i].lfd = p[0].lfd;
		p[i].l = p[0].l;
		h_connect(&p[i]);
		cr_assert_eq(h_wait_state(p[i].c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
		cr_assert_eq(h_wait_state(p[i].s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	}
	fake_net_hold(FAKE_CLIENT);
	uint8_t b[100] = {0};
	for (int i = 0; i < N; i++)
		cr_assert_eq(h_write(p[i].c, b, sizeof(b), 0), (long)sizeof(b));
	int before = open_below(base);
	uint64_t t0 = h_ms();
	for (int i = 0; i < N; i++)
		cr_assert_eq(sv_stream_close(p[i].c, p[i].cfd), 0);
	uint64_t took = h_ms() - t0;
	int after = open_below(base);
	cr_assert_lt(took, 1000, "%d closes took %llu ms", N, (unsigned long long)took);
	cr_assert_leq(after - (before - N), 16,
		      "%d of the application's fds still taken by %d closed connections",
		      after - (before - N), N);
	/* The last closes were abortive: their peers read a reset. */
	long r = h_read(p[N - 1].s, b, sizeof(b), 0);
	cr_assert_eq(r, -ECONNRESET, "the last closed connection's peer read %ld", r);
	fake_net_release();
	for (int i = 0; i < mine; i++)
		sv_ownfd_close(fill[i]);
	free(fill);
	close(null);
	for (int i = 0; i < N; i++) {
		sv_stream_put(p[i].c);
		sv_stream_put(p[i].s);
	}
	sv_upgrade_unlisten(p[0].l);
	close(p[0].lfd);
	free(p);
}

/* At exit, every connection pushes out what it owes, however many there
 * are: 300 connections each hold a write back (MSG_MORE), and after the
 * exit flush each server has its client's bytes. */
Test(close, the_exit_flush_covers_every_connection)
{
	enum { N = 300, LEN = 10 };
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 2 * N + 64) {
		rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	/* The coalescing timer must not push them out first (the helper
	 * would, at its deadline): longer than the test may last. */
	sv_cfg.coalesce_timeout_us = 600u * 1000000u;
	struct pair *p = calloc(N, sizeof(*p));
	h_listen(&p[0], true);
	for (int i = 0; i < N; i++) {
		p[i].lfd = p[0].lfd;
		p[i].l = p[0].l;
		h_connect(&p[i]);
	}
	for (int i = 0; i < N; i++) {
		cr_assert_eq(h_wait_state(p[i].c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
		cr_assert_eq(h_wait_state(p[i].s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	}
	uint8_t out[LEN], in[LEN];
	for (int i = 0; i < N; i++) {
		h_pattern(out, LEN, (uint64_t)i, 0);
		cr_assert_eq(h_write(p[i].c, out, LEN, MSG_MORE), LEN);
	}
	int held = 0;
	for (int i = 0; i < N; i++) {
		sv_lock(&p[i].c->lock);
		held += sv_proto_tx_pending(p[i].c->proto);
		sv_unlock(&p[i].c->lock);
	}
	sv_stream_exit_flush_all();
	/* What the flush sent is there at once; bounded against a hang. */
	uint64_t until = h_ms() + 10000;
	for (int i = 0; i < N; i++) {
		size_t got = 0;
		while (got < LEN && h_ms() < until) {
			long r = h_read(p[i].s, in + got, LEN - got, MSG_DONTWAIT);
			if (r > 0)
				got += (size_t)r;
			else
				usleep(1000);
		}
		cr_assert_eq(got, LEN, "connection %d (of %d, %d held their bytes): %zu bytes", i,
			     N, held, got);
		cr_assert(h_pattern_ok(in, LEN, (uint64_t)i, 0));
	}
	cr_assert_eq(held, N, "only %d connections held their bytes: not the case tested", held);
	for (int i = 0; i < N; i++) {
		sv_stream_put(p[i].c);
		sv_stream_put(p[i].s);
	}
	sv_upgrade_unlisten(p[0].l);
	close(p[0].lfd);
	free(p);
}

/* A connection the application leaves open at its exit (an inetd service:
 * cat exits with the connection on its stdin): the kernel would close the
 * socket with a FIN, and so does the exit flush over the QP. The peer
 * reads the last bytes and then the end, on RDMA, not a lost QP. */
Test(close, an_open_connection_ends_its_stream_at_exit)
{
	struct pair p;
	h_pair_rdma(&p);
	uint8_t out[100], in[100];
	h_pattern(out, sizeof(out), 9, 0);
	cr_assert_eq(h_write(p.c, out, sizeof(out), MSG_MORE), (long)sizeof(out));
	sv_stream_exit_flush(p.c);
	long end;
	cr_assert_eq(h_read_all(p.s, in, sizeof(in), &end), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), 9, 0));
	long r = -EAGAIN;
	uint64_t until = h_ms() + 10000;
	while ((r = h_read(p.s, in, 1, MSG_DONTWAIT)) == -EAGAIN && h_ms() < until)
		usleep(1000);
	cr_assert_eq(r, 0, "no end of stream after the exit: %ld", r);
	cr_assert_eq(h_state(p.s), SV_CONN_RDMA, "server: %s", sv_conn_state_name(h_state(p.s)));
	h_pair_free(&p);
}
