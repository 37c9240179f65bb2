/* Lingering close: close() returns at once, and the helper thread delivers
 * what is still queued before the connection ends. */
#include "harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
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
