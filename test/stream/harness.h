/* The stream-layer tests' harness: real streams (src/stream*.c), the real
 * upgrade and helper thread, over the fake RDMA network (fake_net.h) and
 * real kernel TCP connections on loopback. Each test runs in its own
 * process (Criterion's default), so the helper thread and the library's
 * settings start afresh. */
#ifndef SV_TEST_HARNESS_H
#define SV_TEST_HARNESS_H

#include "fake_net.h"
#include "stream_int.h"
#include "upgrade.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* Settings for a test: SOVIA_* defaults, no upgrade delay, small buffers
 * (so that a transfer is many messages), the fake network. */
void h_setup(void);
/* Everything ended cleanly on the fake network. */
void h_teardown(void);

struct pair {
	int lfd;                 /* the listening socket */
	struct sv_listener *l;   /* its RDMA listener (NULL: none) */
	int cfd, sfd;            /* the client's and the server's sockets */
	struct sv_stream *c, *s; /* their streams */
};

/* A listening socket on 127.0.0.1 (any port), with an RDMA listener
 * beside it unless `rdma` is false. */
void h_listen(struct pair *p, bool rdma);
/* The same on loopback port `port` (0: any): 0, or -errno of bind. */
int h_listen_at(struct pair *p, bool rdma, uint16_t port);
/* The server's side accepted by an application that reads or waits on it
 * at once (its upgrade request waits for that: sv_stream_app_uses). */
void h_start_server(struct sv_stream *s, struct sv_listener *l);
/* Connect a client to it and accept; both become streams and start their
 * upgrade (the client's on its own, the server's waiting for a request). */
void h_connect(struct pair *p);
/* ... only the TCP connection: p's two sockets, not streams yet. */
void h_connect_sockets(struct pair *p);
/* Both, and wait until both streams are on RDMA. */
void h_pair_rdma(struct pair *p);
/* Drop the test's references (the streams' fds are closed or not, as the
 * test left them). */
void h_pair_free(struct pair *p);

/* The stream's state, and a bounded wait for one (returns the state it
 * ended in). */
enum sv_conn_state h_state(struct sv_stream *s);
enum sv_fallback h_fallback(struct sv_stream *s);
enum sv_conn_state h_wait_state(struct sv_stream *s, enum sv_conn_state want, int ms);

/* 5,000 bytes of pattern `seed` each way over the pair, checked, and the
 * medium that carried them: all of them over RDMA (rdma), or all over TCP
 * with nothing ever on RDMA. */
void h_exchange(struct pair *p, uint64_t seed, bool rdma);

/* Bytes each way by medium. */
struct h_counts {
	uint64_t rdma_tx, rdma_rx, tcp_tx, tcp_rx, gave_back, got_back;
};
struct h_counts h_counts(struct sv_stream *s);

/* The stream's calls, on one buffer. */
long h_write(struct sv_stream *s, const void *buf, size_t n, int flags);
long h_read(struct sv_stream *s, void *buf, size_t n, int flags);
/* Write all of it (blocking); the bytes written, or -errno at the first
 * failure that wrote nothing more. */
long h_write_all(struct sv_stream *s, const void *buf, size_t n);
/* Read until n bytes, EOF or an error; *end gets 0 (EOF), -errno, or 1
 * (n bytes read, no end seen). Returns the bytes read. */
size_t h_read_all(struct sv_stream *s, void *buf, size_t n, long *end);

/* A reproducible byte pattern: byte i of stream `seed`. */
void h_pattern(uint8_t *buf, size_t n, uint64_t seed, uint64_t from);
/* Does buf hold bytes [from, from + n) of stream `seed`? */
bool h_pattern_ok(const uint8_t *buf, size_t n, uint64_t seed, uint64_t from);

/* A thread that writes `len` bytes of pattern `seed` to a stream, then
 * shuts its sending down (or closes the stream's fd, with close_fd). */
struct h_writer {
	struct sv_stream *s;
	int fd;
	size_t len;
	uint64_t seed;
	bool close_fd;
	long written;  /* result */
	int end;       /* the shutdown's or close's result */
	pthread_t t;
};
void h_writer_start(struct h_writer *w);
void h_writer_join(struct h_writer *w);

/* Monotonic milliseconds, real: the bound of a test's own waits for
 * another thread's progress. */
uint64_t h_ms(void);

/* Virtual time. The library's clock (sv_now_us) is the real one plus the
 * warps so far: a test moves it past a timer of seconds instead of
 * sleeping through it. h_now_ms is that clock, in milliseconds: the
 * measure of how long the library let something take. */
uint64_t h_now_ms(void);
/* Move the library's clock `ms` forward, then wait until the helper has
 * made a whole round with the new time (h_helper_round): whatever it was
 * to do by then is done or under way. A thread of the test asleep in a
 * stream's wait: h_warp_sleeper_ms. */
void h_warp_ms(uint64_t ms);
/* Wait until the helper thread has looked at everything it watches with
 * the clock as it is now (two of its jobs, one after the other: the second
 * runs after a round that began after the first). Nothing when the helper
 * never started, or while the test holds rdma_cm's start on it. */
void h_helper_round(void);
/* h_wait_state where the state waits for the library's timers (an
 * upgrade's retries, its deadline): the clock moves on in steps of
 * H_WARP_STEP_MS, each after a round of the helper, for at most `ms` of
 * it. It stands still while s is in an exchange (h_exchanging). */
#define H_WARP_STEP_MS 10
enum sv_conn_state h_wait_state_warp(struct sv_stream *s, enum sv_conn_state want, int ms);
/* Is s in an exchange that work ends, not a timer (resolving its peer,
 * switching to the QP)? Moving the clock meanwhile could only let the
 * upgrade's deadline win over work that takes real time. */
bool h_exchanging(struct sv_stream *s);
/* Move the clock `ms` on in those steps: every look and retry the helper
 * would make meanwhile, it makes. */
void h_warp_steps_ms(uint64_t ms);
/* Until a thread sleeps in the kernel in one of s's waits (its spin
 * over), or ms pass: whether one does. */
bool h_wait_asleep(struct sv_stream *s, int ms);
/* h_warp_ms, then the thread asleep in s's wait looks at the new time (a
 * sleep on a deadline taken before the warp lasts until woken): woken, it
 * judges again and sleeps again (waited for, up to 2 s), or leaves its
 * wait. */
void h_warp_sleeper_ms(uint64_t ms, struct sv_stream *s);
/* The descriptors this process has open. */
int h_open_fds(void);
/* The helper thread's looks at s so far (its statistics' helper_looks). */
uint64_t h_helper_looks(struct sv_stream *s);

/* In a test's child process (no Criterion there): the checks exit with
 * their number, which the parent reports. */
#define CHILD_CHECK(n, cond)                                                                \
	do {                                                                                \
		if (!(cond))                                                                \
			_exit(n);                                                           \
	} while (0)

#endif
