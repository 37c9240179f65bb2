/* sendfile and splice on a connection libsovia serves go through the
 * stream (preload/sendfile.c): the bytes keep their place among the
 * writes around them, the connection stays on RDMA, and offsets, counts,
 * partial writes and errors are the kernel's. copy_file_range is the
 * kernel's alone: it refuses a socket. */
#include "preload_harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <unistd.h>

TestSuite(sendfile, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* A file of `len` bytes: bytes [from, from + len) of stream `seed`. */
static int pattern_file(size_t len, uint64_t seed, uint64_t from)
{
	char path[] = "/tmp/sovia-sendfile-XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	unlink(path);
	uint8_t *b = malloc(len);
	h_pattern(b, len, seed, from);
	cr_assert_eq(pwrite(fd, b, len, 0), (ssize_t)len);
	free(b);
	return fd;
}

/* A thread that reads n bytes off fd and checks they are bytes [from,
 * from + n) of stream `seed`. */
struct reader {
	int fd;
	size_t n;
	uint64_t seed, from;
	size_t got;
	bool ok;
	pthread_t t;
};

static void *reader_run(void *arg)
{
	struct reader *r = arg;
	uint8_t *b = malloc(r->n);
	r->got = ph_read_all(r->fd, b, r->n);
	r->ok = r->got == r->n && h_pattern_ok(b, r->n, r->seed, r->from);
	free(b);
	return NULL;
}

static void reader_start(struct reader *r, int fd, size_t n, uint64_t seed, uint64_t from)
{
	*r = (struct reader){.fd = fd, .n = n, .seed = seed, .from = from};
	cr_assert_eq(pthread_create(&r->t, NULL, reader_run, r), 0);
}

static void reader_join(struct reader *r)
{
	pthread_join(r->t, NULL);
	cr_assert_eq(r->got, r->n, "the reader got %zu of %zu bytes", r->got, r->n);
	cr_assert(r->ok, "the reader's bytes are not the stream's, in order");
}

/* The client's bytes all went over the QP, and it is still libsovia's. */
static void still_on_rdma(struct pair *p, uint64_t tcp_before, uint64_t at_least)
{
	cr_assert_not_null(ph_stream(p->cfd), "the client's fd is not libsovia's any more");
	cr_assert_eq(h_state(p->c), SV_CONN_RDMA, "client: %s", sv_conn_state_name(h_state(p->c)));
	cr_assert_eq(h_state(p->s), SV_CONN_RDMA, "server: %s", sv_conn_state_name(h_state(p->s)));
	struct h_counts c = h_counts(p->c);
	cr_assert_eq(c.tcp_tx, tcp_before, "bytes went over TCP (%llu, were %llu)",
		     (unsigned long long)c.tcp_tx, (unsigned long long)tcp_before);
	cr_assert_geq(c.rdma_tx, at_least, "only %llu bytes over RDMA, %llu written",
		      (unsigned long long)c.rdma_tx, (unsigned long long)at_least);
}

/* write, sendfile (several chunks of libsovia's), write: the server reads
 * the three in order, all of it over RDMA; *off moves by the count, the
 * file's own offset stays. */
Test(sendfile, keeps_the_connection_on_rdma_and_its_bytes_in_order)
{
	enum { HEAD = 1000, FILE_LEN = 300000, TAIL = 1000, ALL = HEAD + FILE_LEN + TAIL };
	struct pair p;
	ph_pair_rdma(&p);
	uint64_t tcp0 = h_counts(p.c).tcp_tx;
	int file = pattern_file(FILE_LEN, 51, HEAD);
	struct reader r;
	reader_start(&r, p.sfd, ALL, 51, 0);
	uint8_t b[TAIL];
	h_pattern(b, HEAD, 51, 0);
	cr_assert_eq(ph_write_all(p.cfd, b, HEAD), HEAD);
	off_t off = 0;
	cr_assert_eq(sendfile(p.cfd, file, &off, FILE_LEN), FILE_LEN, "%s", strerror(errno));
	cr_assert_eq(off, FILE_LEN);
	cr_assert_eq(lseek(file, 0, SEEK_CUR), 0, "sendfile with an offset moved the file's");
	h_pattern(b, TAIL, 51, HEAD + FILE_LEN);
	cr_assert_eq(ph_write_all(p.cfd, b, TAIL), TAIL);
	reader_join(&r);
	still_on_rdma(&p, tcp0, ALL);
	close(file);
	ph_pair_close(&p);
}

/* sendfile64 and off == NULL: the bytes from the file's offset, which
 * moves by the count. */
Test(sendfile, without_an_offset_moves_the_files_offset)
{
	enum { SKIP = 100, N = 5000 };
	struct pair p;
	ph_pair_rdma(&p);
	uint64_t tcp0 = h_counts(p.c).tcp_tx;
	int file = pattern_file(SKIP + N + 50, 52, 0);
	cr_assert_eq(lseek(file, SKIP, SEEK_SET), SKIP);
	struct reader r;
	reader_start(&r, p.sfd, N, 52, SKIP);
	cr_assert_eq(sendfile64(p.cfd, file, NULL, N), N, "%s", strerror(errno));
	cr_assert_eq(lseek(file, 0, SEEK_CUR), SKIP + N);
	reader_join(&r);
	close(file);
	still_on_rdma(&p, tcp0, N);
	ph_pair_close(&p);
}

/* A count past the end of the file sends what is there; at the end, 0. */
Test(sendfile, past_the_end_sends_what_is_there)
{
	struct pair p;
	ph_pair_rdma(&p);
	int file = pattern_file(1000, 54, 0);
	off_t off = 900;
	cr_assert_eq(sendfile(p.cfd, file, &off, 5000), 100);
	cr_assert_eq(off, 1000);
	cr_assert_eq(sendfile(p.cfd, file, &off, 5000), 0);
	cr_assert_eq(off, 1000);
	cr_assert_eq(lseek(file, 990, SEEK_SET), 990);
	cr_assert_eq(sendfile(p.cfd, file, NULL, 5000), 10);
	cr_assert_eq(lseek(file, 0, SEEK_CUR), 1000);
	uint8_t in[110], want[110];
	h_pattern(want, 100, 54, 900);
	h_pattern(want + 100, 10, 54, 990);
	cr_assert_eq(ph_read_all(p.sfd, in, 110), 110);
	cr_assert_eq(memcmp(in, want, 110), 0);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(p.c)));
	close(file);
	ph_pair_close(&p);
}

/* The server reads nothing, so the non-blocking client's window fills: a
 * sendfile takes part of the file, and the offset (*off, or the file's
 * own) moves by exactly what each call took; EAGAIN moves nothing. Then a
 * blocking one sends the rest, and every byte arrives in order. */
Test(sendfile, a_partial_write_moves_the_offset_by_what_the_stream_took)
{
	enum { LEN = 1 << 20 };
	struct pair p;
	ph_pair_rdma(&p);
	uint64_t tcp0 = h_counts(p.c).tcp_tx;
	int file = pattern_file(LEN, 55, 0);
	cr_assert_eq(fcntl(p.cfd, F_SETFL, O_NONBLOCK), 0);
	off_t off = 0;
	ssize_t r = sendfile(p.cfd, file, &off, LEN);
	cr_assert(r > 0 && r < LEN, "a first sendfile into a window that fills: %zd (%s)", r,
		  strerror(errno));
	cr_assert_eq(off, r, "*off is %lld after %zd bytes", (long long)off, r);
	cr_assert_eq(lseek(file, 0, SEEK_CUR), 0);
	for (;;) { /* until the window is full */
		off_t before = off;
		r = sendfile(p.cfd, file, &off, (size_t)(LEN - off));
		if (r < 0) {
			cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
			cr_assert_eq(off, before, "EAGAIN moved *off");
			break;
		}
		cr_assert_eq(off, before + r, "*off is %lld after %zd more bytes from %lld",
			     (long long)off, r, (long long)before);
	}
	cr_assert_eq(lseek(file, 0, SEEK_CUR), 0, "sendfile with an offset moved the file's");
	cr_assert_eq(lseek(file, off, SEEK_SET), off);
	for (;;) { /* the same, with the file's offset */
		r = sendfile(p.cfd, file, NULL, (size_t)(LEN - off));
		if (r < 0) {
			cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
			break;
		}
		off += r;
	}
	cr_assert_eq(lseek(file, 0, SEEK_CUR), off, "the file's offset is %lld after %lld bytes",
		     (long long)lseek(file, 0, SEEK_CUR), (long long)off);
	cr_assert_lt(off, LEN, "the window took the whole file");

	struct reader rd;
	reader_start(&rd, p.sfd, LEN, 55, 0);
	cr_assert_eq(fcntl(p.cfd, F_SETFL, 0), 0);
	cr_assert_eq(sendfile(p.cfd, file, NULL, LEN), LEN - off, "%s", strerror(errno));
	cr_assert_eq(lseek(file, 0, SEEK_CUR), LEN);
	reader_join(&rd);
	still_on_rdma(&p, tcp0, LEN);
	close(file);
	ph_pair_close(&p);
}

/* The kernel's errors, before any byte moves. */
Test(sendfile, errors_are_the_kernels)
{
	struct pair p;
	ph_pair_rdma(&p);
	int file = pattern_file(100, 56, 0);
	off_t off = -1;
	cr_assert_eq(sendfile(p.cfd, file, &off, 10), -1);
	cr_assert_eq(errno, EINVAL);
	int bad = dup(file);
	close(bad);
	cr_assert_eq(sendfile(p.cfd, bad, NULL, 10), -1);
	cr_assert_eq(errno, EBADF, "%s", strerror(errno));
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", file);
	int wo = open(path, O_WRONLY);
	cr_assert_geq(wo, 0);
	cr_assert_eq(sendfile(p.cfd, wo, NULL, 10), -1);
	cr_assert_eq(errno, EBADF);
	off = 0;
	cr_assert_eq(sendfile(p.cfd, file, &off, 0), 0);
	cr_assert_eq(h_counts(p.c).rdma_tx, 0);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(p.c)));
	close(wo);
	close(file);
	ph_pair_close(&p);
}

/* The client's side of the splice test: write, a pipe's bytes spliced
 * to the socket, write. */
struct splicer {
	int fd, pipe;
	const uint8_t *b;
	size_t head, mid, tail;
	bool ok;
	pthread_t t;
};

static void *splicer_run(void *arg)
{
	struct splicer *w = arg;
	w->ok = ph_write_all(w->fd, w->b, w->head) == (long)w->head;
	for (size_t done = 0; w->ok && done < w->mid;) {
		ssize_t n = splice(w->pipe, NULL, w->fd, NULL, w->mid - done, 0);
		w->ok = n > 0;
		done += n > 0 ? (size_t)n : 0;
	}
	w->ok = w->ok && ph_write_all(w->fd, w->b + w->head + w->mid, w->tail) == (long)w->tail;
	return NULL;
}

/* Splice both ways: write, then a pipe's bytes to the client's socket,
 * then write; the server splices its socket into a pipe. Every byte in
 * order, all over RDMA. */
Test(sendfile, splice_pipe_to_socket_and_socket_to_pipe)
{
	enum { HEAD = 700, MID = 50000, TAIL = 300, ALL = HEAD + MID + TAIL };
	struct pair p;
	ph_pair_rdma(&p);
	uint64_t tcp0 = h_counts(p.c).tcp_tx;
	int in[2], out[2];
	cr_assert_eq(pipe(in), 0);
	cr_assert_eq(pipe(out), 0);
	cr_assert_eq(fcntl(in[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
	uint8_t *b = malloc(ALL), *got = malloc(ALL);
	h_pattern(b, ALL, 57, 0);
	cr_assert_eq(write(in[1], b + HEAD, MID), MID);
	struct splicer w = {.fd = p.cfd, .pipe = in[0], .b = b, .head = HEAD, .mid = MID,
			    .tail = TAIL};
	cr_assert_eq(pthread_create(&w.t, NULL, splicer_run, &w), 0);
	size_t have = 0;
	while (have < ALL) {
		ssize_t n = splice(p.sfd, NULL, out[1], NULL, ALL - have, 0);
		cr_assert_gt(n, 0, "splice socket to pipe: %s", strerror(errno));
		cr_assert_eq(read(out[0], got + have, (size_t)n), n);
		have += (size_t)n;
	}
	pthread_join(w.t, NULL);
	cr_assert(w.ok, "the client's write, splice, write");
	cr_assert_eq(memcmp(got, b, ALL), 0, "the bytes through the pipes");
	still_on_rdma(&p, tcp0, ALL);
	for (int i = 0; i < 2; i++) {
		close(in[i]);
		close(out[i]);
	}
	free(b);
	free(got);
	ph_pair_close(&p);
}

/* SPLICE_F_NONBLOCK is the pipe's side: an empty pipe says EAGAIN, a full
 * one too, and the stream's bytes stay for the next read. The socket's
 * side follows the socket: a non-blocking one with nothing says EAGAIN. */
Test(sendfile, splice_nonblocking_sides_are_the_kernels)
{
	struct pair p;
	ph_pair_rdma(&p);
	int pp[2];
	cr_assert_eq(pipe(pp), 0);
	cr_assert_eq(splice(pp[0], NULL, p.cfd, NULL, 100, SPLICE_F_NONBLOCK), -1);
	cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
	cr_assert_eq(fcntl(p.sfd, F_SETFL, O_NONBLOCK), 0);
	cr_assert_eq(splice(p.sfd, NULL, pp[1], NULL, 100, 0), -1);
	cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));

	int page = (int)sysconf(_SC_PAGESIZE);
	cr_assert_eq(fcntl(pp[1], F_SETPIPE_SZ, page), page);
	uint8_t *fill = calloc(1, (size_t)page);
	cr_assert_eq(write(pp[1], fill, (size_t)page), page);
	cr_assert_eq(write(p.cfd, "abc", 3), 3);
	uint8_t b[3];
	while (recv(p.sfd, b, 3, MSG_PEEK) != 3) { /* the bytes are there */
		struct pollfd pfd = {.fd = p.sfd, .events = POLLIN};
		cr_assert_eq(poll(&pfd, 1, 10000), 1);
	}
	cr_assert_eq(splice(p.sfd, NULL, pp[1], NULL, 3, SPLICE_F_NONBLOCK), -1);
	cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
	cr_assert_eq(read(p.sfd, b, 3), 3, "the stream's bytes stayed");
	cr_assert_eq(memcmp(b, "abc", 3), 0);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(p.c)));
	free(fill);
	close(pp[0]);
	close(pp[1]);
	ph_pair_close(&p);
}

/* A pipe's bytes the stream does not take stay in the pipe. */
Test(sendfile, splice_leaves_in_the_pipe_what_the_stream_did_not_take)
{
	enum { LEN = 1 << 20 };
	struct pair p;
	ph_pair_rdma(&p);
	int pp[2];
	cr_assert_eq(pipe(pp), 0);
	cr_assert_eq(fcntl(pp[1], F_SETPIPE_SZ, LEN), LEN);
	uint8_t *b = malloc(LEN), *got = malloc(LEN);
	h_pattern(b, LEN, 58, 0);
	cr_assert_eq(write(pp[1], b, LEN), LEN);
	cr_assert_eq(fcntl(p.cfd, F_SETFL, O_NONBLOCK), 0);
	size_t sent = 0;
	for (;;) {
		ssize_t n = splice(pp[0], NULL, p.cfd, NULL, LEN - sent, 0);
		if (n < 0) {
			cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
			break;
		}
		cr_assert_gt(n, 0);
		sent += (size_t)n;
		cr_assert_lt(sent, (size_t)LEN, "the window took a whole MiB");
	}
	int inq = 0;
	cr_assert_eq(ioctl(pp[0], FIONREAD, &inq), 0);
	cr_assert_eq((size_t)inq, LEN - sent, "the pipe holds %d, %zu were not sent", inq,
		     LEN - sent);
	cr_assert_eq(ph_read_all(p.sfd, got, sent), sent);
	cr_assert_eq(read(pp[0], got + sent, LEN - sent), (ssize_t)(LEN - sent));
	cr_assert_eq(memcmp(got, b, LEN), 0, "what went and what stayed, together");
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(p.c)));
	free(b);
	free(got);
	close(pp[0]);
	close(pp[1]);
	ph_pair_close(&p);
}

/* copy_file_range is the kernel's: it refuses a socket either way (EINVAL)
 * and moves nothing; the connection stays on RDMA, its bytes in order. */
Test(sendfile, copy_file_range_refuses_a_socket_and_moves_nothing)
{
	struct pair p;
	ph_pair_rdma(&p);
	int file = pattern_file(100, 59, 0);
	cr_assert_eq(write(p.cfd, "one", 3), 3);
	cr_assert_eq(copy_file_range(file, NULL, p.cfd, NULL, 100, 0), -1);
	cr_assert_eq(errno, EINVAL, "%s", strerror(errno));
	cr_assert_eq(copy_file_range(p.sfd, NULL, file, NULL, 100, 0), -1);
	cr_assert_eq(errno, EINVAL, "%s", strerror(errno));
	cr_assert_eq(write(p.cfd, "two", 3), 3);
	char b[6];
	cr_assert_eq(ph_read_all(p.sfd, b, 6), 6);
	cr_assert_eq(memcmp(b, "onetwo", 6), 0);
	cr_assert_eq(lseek(file, 0, SEEK_CUR), 0);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA, "%s", sv_conn_state_name(h_state(p.c)));
	close(file);
	ph_pair_close(&p);
}
