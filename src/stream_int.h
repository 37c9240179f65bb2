/* Internals shared by the stream's modules (stream.c, stream_rx.c,
 * stream_tx.c, close.c). Every function here is called with s->lock held. */
#ifndef SV_STREAM_INT_H
#define SV_STREAM_INT_H

#include "stream.h"

#include <poll.h>

/* Sleep until a completion, TCP readiness (tcp_events), a wake-up or the
 * deadline (0 = none). Drops the lock while asleep. Returns 0; 1 when it
 * ended by taking completions off the CQ and emptying it, lock held since
 * (the caller need not poll again at once: sv_stream_progress_drained);
 * or -EINTR. */
int sv_stream_wait(struct sv_stream *s, short tcp_events, uint64_t deadline);
/* The same, for a caller that read the clock just before (nothing that
 * blocks since) and goes on after the wait: *now is that reading on entry
 * and the clock at the wait's end on return. Each read is a system call on
 * some clocks (the bed's HPET: 3.4 us), and a ping-pong's read waits once
 * per message. */
int sv_stream_wait_at(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *now);
/* sv_stream_wait_at for a send or receive call of the application that
 * found the fd blocking (sv_stream_blocking): before it sleeps in the
 * kernel it checks the mode again, and returns -EAGAIN if the fd is
 * non-blocking now. */
int sv_stream_app_wait(struct sv_stream *s, short tcp_events, uint64_t deadline, uint64_t *now);

/* Wake every thread sleeping in sv_stream_wait on this stream. */
void sv_stream_wake(struct sv_stream *s);

/* Poll the completion queue into the core and make any progress that
 * completions allow (the echo, a finished switch). Returns 0 or -errno. */
int sv_stream_progress(struct sv_stream *s);
/* The same, with the clock already read (one read per call on the data
 * path: without a vDSO clock source, as under emulation, each is a syscall). */
int sv_stream_progress_at(struct sv_stream *s, uint64_t now);
/* The same right after a wait that returned 1: the CQ was emptied under
 * the lock a moment ago, so only the rest (timers, echo, way back) runs.
 * Under emulation an empty look at the CQ (the provider's lock, a call
 * per layer) was 0.1-0.15 us of a 64 B ping-pong's path per message
 * (TSC probes in the bed, docs/benchmarks.md). */
int sv_stream_progress_drained(struct sv_stream *s, uint64_t now);
/* The same for a send, which checks the delayed ACK after posting: the
 * data it posts carries the ACK that timer would send, and checking it
 * first would read the clock for nothing. The timers run here only for a
 * coalesced buffer (due, it goes before the new bytes are added), and
 * only in one write of SV_TX_TIMER_EVERY without a clock reading. */
#define SV_TX_TIMER_EVERY 16
int sv_stream_progress_before_send(struct sv_stream *s, uint64_t now);

/* The QP is unusable: deliver what it already carried, then fall back to
 * TCP for the rest (or report err). */
void sv_stream_break(struct sv_stream *s, int err);

/* Is the fd in blocking mode for this call? Blocking as last seen: no
 * fcntl for a blocking fd's calls (the application's waits check again). */
bool sv_stream_blocking(struct sv_stream *s, int flags);

/* Both directions settled on the QP: the connection is "rdma". */
void sv_stream_maybe_rdma(struct sv_stream *s);

/* Client: give up waiting for the server's proof; sending goes back to TCP. */
void sv_stream_unhold(struct sv_stream *s, const char *why);

/* Receive side: a verified challenge moved the peer's sending to the QP. */
void sv_stream_rx_switched(struct sv_stream *s);

/* Read TCP (never blocking) into iov, never past the peer's switch point;
 * bytes past it are its challenge echo. Returns bytes of application data
 * (> 0), 0 at TCP EOF, -EAGAIN, or -errno. */
long sv_stream_tcp_read(struct sv_stream *s, const struct iovec *iov, int iovcnt, int flags);

/* Read the peer's TCP bytes up to its announced switch point into the
 * stream's buffer, then its challenge echo, so a switch completes while the
 * application is not reading (or has closed). Lock held. */
void sv_stream_pump_tcp(struct sv_stream *s);

/* Write the echo of the peer's challenge once our TO_RDMA completed. */
int sv_stream_write_echo(struct sv_stream *s);

/* Wait (bounded) until everything sent over the QP has left this process:
 * nothing held back, every send completed. */
void sv_stream_drain(struct sv_stream *s);

/* Append bytes to the TCP bytes waiting for the application. */
int sv_stream_tcpbuf_append(struct sv_stream *s, const void *data, size_t len);

/* The application closed its fd: finish the connection (helper thread).
 * Returns the next deadline; sets *done when the stream is finished. */
uint64_t sv_stream_linger(struct sv_stream *s, uint64_t now, bool *done);

/* The part of an iovec after `skip` bytes (at most 64 entries). */
struct iovec;
int sv_iov_advance(const struct iovec *iov, int iovcnt, size_t skip, struct iovec *out);

/* SO_RCVTIMEO/SO_SNDTIMEO as the kernel's socket has them (under the lock). */
void sv_stream_load_timeouts(struct sv_stream *s);
/* A blocking call's timeout (`timeo_us`, 0 = none) from its first wait:
 * *at is set on the first call; true once it has passed. */
bool sv_stream_timed_out(uint64_t timeo_us, uint64_t *at);

/* The connection's error as the application sees it, like the kernel's
 * sk_err: reported once (by whichever call comes first); after that a send
 * gets EPIPE and a receive the end of the stream. Under the lock. */
long sv_stream_app_error(struct sv_stream *s, bool sending);

/* Is an upgrade still possible, so TCP reads must watch for a TO_RDMA? */
static inline bool sv_stream_may_switch(const struct sv_stream *s)
{
	switch (s->state) {
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
	case SV_CONN_SWITCHING:
	case SV_CONN_RDMA:
		return true;
	case SV_CONN_FALLBACK:
	case SV_CONN_BROKEN:
	case SV_CONN_DETACHING:
	case SV_CONN_DETACHED:
		return false;
	}
	return true;
}

/* TCP carries both directions for good: our part is only a pass-through. */
static inline bool sv_stream_tcp_only(const struct sv_stream *s)
{
	return s->state == SV_CONN_DETACHED ||
	       (s->state == SV_CONN_FALLBACK && !s->proto_ready);
}

/* Detaching: answer the peer's BACK, give back, write what came back. */
void sv_stream_back_progress(struct sv_stream *s);

/* Kernel shutdown(SHUT_WR) held back while our sending was on the QP (so
 * that bytes given back can still go on TCP): do it if it may go now. */
void sv_stream_kernel_shut(struct sv_stream *s);

/* The helper's part of a detached stream: end the QP after a grace period. */
uint64_t sv_stream_detached_service(struct sv_stream *s, uint64_t now, bool *done);

#endif
