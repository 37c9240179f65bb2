/* The SOVIA protocol core: one direction pair of a connection over a
 * reliable, in-order message transport (an RC queue pair, or the in-process
 * fake used by the unit tests).
 *
 * It owns flow control (credits), acknowledgements, coalescing, the medium
 * switch accounting and the wire format, and nothing else: no locks, no
 * blocking, no clocks, no threads. The caller (the stream layer) serialises
 * calls, passes the time in, polls the transport and feeds completions back,
 * and waits when an operation returns -EAGAIN.
 *
 * The wire format, field by field with its TCP counterpart, and the ACK and
 * coalescing policy are written down in docs/protocol.md; keep them in step. */
#ifndef SV_PROTO_H
#define SV_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* ---- Wire format ------------------------------------------------------ */

#define SV_HDR_SIZE 24
#define SV_CHALLENGE_SIZE 8 /* bytes of the upgrade challenge echoed on TCP */
#define SV_RESERVE 4        /* control-message reserve, the same on every peer */

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
};

#define SV_BACK_PAYLOAD 8

/* The header, as it is on the wire: little-endian, packed, 24 bytes. */
struct sv_hdr {
	uint8_t type;     /* enum sv_msg_type */
	uint8_t flags;    /* none defined yet: must be 0 */
	uint16_t credits; /* receive buffers reposted since the last report */
	uint32_t len;     /* payload bytes after the header */
	uint64_t seq;     /* stream offset of the first payload byte (or of the event) */
	uint64_t ack;     /* stream bytes received from the peer, cumulative */
};

void sv_hdr_encode(const struct sv_hdr *h, uint8_t out[SV_HDR_SIZE]);
void sv_hdr_decode(const uint8_t in[SV_HDR_SIZE], struct sv_hdr *h);

/* ---- The transport under the core --------------------------------------- */

/* What the core needs from a message transport. Buffers are numbered: the
 * transport owns (and has registered) `nrecv` receive buffers and `nsend`
 * send buffers of `buf_size` bytes each. Every function returns 0 or -errno. */
struct sv_xport_ops {
	/* Address of receive buffer i / send buffer i. */
	void *(*recv_buf)(void *xp, uint32_t i);
	void *(*send_buf)(void *xp, uint32_t i);
	/* Post receive buffer i to receive one message. */
	int (*post_recv)(void *xp, uint32_t i);
	/* Send one message: the first `len` bytes of send buffer `slot`, then
	 * (zero copy) the user memory in iov[0..iovcnt) which the transport
	 * registers itself. iovcnt is 0 for the copy path. The completion
	 * reports `slot` back through sv_proto_on_send_done. */
	int (*post_send)(void *xp, uint32_t slot, uint32_t len, const struct iovec *iov,
			 int iovcnt);
};

/* For the now_us argument of the calls below: the caller has not read the
 * clock; the core reads it through the transport only if it needs it (a
 * system call under emulation, about 0.8 us: paid by every write before). */
#define SV_NOW_UNREAD 0u

struct sv_xport {
	const struct sv_xport_ops *ops;
	void *ctx;
	/* The clock, in microseconds (monotonic, never 0). Read only when a
	 * caller passed SV_NOW_UNREAD and a timer must be armed or checked;
	 * may be NULL for a caller that always passes the time. */
	uint64_t (*now)(void);
};

/* ---- Parameters, statistics --------------------------------------------- */

struct sv_proto_params {
	uint32_t window;        /* w: data credits (receive buffers for data) */
	uint32_t reserve;       /* c: extra receive buffers for control messages, >= 3
				 * (SV_RESERVE in practice: both peers must agree) */
	uint32_t buf_size;      /* bytes per buffer, header included */
	uint32_t ack_delay;     /* t: consumed data buffers before an UPDATE */
	uint64_t ack_timeout_us;
	bool coalesce;          /* false = TCP_NODELAY */
	uint32_t coalesce_size; /* small-write threshold and coalescing buffer limit */
	uint64_t coalesce_timeout_us;
	uint32_t zcopy_threshold; /* writes >= this go zero copy */
};

/* Buffers the transport must provide for these parameters. */
static inline uint32_t sv_proto_nrecv(const struct sv_proto_params *p)
{
	return p->window + p->reserve;
}
static inline uint32_t sv_proto_nsend(const struct sv_proto_params *p)
{
	return p->window + p->reserve + 1;
}

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
	uint64_t flushes_timer, flushes_full, flushes_large, flushes_recv,
		flushes_close, flushes_idle, flushes_nodelay;
};

/* ---- The core ---------------------------------------------------------- */

/* Why a pending coalescing buffer is pushed out. */
enum sv_flush_reason {
	SV_FLUSH_TIMER,   /* the coalescing timer fired */
	SV_FLUSH_FULL,    /* the next write did not fit */
	SV_FLUSH_LARGE,   /* a write at or above the threshold */
	SV_FLUSH_RECV,    /* the application called a receive function */
	SV_FLUSH_CLOSE,   /* close, shutdown, or a medium switch */
	SV_FLUSH_IDLE,    /* nothing in flight: sending now costs no batching */
	SV_FLUSH_NODELAY, /* coalescing is off (TCP_NODELAY) */
};

/* Where our sending stands. Both directions start on TCP: the QP carries a
 * direction only from its TO_RDMA on. (The receive side is described by the
 * rx_* flags below: its events can arrive before the data ahead of them is
 * read, so they are kept with their stream offsets.) */
enum sv_tx_state {
	SV_TX_TCP,   /* this direction is on TCP (before the upgrade, or after TO_TCP) */
	SV_TX_OPEN,  /* sending over the QP */
	SV_TX_FIN,   /* FIN sent: no more data */
	SV_TX_RESET, /* broken: p->error says why */
	SV_TX_BACK,  /* BACK sent: only RETURN and UPDATE follow; the stream goes on
		      * on TCP for good, after the bytes the peer gives back */
};

/* One unread DATA message sitting in a receive buffer. */
/* The delayed-ACK timer for bulk DATA (messages of coalesce_size or more)
 * alone: this many times ack_timeout_us. */
#define SV_ACK_BULK_FACTOR 16u

struct sv_rx_slot {
	uint32_t buf; /* receive buffer index */
	uint32_t off; /* bytes of payload already consumed */
	uint32_t len; /* payload bytes */
};

struct sv_proto {
	struct sv_proto_params prm;
	struct sv_xport xp;
	uint32_t payload_max; /* buf_size - header */

	/* Sending. Offsets are stream offsets of this direction. */
	enum sv_tx_state tx_state;
	uint32_t tx_payload_max; /* payload per message: what the peer's buffers hold */
	bool to_rdma_inflight;   /* our TO_RDMA is posted but not yet completed */
	uint32_t to_rdma_slot;
	uint64_t snd_nxt;        /* next stream byte to hand to the transport */
	uint32_t credits;        /* messages we may still send */
	uint32_t inflight;       /* posted sends not yet completed */
	uint32_t *free_slots;    /* send buffers not in use: a stack */
	uint32_t nfree;
	int32_t pending_slot;    /* the coalescing buffer, -1 when none */
	uint32_t pending_len;    /* payload bytes in it */
	uint64_t pending_deadline; /* when the coalescing timer fires */
	bool cork;               /* TCP_CORK: hold small writes */
	bool pending_hold;       /* the last write into it had MSG_MORE */
	bool fin_wanted;         /* shut down while writes still wait for a
				  * credit: the FIN follows them */
	uint32_t peer_nrecv;     /* the peer's receive buffers: our credits' ceiling */
	uint32_t zc_inflight;    /* zero-copy sends not yet completed */

	/* Receiving. Control events are processed on arrival; their stream
	 * offsets order them against the data still queued before them. */
	bool rx_on_qp;           /* the peer's data comes over the QP now */
	bool rx_switch_pending;  /* TO_TCP arrived: QP data ends at rx_switch_seq */
	bool rx_fin;             /* FIN arrived: EOF at rx_fin_seq */
	bool qp_ended;           /* a flushed work request was the normal end
				  * (sv_proto_peer_ended): so is every later one */
	bool peer_to_rdma;       /* TO_RDMA arrived: TCP carries the peer's bytes up to
				  * peer_to_rdma_seq, then our challenge, then
				  * nothing; QP data after it waits for
				  * sv_proto_rx_accept */
	uint64_t rx_switch_seq, rx_fin_seq, peer_to_rdma_seq;
	uint64_t rcv_nxt;        /* next stream byte expected over the QP */
	uint64_t rcv_read;       /* stream bytes consumed by the application */
	struct sv_rx_slot *rxq;  /* unread DATA, a ring of nrecv entries */
	uint32_t rxq_head, rxq_count;
	uint32_t peer_credits;   /* our view of the peer's credits towards us */
	uint32_t unreported;     /* reposted buffers not yet reported */
	int32_t rx_held;         /* the buffer the last receive call emptied, not
				  * yet reposted (-1: none): sv_pr_rx_release */
	uint32_t unreported_data;/* ... of which held data the application consumed */
	uint32_t unreported_small;/* ... of which held less than coalesce_size: these
				   * arm the delayed-ACK timer at ack_timeout_us */
	uint64_t ack_deadline;   /* delayed-ACK timer, 0 when not armed */
	uint64_t ack_lazy_us;    /* delayed-ACK timer armed without a clock: its
				  * delay, which the next clock reading turns into
				  * ack_deadline (sv_proto_timers, next_deadline);
				  * 0 when none */
	uint8_t *slot_kind;      /* per send buffer: 0 control, 1 DATA, 2 zero-copy DATA */
	uint64_t snd_una;        /* stream bytes the peer has acknowledged */

	/* Detaching (BACK/RETURN): each side gives back what its application
	 * has not read, so that both directions continue on TCP from exactly
	 * where each application stands. */
	bool back_sent;          /* our BACK is out */
	bool peer_back;          /* the peer's BACK arrived */
	uint64_t back_seq;       /* our stream's end on the QP (our BACK's seq) */
	uint64_t back_x;         /* the peer's bytes our application consumed */
	uint64_t peer_back_seq;  /* the peer's stream's end on the QP */
	uint64_t peer_back_x;    /* our bytes the peer consumed: [x, back_seq) come back */
	uint8_t *ret_buf;        /* the peer's bytes to give back: [back_x, back_x+ret_len) */
	size_t ret_len, ret_cap;
	uint64_t ret_nxt;        /* next of the peer's bytes to give back */
	uint8_t *owed;           /* our bytes given back, to write on TCP first */
	size_t owed_len, owed_off, owed_cap;
	uint64_t owed_nxt;       /* stream offset of the next returned byte expected */
	uint8_t *tail;           /* our bytes after back_seq (collected without a
				  * credit): on TCP after the returned ones */
	size_t tail_len, tail_cap;

	int error; /* -errno once the connection is broken, else 0 */
	struct sv_proto_stats st;
};

/* Set up the core (both directions on TCP) and post every receive buffer.
 * Credits start at nrecv on both sides: each peer posts all of its receive
 * buffers before the connection is established. */
int sv_proto_init(struct sv_proto *p, const struct sv_proto_params *prm,
		  const struct sv_xport *xp);
void sv_proto_destroy(struct sv_proto *p);

/* The peer's receive side, learnt during connection set-up: how many
 * buffers it posted (our credits) and their size. Call before sending. */
int sv_proto_set_peer(struct sv_proto *p, uint32_t peer_nrecv, uint32_t peer_buf_size);

/* Completions, in the order the transport reports them. A malformed message
 * resets the connection: the result is -ECONNRESET and p->error is set. */
int sv_proto_on_recv(struct sv_proto *p, uint32_t buf, uint32_t byte_len, uint64_t now_us);
int sv_proto_on_send_done(struct sv_proto *p, uint32_t slot, uint64_t now_us);
/* The transport got a work request back flushed: its QP is in the error
 * state and everything still posted follows the same way. True when that
 * is expected, the aftermath of a break (p->error) or the normal end (the
 * peer's FIN arrived over the QP and none of our DATA is in flight); an
 * open sending direction is then closed (writes get EPIPE, as TCP's to a
 * peer that closed) and every later flush is that same end. False: bytes may be lost, and the
 * transport fails the connection. The slot or buffer itself is still
 * reported as usual. */
bool sv_proto_flush_is_end(struct sv_proto *p);
/* The normal-end half of that judgement, for a disconnect (no error yet):
 * true, with the same effects, when the peer's FIN arrived over the QP and
 * none of our DATA is in flight, or a flush was judged so before. */
bool sv_proto_peer_ended(struct sv_proto *p);

/* Application send. MSG_MORE in flags holds the data like TCP_CORK.
 * Returns the bytes taken (> 0), -EAGAIN when nothing could be taken (no
 * credit or buffer free for a large write; for a small one, no room left
 * in the send buffer it is collected in), -EPIPE after FIN, or p->error.
 * Small writes (below coalesce_size) are collected in a send buffer while
 * no credit is there, NODELAY or not, and go when credits come. Zero-copy sends are
 * posted from the caller's memory: it must not return to the application
 * until sv_proto_zcopy_busy() is false. */
long sv_proto_send(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   uint64_t now_us);
bool sv_proto_zcopy_busy(const struct sv_proto *p);

/* Push out the coalescing buffer. -EAGAIN when no credit (it stays). */
int sv_proto_flush(struct sv_proto *p, enum sv_flush_reason why, uint64_t now_us);

/* Application receive: copies up to the iov's size. MSG_PEEK leaves the data.
 * Returns the bytes copied (> 0); 0 at EOF (FIN reached); -EAGAIN when no
 * data is buffered, or the receive side is on TCP (sv_proto_rx_on_tcp);
 * p->error after a reset. */
long sv_proto_recv(struct sv_proto *p, const struct iovec *iov, int iovcnt, int flags,
		   uint64_t now_us);

/* Bytes buffered and readable now (FIONREAD). */
uint64_t sv_proto_readable(const struct sv_proto *p);

/* True when the receive side reads from TCP: before the first upgrade, and
 * once every byte the QP carried before the peer's TO_TCP is consumed. */
bool sv_proto_rx_on_tcp(const struct sv_proto *p);

/* True while our TO_RDMA has not completed: on an RC QP its completion means
 * it sits in the peer's completion queue, so the challenge echo may only be
 * written on TCP after this turns false. */
bool sv_proto_to_rdma_pending(const struct sv_proto *p);

/* The receive direction moves to the QP: the stream layer has delivered the
 * peer's TCP bytes up to peer_to_rdma_seq and verified the challenge. */
int sv_proto_rx_accept(struct sv_proto *p);

/* Control messages. They use the control reserve, never data credits;
 * -EAGAIN when even that is exhausted (retry after completions).
 * TO_RDMA moves our sending to the QP: TCP carried [.., tcp_end_seq).
 * TO_TCP flushes and moves it back: the QP carried [.., snd_nxt). */
int sv_proto_send_to_rdma(struct sv_proto *p, uint64_t tcp_end_seq, uint64_t now_us);
int sv_proto_send_to_tcp(struct sv_proto *p, uint64_t now_us);
int sv_proto_send_fin(struct sv_proto *p, uint64_t now_us);
int sv_proto_send_reset(struct sv_proto *p);
/* shutdown(SHUT_WR): the FIN after the data, without waiting, as TCP's
 * shutdown queues its FIN behind its send buffer. If the FIN cannot go yet
 * (collected writes wait for a data credit, or no control credit is free)
 * it is sent as soon as it can: on a completion, a message, a timer or a
 * flush. 0, -EPIPE if already shut, or p->error. */
int sv_proto_shutdown_tx(struct sv_proto *p, uint64_t now_us);

/* Detaching (docs/protocol.md, "The way back"): after it, the connection is
 * plain TCP on both ends, nothing held by libsovia.
 *
 * sv_proto_send_back starts it (or answers the peer's BACK): our sending
 * ends on the QP at snd_nxt (coalesced bytes are flushed first; if no data
 * credit is left for them, they follow the returned bytes on TCP), and the
 * peer gets back, in RETURN messages, every byte of its stream our
 * application has not read: `prefix` (bytes read from TCP before the switch
 * point and not consumed) then what the QP delivered. Allowed while our
 * sending is on the QP (open or after FIN) and the peer's bytes come over
 * it; -EAGAIN without the credits (retry), -EINVAL in any other state.
 * From then on sv_proto_recv returns nothing: the peer writes the rest on
 * TCP. */
int sv_proto_send_back(struct sv_proto *p, const void *prefix, size_t prefix_len,
		       uint64_t now_us);
/* The peer sent BACK and we have not: answer with sv_proto_send_back. */
bool sv_proto_back_wanted(const struct sv_proto *p);
/* Send what is still to be given back (once both BACKs are out). 0 when
 * nothing is left, -EAGAIN while credits lack, or p->error. */
int sv_proto_send_returns(struct sv_proto *p, uint64_t now_us);
/* Our bytes the peer gave back, then those that never went over the QP,
 * not yet written on TCP: *len bytes at *buf. */
void sv_proto_owed(const struct sv_proto *p, const void **buf, size_t *len);
void sv_proto_owed_consume(struct sv_proto *p, size_t n);
/* Everything is exchanged: our returns are sent and completed, the peer's
 * are all here. (The owed bytes may still wait to be written on TCP.) */
bool sv_proto_back_done(const struct sv_proto *p);

/* Credit rules (docs/protocol.md has the reasoning):
 *  - every message costs one credit and carries `unreported` (our reposted
 *    receive buffers) back to the peer;
 *  - DATA needs credits > reserve (the data window is w);
 *  - TO_RDMA, TO_TCP, FIN need credits >= 2, keeping the last credit for an
 *    UPDATE, which needs credits >= 1 and something to report;
 *  - an UPDATE goes out when unreported_data >= ack_delay; when the ACK
 *    timer fires with unreported_data > 0 (ack_timeout_us after the first
 *    consumption, SV_ACK_BULK_FACTOR times that for bulk data alone); or when our view of the peer's
 *    credits has fallen to the reserve and unreported >= 2. An UPDATE never
 *    answers an UPDATE by itself, so they cannot ping-pong.
 *
 * Timers: fire what is due at now_us. Returns the next deadline (0 = none). */
uint64_t sv_proto_timers(struct sv_proto *p, uint64_t now_us);
/* The next deadline (0 = none), for a caller that is about to sleep until
 * it: now_us, a clock reading, starts a delayed-ACK timer armed without one. */
uint64_t sv_proto_next_deadline(struct sv_proto *p, uint64_t now_us);
/* Is the delayed-ACK timer armed (with or without a deadline yet)? */
static inline bool sv_proto_ack_armed(const struct sv_proto *p)
{
	return p->ack_deadline || p->ack_lazy_us;
}
/* The coalescing timer's deadline while coalesced bytes wait, else 0. */
uint64_t sv_proto_flush_deadline(const struct sv_proto *p);

#endif
