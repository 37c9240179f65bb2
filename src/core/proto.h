/* The SOVIA protocol core: one direction pair of a connection over a
 * reliable, in-order message transport (an RC queue pair, or the in-process
 * fake used by the unit tests).
 *
 * It owns flow control (credits), acknowledgements, coalescing, the medium
 * switch accounting and the wire format, and nothing else: no locks, no
 * blocking, no threads, no clock of its own (the caller lends it one,
 * clock.h). The caller (the stream layer) serialises calls, polls the
 * transport and feeds completions back, and waits when an operation returns
 * -EAGAIN. Its state is private to src/core/proto*.c: everything the stream
 * needs to know or change goes through the calls below, so the core's
 * invariants hold whatever its callers do.
 *
 * The wire format, field by field with its TCP counterpart, and the ACK and
 * coalescing policy are written down in docs/protocol.md; keep them in step. */
#ifndef SV_PROTO_H
#define SV_PROTO_H

#include "clock.h"
#include "config.h"
#include "le.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* ---- Wire format ------------------------------------------------------ */

#define SV_HDR_SIZE 24
#define SV_CHALLENGE_SIZE 8 /* bytes of the upgrade challenge echoed on TCP */
#define SV_RESERVE 4        /* control-message reserve, the same on every peer */
/* SV_WINDOW_MAX (config.h), SOVIA_WINDOW's largest, is also the most data
 * receive buffers (credits) a peer may have: a peer that says it posted
 * more is no libsovia's, and each buffer it claims widens what it may hold
 * unread (proto_back.c). */
/* The most of our bytes a peer may hold unread when it gives them back
 * (BACK): they come back to us and wait in memory for TCP. */
#define SV_BACK_UNREAD_MAX (64u << 20)

enum sv_msg_type {
	SV_MSG_DATA = 1,       /* stream bytes; payload = the bytes */
	SV_MSG_UPDATE = 2,     /* credits/ack only, no payload */
	SV_MSG_TO_RDMA = 3,    /* TCP carried [.., seq); the QP carries from seq on.
				* TCP then carries the receiver's challenge once */
	SV_MSG_TO_TCP = 4,     /* the QP carried [.., seq); TCP carries from seq on */
	SV_MSG_FIN = 5,        /* no more data after seq (shutdown(SHUT_WR)) */
	SV_MSG_RESET = 6,      /* abort: the peer gets ECONNRESET */
	SV_MSG_BACK = 7,       /* detach: the QP carried my bytes up to seq, TCP carries
				* the rest; payload (8 bytes): X, the bytes of your
				* stream my application consumed. Your bytes from X on
				* come back to you in RETURN messages. Answered by a
				* BACK from the peer. */
	SV_MSG_RETURN = 8,     /* payload: bytes of the receiver's own stream at seq,
				* given back unread: it writes them on TCP first */
	SV_MSG_DRAIN = 9,      /* no payload: it only spends one of the receiver's
				* buffers. The sender's direction went idle and it
				* gives the receiver's grown buffers back: from the
				* first DRAIN on, the receiver posts its buffers at the
				* set-up size (docs/protocol.md, 5) */
};

#define SV_BACK_PAYLOAD 8

/* The header's size codes (flags): a buffer of code k holds 2^k payload
 * bytes and the header. */
#define SV_SIZE_CODE_MIN 10
#define SV_SIZE_CODE_MAX 20

/* The code of a payload size, or 0 if it has none (not a power of two in
 * range). */
static inline uint8_t sv_size_code(uint32_t payload)
{
	for (uint8_t k = SV_SIZE_CODE_MIN; k <= SV_SIZE_CODE_MAX; k++)
		if (payload == 1u << k)
			return k;
	return 0;
}

/* The header, as it is on the wire: little-endian, packed, 24 bytes. */
struct sv_hdr {
	uint8_t type;     /* enum sv_msg_type */
	uint8_t flags;    /* the size of the receive buffers `credits` reports:
			   * 0 = the size the connection set-up gave, k in
			   * [SV_SIZE_CODE_MIN, SV_SIZE_CODE_MAX] = 2^k payload bytes;
			   * never smaller than an earlier report's, except once
			   * after the peer's DRAIN */
	uint16_t credits; /* receive buffers reposted since the last report */
	uint32_t len;     /* payload bytes after the header */
	uint64_t seq;     /* stream offset of the first payload byte (or of the event) */
	uint64_t ack;     /* stream bytes received from the peer, cumulative */
};

/* Inline: every message sent and received goes through them. */
static inline void sv_hdr_encode(const struct sv_hdr *h, uint8_t out[SV_HDR_SIZE])
{
	out[0] = h->type;
	out[1] = h->flags;
	sv_put16(out + 2, h->credits);
	sv_put32(out + 4, h->len);
	sv_put64(out + 8, h->seq);
	sv_put64(out + 16, h->ack);
}

static inline void sv_hdr_decode(const uint8_t in[SV_HDR_SIZE], struct sv_hdr *h)
{
	h->type = in[0];
	h->flags = in[1];
	h->credits = sv_get16(in + 2);
	h->len = sv_get32(in + 4);
	h->seq = sv_get64(in + 8);
	h->ack = sv_get64(in + 16);
}

/* ---- The transport under the core --------------------------------------- */

/* What the core needs from a message transport. Buffers are numbered: the
 * transport owns (and has registered) `nrecv` receive buffers and `nsend`
 * send buffers of `buf_size` bytes each. Every function returns 0 or -errno. */
/* User iovec pieces one zero-copy message carries at most: the core slices
 * a zero-copy write so; a transport takes one scatter/gather entry more
 * for the header. */
#define SV_ZCOPY_MAX_IOV 8

struct sv_xport_ops {
	/* Address of receive buffer i / send buffer i. */
	void *(*recv_buf)(void *xp, uint32_t i);
	void *(*send_buf)(void *xp, uint32_t i);
	/* Post receive buffer i to receive one message: at buf_size (big,
	 * only after grow(recv)) or at start_size. */
	int (*post_recv)(void *xp, uint32_t i, bool big);
	/* Send one message: the first `len` bytes of send buffer `slot`, then
	 * (zero copy) the user memory in iov[0..iovcnt) which the transport
	 * registers itself. iovcnt is 0 for the copy path, at most
	 * SV_ZCOPY_MAX_IOV for zero copy. The completion
	 * reports `slot` back through sv_proto_on_send_done. */
	int (*post_send)(void *xp, uint32_t slot, uint32_t len, const struct iovec *iov,
			 int iovcnt);
	/* Buffers start at start_size and may grow to buf_size (parameters
	 * below). Optional: NULL, and they never grow.
	 * grow: make buf_size buffers for every receive buffer (recv true)
	 * or send buffer: 0, or -errno (-ENOBUFS: no locked memory for
	 * them), and they stay at start_size. After grow(recv), every
	 * post_recv posts the buffer at buf_size.
	 * send_big: send buffer `slot`, free now, is at buf_size from now on
	 * (the core calls it after grow(send), as it takes each slot).
	 * shrink: no buffer of that direction is at buf_size any more (none
	 * posted, none holding a message, no send buffer in flight): the
	 * transport frees them, and every buffer is at start_size again
	 * until the next grow. Optional when grow is NULL. */
	int (*grow)(void *xp, bool recv);
	void (*send_big)(void *xp, uint32_t slot);
	void (*shrink)(void *xp, bool recv);
};

struct sv_xport {
	const struct sv_xport_ops *ops;
	void *ctx;
};

/* ---- Parameters, statistics --------------------------------------------- */

struct sv_proto_params {
	uint32_t window;        /* w: data credits (receive buffers for data) */
	uint32_t reserve;       /* c: extra receive buffers for control messages, >= 3
				 * (SV_RESERVE in practice: both peers must agree) */
	uint32_t buf_size;      /* bytes per buffer, header included */
	uint32_t start_size;    /* ... at first: they grow to buf_size with the
				 * traffic (docs/protocol.md, 5). 0, or not
				 * below buf_size: fixed at buf_size. Growth
				 * needs buf_size - header to be a power of two
				 * with a size code, else it is off. */
	uint32_t ack_delay;     /* t: consumed data buffers before an UPDATE */
	uint64_t ack_timeout_us;
	bool coalesce;          /* false = TCP_NODELAY */
	uint32_t coalesce_size; /* small-write threshold and coalescing buffer limit */
	uint64_t coalesce_timeout_us;
	uint32_t zcopy_threshold; /* writes >= this go zero copy */
	uint64_t idle_us;       /* our sending idle this long gives the peer's grown
				 * buffers back (DRAIN); 0: never */
};

/* The size buffers have at first (header included). */
static inline uint32_t sv_proto_start_size(const struct sv_proto_params *p)
{
	bool grows = p->start_size > 0 && p->start_size < p->buf_size &&
		     sv_size_code(p->buf_size - SV_HDR_SIZE) != 0;
	return grows ? p->start_size : p->buf_size;
}

/* Buffers the transport must provide for these parameters. */
static inline uint32_t sv_proto_nrecv(const struct sv_proto_params *p)
{
	return p->window + p->reserve;
}
static inline uint32_t sv_proto_nsend(const struct sv_proto_params *p)
{
	return p->window + p->reserve + 1;
}

/* The delayed-ACK timer for bulk DATA (messages of coalesce_size or more)
 * alone: this many times ack_timeout_us. */
#define SV_ACK_BULK_FACTOR 16u

/* Why a pending coalescing buffer is pushed out. */
enum sv_flush_reason {
	SV_FLUSH_TIMER,   /* the coalescing timer fired */
	SV_FLUSH_FULL,    /* the next write did not fit */
	SV_FLUSH_LARGE,   /* a write at or above the threshold */
	SV_FLUSH_RECV,    /* the application called a receive function */
	SV_FLUSH_CLOSE,   /* close, shutdown, or a medium switch */
	SV_FLUSH_IDLE,    /* nothing in flight: sending now costs no batching */
	SV_FLUSH_NODELAY, /* coalescing is off (TCP_NODELAY) */
	SV_FLUSH_REASONS
};

struct sv_proto_stats {
	uint64_t tx_bytes, rx_bytes;       /* payload over the transport */
	uint64_t tx_msgs, rx_msgs;         /* messages of any type */
	uint64_t tx_data_msgs, rx_data_msgs;
	uint64_t tx_zcopy_bytes;           /* payload sent from user memory */
	uint64_t credit_stalls;            /* sends that found no credit */
	uint64_t updates_sent;             /* pure UPDATE messages */
	uint64_t acks_piggybacked;         /* credit reports carried by DATA */
	uint64_t coalesced_writes;         /* writes appended to a pending buffer
					    * by Nagle-style coalescing */
	uint64_t collected_writes;         /* small writes taken into a send buffer
					    * while the window was closed */
	uint64_t flushes[SV_FLUSH_REASONS]; /* coalescing buffers pushed out, by reason */
	uint64_t gave_back, got_back;      /* bytes returned by the way back, each way */
	bool rx_grown, tx_grown;           /* our receive (send) buffers are at buf_size now */
	uint64_t grow_refused;             /* growths the transport refused (no locked memory) */
	uint64_t rx_grows, tx_grows;       /* times our receive (send) buffers grew */
	uint64_t rx_shrinks, tx_shrinks;   /* ... and went back to start_size */
	uint64_t drains_sent;              /* DRAIN messages: the peer's grown buffers given back */
	uint64_t resent;                   /* bytes sent over the QP again on TCP after it was lost */
};

/* ---- The core ---------------------------------------------------------- */

/* Where our sending stands. Both directions start on TCP: the QP carries a
 * direction only from its TO_RDMA on. */
enum sv_tx_state {
	SV_TX_TCP,   /* this direction is on TCP (before the upgrade, or after TO_TCP) */
	SV_TX_OPEN,  /* sending over the QP */
	SV_TX_FIN,   /* FIN sent: no more data */
	SV_TX_RESET, /* the QP cannot carry it any more: failed, or ended (EPIPE) */
	SV_TX_BACK,  /* BACK sent: only RETURN and UPDATE follow; the stream goes on
		      * on TCP for good, after the bytes the peer gives back */
};

struct sv_proto;

/* A core with both directions on TCP, every receive buffer posted. Credits
 * start at nrecv on both sides: each peer posts all of its receive buffers
 * before the connection is established. 0 or -errno (-EINVAL for
 * parameters out of range). */
int sv_proto_new(struct sv_proto **out, const struct sv_proto_params *prm,
		 const struct sv_xport *xp);
void sv_proto_free(struct sv_proto *p);

/* The peer's receive side, learnt during connection set-up: how many
 * buffers it posted (our credits) and their size. Call before sending. */
int sv_proto_set_peer(struct sv_proto *p, uint32_t peer_nrecv, uint32_t peer_buf_size);

/* TCP_NODELAY (no coalescing) and TCP_CORK (hold small writes), as the
 * socket has them now. Turning coalescing off or the cork off pushes out
 * what was held (-EAGAIN: it goes when credits come). */
int sv_proto_set_nodelay(struct sv_proto *p, bool on, struct sv_clock *clk);
int sv_proto_set_cork(struct sv_proto *p, bool on, struct sv_clock *clk);

/* ---- Failure: the one way a core breaks --------------------------------- */

/* The connection is broken with err (< 0): every later call that would
 * move data returns it, completions only give slots back, nothing is
 * reposted. A sending direction still on TCP is not the QP's and stays on
 * TCP. The first error is kept. Returns it. */
int sv_proto_abort(struct sv_proto *p, int err);
/* The error the core broke with, or 0. */
int sv_proto_error(const struct sv_proto *p);

/* ---- Completions ---------------------------------------------------------- */

/* Completions, in the order the transport reports them. A malformed message
 * resets the connection: the result is -ECONNRESET (sv_proto_error). */
int sv_proto_on_recv(struct sv_proto *p, uint32_t buf, uint32_t byte_len, struct sv_clock *clk);
int sv_proto_on_send_done(struct sv_proto *p, uint32_t slot, struct sv_clock *clk);
/* The transport got a work request back flushed: its QP is in the error
 * state and everything still posted follows the same way. True when that
 * is expected, the aftermath of a break or the normal end (the peer's FIN
 * arrived over the QP and none of our DATA is in flight); an open sending
 * direction is then closed (writes get EPIPE, as TCP's to a peer that
 * closed) and every later flush is that same end. False: bytes may be
 * lost, and the transport aborts the core. */
bool sv_proto_flush_is_end(struct sv_proto *p);
/* The normal-end half of that judgement, for a disconnect (no error yet):
 * true, with the same effects, when the peer's FIN arrived over the QP and
 * none of our DATA is in flight, or a flush was judged so before. */
bool sv_proto_peer_ended(struct sv_proto *p);
/* The QP ended so while our FIN was in flight: the peer may not have it.
 * A peer that resumes over TCP then reads our end there. */
bool sv_proto_fin_unsure(const struct sv_proto *p);

/* ---- Sending ------------------------------------------------------------ */

/* Application send. MSG_MORE in flags holds the data like TCP_CORK.
 * Returns the bytes taken (> 0), -EAGAIN when nothing could be taken (no
 * credit or buffer free for a large write; for a small one, no room left
 * in the send buffer it is collected in), -EPIPE after FIN, or the error.
 * Small writes (below coalesce_size) are collected in a send buffer while
 * no credit is there, NODELAY or not, and go when credits come. Zero-copy
 * sends are posted from the caller's memory: it must not return to the
 * application until sv_proto_zcopy_busy() is false. */
long sv_proto_send(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   struct sv_clock *clk);
bool sv_proto_zcopy_busy(const struct sv_proto *p);

/* Push out the coalescing buffer. -EAGAIN when no credit (it stays). */
int sv_proto_flush(struct sv_proto *p, enum sv_flush_reason why, struct sv_clock *clk);

/* Where our sending stands. */
enum sv_tx_state sv_proto_tx_state(const struct sv_proto *p);
/* Coalesced bytes wait in a send buffer. */
bool sv_proto_tx_pending(const struct sv_proto *p);
/* Every message posted has completed (coalesced bytes may still wait). */
bool sv_proto_sends_done(const struct sv_proto *p);
/* A write now would take some bytes: a data credit and a free send buffer,
 * or room in the buffer small writes are collected in (poll's POLLOUT). */
bool sv_proto_writable(const struct sv_proto *p);

/* Control messages. They use the control reserve, never data credits;
 * -EAGAIN when even that is exhausted (retry after completions).
 * TO_RDMA moves our sending to the QP: TCP carried [.., tcp_end_seq).
 * TO_TCP flushes and moves it back: the QP carried [.., snd_nxt). */
int sv_proto_send_to_rdma(struct sv_proto *p, uint64_t tcp_end_seq, struct sv_clock *clk);
int sv_proto_send_to_tcp(struct sv_proto *p, struct sv_clock *clk);
int sv_proto_send_fin(struct sv_proto *p, struct sv_clock *clk);
int sv_proto_send_reset(struct sv_proto *p);
/* shutdown(SHUT_WR): the FIN after the data, without waiting, as TCP's
 * shutdown queues its FIN behind its send buffer. If the FIN cannot go yet
 * (collected writes wait for a data credit, or no control credit is free)
 * it is sent as soon as it can: on a completion, a message, a timer or a
 * flush. 0, -EPIPE if already shut, or the error. */
int sv_proto_shutdown_tx(struct sv_proto *p, struct sv_clock *clk);

/* True while our TO_RDMA has not completed: on an RC QP its completion means
 * it sits in the peer's completion queue, so the challenge echo may only be
 * written on TCP after this turns false. */
bool sv_proto_to_rdma_pending(const struct sv_proto *p);

/* ---- Receiving ---------------------------------------------------------- */

/* Application receive: copies up to the iov's size. MSG_PEEK leaves the data.
 * Returns the bytes copied (> 0); 0 at EOF (FIN reached); -EAGAIN when no
 * data is buffered, or the receive side is on TCP (sv_proto_rx_on_qp false);
 * the error after a reset, once the bytes the peer sent before its FIN
 * are read. */
long sv_proto_recv(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   struct sv_clock *clk);

/* Bytes buffered and readable now (FIONREAD). */
uint64_t sv_proto_readable(const struct sv_proto *p);

/* True when the receive side reads from the QP: from the accepted TO_RDMA
 * until every byte the QP carried before the peer's TO_TCP (or the end of
 * its QP part) is consumed, and never after our BACK. */
bool sv_proto_rx_on_qp(const struct sv_proto *p);
/* The peer's FIN arrived over the QP; ... and every byte before it is read. */
bool sv_proto_rx_fin(const struct sv_proto *p);
bool sv_proto_rx_eof(const struct sv_proto *p);

/* The peer announced (TO_RDMA) that its bytes move to the QP after offset
 * *seq of its TCP stream, and the stream layer has not accepted or refused
 * it yet. */
bool sv_proto_peer_switch(const struct sv_proto *p, uint64_t *seq);
/* The receive direction moves to the QP: the stream layer has delivered the
 * peer's TCP bytes up to the announced offset and verified the challenge. */
int sv_proto_rx_accept(struct sv_proto *p);
/* The announcement is refused (the challenge failed, or the QP died before
 * it was verified): the receive side stays on TCP. */
void sv_proto_rx_refuse(struct sv_proto *p);

/* Did anything move to the QP (our TO_RDMA, or the peer's)? */
bool sv_proto_qp_used(const struct sv_proto *p);

/* The QP is gone without a normal end: the receive side ends its QP part at
 * what has arrived (readable up to there, then TCP). */
void sv_proto_rx_lost_qp(struct sv_proto *p);
/* ... and the sending side, while it is (or was, when the failure aborted
 * the core) on the QP: if every message it posted arrived, it moves to
 * TCP, and *buf and *len are the bytes coalesced but never sent, which the
 * caller writes on TCP first (valid until the next call into the core);
 * after its FIN nothing moves. -EIO when messages were in flight when the
 * QP failed (they may be lost): the caller fails the connection. -EINVAL
 * when our sending is not the QP's (TCP, BACK). */
int sv_proto_tx_lost_qp(struct sv_proto *p, const void **buf, size_t *len);
/* Our TO_RDMA is taken back: no byte of ours went over the QP after it, nor
 * waits coalesced for it (a client holds its writes until the server proves
 * itself), so our sending is TCP's again from the same offset, whether the
 * QP still works, was reset, or carried our FIN (the stream then ends TCP
 * there). No message: the caller tells the peer (TO_TCP, or RESET). -EINVAL
 * when bytes went to the QP, or after BACK. */
int sv_proto_tx_retract(struct sv_proto *p);

/* ---- Resuming over TCP (docs/protocol.md, section 11) -------------------- */

/* A lost QP: the stream exchanges, on TCP, how much of the other's stream
 * each end holds, and both directions go on there from exactly those
 * bytes. The core's part: at the break (sv_proto_abort) it copies the
 * bytes whose arrival is not known; the stream drains the CQ (receives
 * that completed still count), fixes the receive side's end with
 * sv_proto_rx_lost_qp and sends sv_proto_offsets' rcv_nxt.
 *
 * Can this connection resume: our sending was on the QP (open or after
 * FIN), no way back began, and the peer did not reset it. */
bool sv_proto_resumable(const struct sv_proto *p);
/* Our bytes kept at the break: [*from, *end). */
void sv_proto_kept(const struct sv_proto *p, uint64_t *from, uint64_t *end);
/* The peer holds our stream up to peer_rcv: the kept bytes from there on
 * become owed (sv_proto_owed: written on TCP before anything new), and our
 * sending is on TCP (or stays ended after our FIN: *fin, and the stream
 * ends TCP after the owed bytes). -EPROTO when peer_rcv is outside what
 * we kept (a gap, or bytes never sent), -EIO when nothing could be kept,
 * -ENOMEM. */
int sv_proto_resume_tx(struct sv_proto *p, uint64_t peer_rcv, bool *fin);
/* The peer is gone (its TCP ended before its record): the kept bytes go,
 * and our sending is TCP's, which answers as TCP to a closed peer does. */
void sv_proto_resume_drop(struct sv_proto *p);

/* ---- Detaching: the way back (docs/protocol.md, section 10) ------------- */

/* After it, the connection is plain TCP on both ends, nothing held by
 * libsovia.
 *
 * sv_proto_send_back starts it (or answers the peer's BACK): our sending
 * ends on the QP at its next byte (coalesced bytes are flushed first; if
 * no data credit is left for them, they follow the returned bytes on TCP),
 * and the peer gets back, in RETURN messages, every byte of its stream our
 * application has not read: `prefix` (bytes read from TCP before the
 * switch point and not consumed) then what the QP delivered. Allowed when
 * sv_proto_back_ready; -EAGAIN without the credits (retry), -EINVAL in any
 * other state. From then on sv_proto_recv returns nothing: the peer writes
 * the rest on TCP. */
int sv_proto_send_back(struct sv_proto *p, const void *prefix, size_t prefix_len,
		       struct sv_clock *clk);
/* The most of our TCP bytes (those before our TO_RDMA) the peer's reads
 * ahead can hold unread: a BACK that would give back more is malformed.
 * The stream sets the bound it judges switch points by
 * (sv_stream_switch_point_ok); SV_TCP_AHEAD_DEFAULT until then. */
#define SV_TCP_AHEAD_DEFAULT (64u << 20)
void sv_proto_set_tcp_ahead(struct sv_proto *p, uint64_t bytes);
/* Both directions are settled on the QP: our sending is on it (open or
 * after FIN), the peer's bytes come over it, no switch is half done, and
 * no BACK went yet. */
bool sv_proto_back_ready(const struct sv_proto *p);
/* Our BACK is out. */
bool sv_proto_back_sent(const struct sv_proto *p);
/* The peer sent BACK and we have not: answer with sv_proto_send_back. */
bool sv_proto_back_wanted(const struct sv_proto *p);
/* Send what is still to be given back (once both BACKs are out). 0 when
 * nothing is left, -EAGAIN while credits lack, or the error. */
int sv_proto_send_returns(struct sv_proto *p, struct sv_clock *clk);
/* Our bytes the peer gave back, then those that never went over the QP,
 * not yet written on TCP: *len bytes at *buf. */
void sv_proto_owed(const struct sv_proto *p, const void **buf, size_t *len);
void sv_proto_owed_consume(struct sv_proto *p, size_t n);
/* Everything is exchanged: our returns are sent and completed, the peer's
 * are all here. (The owed bytes may still wait to be written on TCP.) */
bool sv_proto_back_done(const struct sv_proto *p);
/* Where each direction goes on on TCP after the way back: our bytes from
 * what the peer's application consumed (its BACK's X), the peer's from
 * what ours consumed (our BACK's X). Once both BACKs are out. */
void sv_proto_back_points(const struct sv_proto *p, uint64_t *tx, uint64_t *rx);

/* ---- Timers and counters ------------------------------------------------ */

/* Credit rules (docs/protocol.md has the reasoning):
 *  - every message costs one credit and carries `unreported` (our reposted
 *    receive buffers) back to the peer;
 *  - DATA needs credits > reserve (the data window is w);
 *  - TO_RDMA, TO_TCP, FIN need credits >= 2, keeping the last credit for an
 *    UPDATE, which needs credits >= 1 and something to report;
 *  - an UPDATE goes out when unreported_data >= ack_delay; when the ACK
 *    timer fires with unreported_data > 0 (ack_timeout_us after the first
 *    consumption, SV_ACK_BULK_FACTOR times that for bulk data alone); or
 *    when our view of the peer's credits has fallen to the reserve and
 *    unreported >= 2. An UPDATE never answers an UPDATE by itself, so they
 *    cannot ping-pong.
 *
 * Timers: fire what is due. The clock is read only if a timer is armed.
 * Returns the next deadline (0 = none). */
uint64_t sv_proto_timers(struct sv_proto *p, struct sv_clock *clk);
/* The next deadline (0 = none), for a caller about to sleep until it. It
 * reads the clock if a delayed ACK was armed without a reading, to start
 * that timer. */
uint64_t sv_proto_next_deadline(struct sv_proto *p, struct sv_clock *clk);
/* Is the delayed-ACK timer armed (with or without a deadline yet)? */
bool sv_proto_ack_armed(const struct sv_proto *p);
/* The coalescing timer's deadline while coalesced bytes wait, else 0. */
uint64_t sv_proto_flush_deadline(const struct sv_proto *p);

/* Stream offsets, for the logs: our next byte to send, the peer's next
 * byte expected, the peer's bytes the application consumed. */
void sv_proto_offsets(const struct sv_proto *p, uint64_t *snd_nxt, uint64_t *rcv_nxt,
		      uint64_t *rcv_read);

const struct sv_proto_params *sv_proto_params(const struct sv_proto *p);
const struct sv_proto_stats *sv_proto_stats(const struct sv_proto *p);

/* The core's parameters the settings give (the control reserve is
 * SV_RESERVE; the coalescing buffer never exceeds a message). */
struct sv_config;
void sv_config_proto_params(const struct sv_config *cfg, struct sv_proto_params *prm);

#endif
