/* The protocol core's state, private to src/core/proto*.c (and the core's own
 * unit tests, which check it from inside). Everything else goes through
 * proto.h. */
#ifndef SV_PROTO_INT_H
#define SV_PROTO_INT_H

#include "proto.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One unread DATA message: in a receive buffer, or (when the application
 * lags: stash_if_lagging) in memory of its own, its buffer back with the peer. */
struct sv_rx_slot {
	uint32_t buf;  /* receive buffer index (unless heap) */
	uint32_t off;  /* bytes of payload already consumed */
	uint32_t len;  /* payload bytes */
	uint8_t *heap; /* the payload, copied out; NULL: in buffer `buf` */
};

/* What a send buffer carries while it is in flight. */
enum sv_slot_kind {
	SV_SLOT_CONTROL = 0,
	SV_SLOT_DATA = 1,
	SV_SLOT_ZCOPY = 2, /* DATA whose payload is the application's memory */
};

/* Distinct buffer sizes a peer can report in order: the set-up's and each
 * size code. */
#define SV_RUNS (SV_SIZE_CODE_MAX - SV_SIZE_CODE_MIN + 2)

struct sv_proto {
	struct sv_proto_params prm;
	struct sv_xport xp;
	uint32_t payload_max; /* buf_size - header */
	uint32_t start_max;   /* start size - header (payload_max if buffers never grow) */

	/* Sending. Offsets are stream offsets of this direction. */
	enum sv_tx_state tx_state;
	/* The peer's posted receive buffers we hold credits for, oldest first,
	 * as runs of one size (payload bytes): a message goes into the oldest.
	 * Sizes grow, and fall back to the set-up's once per DRAIN, so only a
	 * few runs are ever held. */
	struct sv_credit_run {
		uint32_t cap, n;
	} runs[SV_RUNS];
	uint32_t run_head, run_count; /* a ring; run_count >= 1 */
	uint32_t peer_start_cap; /* the size of the peer's buffers at set-up (size code 0) */
	bool tx_grow_tried;      /* grow(send) was asked for (once per growth of the peer's) */
	/* Giving the peer's grown buffers back (DRAIN, docs/protocol.md 5). */
	enum sv_drain {
		SV_DRAIN_NONE,   /* not draining */
		SV_DRAIN_ASKED,  /* DRAINs sent; every large credit is the peer's
				  * old buffer, until its first smaller report */
		SV_DRAIN_OLD,    /* the peer posts small ones now: drain_left
				  * old credits remain at the head */
	} drain;
	uint32_t drain_left;     /* SV_DRAIN_OLD: old credits still to spend */
	bool tx_shrink_wanted;   /* our send buffers go back to start size once all are free */
	uint64_t idle_deadline;  /* when our sending is looked at for idleness (0: not armed) */
	bool idle_lazy;          /* armed without a clock: the next reading sets it */
	uint64_t idle_mark;      /* DATA sent and credit stalls at the last look */
	uint8_t *slot_big;       /* per send buffer: at buf_size */
	uint32_t pending_cap;    /* payload the coalescing buffer may take */
	bool to_rdma_inflight;   /* our TO_RDMA is posted but not yet completed */
	uint32_t to_rdma_slot;
	uint64_t snd_nxt;        /* next stream byte to hand to the transport */
	uint32_t credits;        /* messages we may still send */
	uint32_t inflight;       /* posted DATA not yet completed */
	uint32_t *free_slots;    /* send buffers not in use: a stack */
	uint32_t nfree;
	int32_t pending_slot;    /* the coalescing buffer, -1 when none */
	uint32_t pending_len;    /* payload bytes in it */
	uint64_t pending_deadline; /* when the coalescing timer fires */
	bool cork;               /* TCP_CORK: hold small writes */
	bool pending_hold;       /* the last write into it had MSG_MORE */
	bool fin_done;           /* our FIN's send completed before any error: it
				  * is in the peer's completion queue */
	int32_t fin_slot;        /* the send buffer our FIN is in flight in, or -1 */
	bool fin_wanted;         /* shut down while writes still wait for a
				  * credit: the FIN follows them */
	uint32_t peer_nrecv;     /* the peer's receive buffers: our credits' ceiling */
	uint32_t zc_inflight;    /* zero-copy sends not yet completed */
	bool tx_lost;            /* DATA was in flight when the core was aborted:
				  * it may never have arrived */

	/* Receiving. Control events are processed on arrival; their stream
	 * offsets order them against the data still queued before them. */
	bool rx_on_qp;           /* the peer's data comes over the QP now */
	bool rx_switch_pending;  /* TO_TCP arrived: QP data ends at rx_switch_seq */
	bool rx_fin;             /* FIN arrived: EOF at rx_fin_seq */
	bool rx_lost;            /* the QP was lost (sv_proto_rx_lost_qp): what it
				  * delivered stays readable, error or not */
	bool qp_ended;           /* a flushed work request was the normal end
				  * (sv_proto_peer_ended): so is every later one */
	bool fin_unsure;         /* the QP ended so with our FIN in flight: the
				  * peer may lack it (sv_proto_fin_unsure) */
	bool peer_to_rdma;       /* TO_RDMA arrived: TCP carries the peer's bytes up to
				  * peer_to_rdma_seq, then our challenge, then
				  * nothing; QP data after it waits for
				  * sv_proto_rx_accept */
	uint64_t rx_switch_seq, rx_fin_seq, peer_to_rdma_seq;
	uint64_t rcv_nxt;        /* next stream byte expected over the QP */
	uint64_t rcv_read;       /* stream bytes consumed by the application */
	struct sv_rx_slot *rxq;  /* unread DATA, oldest first: a ring of rxq_cap */
	uint32_t rxq_head, rxq_count, rxq_cap;
	size_t stashed;          /* payload bytes in heap slots */
	uint32_t stashed_msgs;   /* ... and their number */
	uint32_t peer_credits;   /* our view of the peer's credits towards us */
	uint8_t *rx_big;         /* per receive buffer: posted at buf_size */
	uint32_t rx_big_count;   /* ... how many are (posted, or holding a message) */
	uint32_t rx_full_run;    /* DATA messages in a row that filled their buffer */
	bool rx_grow_wanted;     /* they said: grow once nothing is unreported */
	bool rx_shrink_wanted;   /* a DRAIN came: post small ones once nothing is unreported */
	uint8_t rx_code;         /* the header's size code of what we post now (flags) */
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
	uint8_t *slot_kind;      /* enum sv_slot_kind per send buffer */
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
	uint64_t tx_qp_from;     /* our stream's offset where the QP took over (TO_RDMA) */
	uint64_t tcp_ahead_max;  /* the most of our TCP bytes the peer can hold unread */
	uint32_t rx_after_back;  /* DATA messages that came after our BACK */
	uint8_t *ret_buf;        /* the peer's bytes to give back: [back_x, back_x+ret_len) */
	size_t ret_len, ret_cap;
	uint64_t ret_nxt;        /* next of the peer's bytes to give back */
	uint8_t *owed;           /* our bytes given back, to write on TCP first */
	size_t owed_len, owed_off, owed_cap;
	uint64_t owed_nxt;       /* stream offset of the next returned byte expected */
	uint8_t *tail;           /* our bytes after back_seq (collected without a
				  * credit): on TCP after the returned ones */
	size_t tail_len, tail_cap;

	/* Resuming over TCP after the QP is lost (proto_resume.c). Each DATA
	 * message in flight, as it was posted; at the break, their bytes and
	 * the coalesced ones are copied out (kept), because a flushed
	 * completion does not say whether the message arrived. */
	struct sv_slot_data {
		uint64_t seq;
		uint32_t len;
		uint32_t iovcnt; /* zero copy: the application's memory */
		struct iovec iov[SV_ZCOPY_MAX_IOV];
	} *slot_data;
	uint8_t *kept;           /* our bytes [kept_from, kept_from + kept_len) */
	size_t kept_len;
	uint64_t kept_from;
	bool kept_ok;            /* every byte in flight at the break is in kept */
	enum sv_tx_state tx_state_at_break; /* before the abort made it RESET */
	bool peer_reset;         /* the peer sent RESET or a malformed message: the
				  * connection is aborted, not lost */
	bool reset_by_peer;      /* ... RESET: it refuses what arrived over the QP */

	int error; /* -errno once the connection is broken, else 0 */
	struct sv_proto_stats st;
};

/* In place, for the core's tests (the library uses sv_proto_new/free). */
int sv_proto_init(struct sv_proto *p, const struct sv_proto_params *prm,
		  const struct sv_xport *xp);
void sv_proto_destroy(struct sv_proto *p);

/* ---- Shared by the core's files ---------------------------------------- */

/* The small helpers below are inline: they run for every message. */

/* Receive buffers posted by this side (window + reserve). */
static inline uint32_t sv_pr_nrecv(const struct sv_proto *p)
{
	return sv_proto_nrecv(&p->prm);
}
/* Post one message from send buffer `slot` (header written here, payload
 * already in place, or zero copy from zc); carries the credit report. */
int sv_pr_post(struct sv_proto *p, uint32_t slot, uint8_t type, uint64_t seq, uint32_t len,
	       const struct iovec *zc, int zccnt);
/* What the oldest buffer of the peer's we may send into holds: the next
 * message's limit. With no credit, the newest size the peer reported:
 * the credits that come are at least that large, unless we give its large
 * buffers back (proto_drain.c). */
static inline uint32_t sv_pr_peer_cap(const struct sv_proto *p)
{
	uint32_t i = p->credits ? p->run_head : (p->run_head + p->run_count - 1) % SV_RUNS;
	return p->runs[i].cap;
}
/* Payload send buffer `slot` holds. */
static inline uint32_t sv_pr_slot_cap(const struct sv_proto *p, uint32_t slot)
{
	return p->slot_big[slot] ? p->payload_max : p->start_max;
}
/* Payload one message from `slot` may carry: what the slot and the peer's
 * next buffer both hold. */
static inline uint32_t sv_pr_msg_cap(const struct sv_proto *p, uint32_t slot)
{
	uint32_t a = sv_pr_slot_cap(p, slot), b = sv_pr_peer_cap(p);
	return a < b ? a : b;
}
/* What a message that may wait (a coalescing buffer) can hold: while we
 * give the peer's large buffers back, the credit it goes into in the end
 * may be of the set-up's size (proto_drain.c). */
static inline uint32_t sv_pr_wait_cap(const struct sv_proto *p, uint32_t cap)
{
	return p->drain != SV_DRAIN_NONE && cap > p->peer_start_cap ? p->peer_start_cap : cap;
}
/* ... from a send buffer not taken yet, for a write that may wait. */
static inline uint32_t sv_pr_tx_cap(const struct sv_proto *p)
{
	uint32_t a = p->st.tx_grown ? p->payload_max : p->start_max, b = sv_pr_peer_cap(p);
	return sv_pr_wait_cap(p, a < b ? a : b);
}
/* A free send buffer, or -EAGAIN. After our send buffers grew, each is at
 * the new size from the next time it is taken. */
static inline int sv_pr_take_slot(struct sv_proto *p, uint32_t *slot)
{
	if (!p->nfree)
		return -EAGAIN;
	*slot = p->free_slots[--p->nfree];
	if (p->st.tx_grown && !p->slot_big[*slot]) {
		p->xp.ops->send_big(p->xp.ctx, *slot);
		p->slot_big[*slot] = 1;
	}
	return 0;
}
/* A send buffer back on the free stack. */
static inline void sv_pr_free_slot(struct sv_proto *p, uint32_t slot)
{
	p->free_slots[p->nfree++] = slot;
}
/* A control message with no payload, if `need` credits are there. */
int sv_pr_send_control(struct sv_proto *p, uint8_t type, uint64_t seq, uint32_t need);
/* DATA may go: a credit above the reserve and a free send buffer. */
static inline bool sv_pr_can_send_data(const struct sv_proto *p)
{
	return p->credits > p->prm.reserve && p->nfree > 0;
}
/* Nagle's idle: every DATA we sent has completed and the peer acknowledged
 * every byte of it. (Local completions alone come back almost at once on
 * soft-RoCE and fast NICs, so they would send nearly every small write on
 * its own; the peer's acknowledgment takes a round trip, as TCP's does.) */
static inline bool sv_pr_tx_idle(const struct sv_proto *p)
{
	return p->inflight == 0 && p->snd_una == p->snd_nxt;
}

/* A buffer whose data the application consumed (or that the protocol
 * treats so) waits to be reported; small says whether it held less than
 * coalesce_size, which sets the delayed-ACK timer (ack_policy). */
static inline void sv_pr_consumed(struct sv_proto *p, bool small)
{
	p->unreported_data++;
	p->unreported_small += small;
}

/* The ACK policy (docs/protocol.md, section 6). */
int sv_pr_ack_policy(struct sv_proto *p, struct sv_clock *clk);
/* Send the coalescing buffer now; -EAGAIN without a data credit. */
int sv_pr_flush_pending(struct sv_proto *p, enum sv_flush_reason why);
/* Release what waited for credits, a completion or an acknowledgment: a
 * full or timed-out coalescing buffer, NODELAY writes collected while the
 * window was closed, what Nagle held, a FIN that waited. */
int sv_pr_tx_release(struct sv_proto *p, struct sv_clock *clk);
/* Push the coalescing buffer if Nagle's idle holds and nothing holds it. */
int sv_pr_flush_if_idle(struct sv_proto *p);
/* A FIN that waited (sv_proto_shutdown_tx) goes once it can. */
int sv_pr_fin_if_wanted(struct sv_proto *p, struct sv_clock *clk);
/* Payload receive buffer `buf` holds as it was posted. */
static inline uint32_t sv_pr_rx_cap(const struct sv_proto *p, uint32_t buf)
{
	return p->rx_big[buf] ? p->payload_max : p->start_max;
}
/* Post receive buffer `buf` (at the size the receive side has now). */
int sv_pr_post_recv(struct sv_proto *p, uint32_t buf);
/* Our receive buffers grow (or go back to the start size after the peer's
 * DRAIN), if they were asked to and nothing posted before is unreported (a
 * header reports buffers of one size). */
void sv_pr_rx_grow_if_due(struct sv_proto *p);
/* proto_drain.c: giving grown buffers back (docs/protocol.md, 5). */
/* The peer's DRAIN arrived in buffer buf. */
int sv_pr_on_drain(struct sv_proto *p, uint32_t buf);
/* The peer reported credits of a smaller size (cap) than before: legal
 * only while we drain, and only its set-up size. */
int sv_pr_peer_shrank(struct sv_proto *p, uint32_t cap);
/* Send the DRAINs that are due and can go. */
int sv_pr_drain(struct sv_proto *p);
/* Our send buffers go back to the start size if that is wanted and all
 * are free. */
void sv_pr_tx_shrink_if_due(struct sv_proto *p);
/* The idleness timer: start it (when the peer's buffers are large), and
 * look at it. */
void sv_pr_idle_arm(struct sv_proto *p);
int sv_pr_idle_timer(struct sv_proto *p, uint64_t now);
/* Repost a receive buffer whose contents are done with. */
int sv_pr_repost_control(struct sv_proto *p, uint32_t buf);
/* Repost the buffer the last receive call emptied (p->rx_held), if any. */
int sv_pr_rx_release(struct sv_proto *p);
/* Append to the bytes we give back to the peer. */
int sv_pr_ret_append(struct sv_proto *p, const void *data, size_t len);
/* proto_back.c: once every returned byte is in, the bytes that never
 * went over the QP (collected without a credit) follow them. */
int sv_pr_owed_tail(struct sv_proto *p);
/* proto_back.c: the receive side of BACK and RETURN. */
int sv_pr_on_back(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf);
int sv_pr_on_return(struct sv_proto *p, const struct sv_hdr *h, uint32_t buf);
/* proto_resume.c: at the first error, copy the bytes of every DATA in
 * flight and the coalesced ones (kept), while the memory is still there. */
void sv_pr_keep_unsent(struct sv_proto *p);
/* proto_resume.c: a receive that completed after the error: the QP
 * delivered it, so DATA (and FIN) still count until the stream fixes
 * where the QP part ends (sv_proto_rx_lost_qp). */
int sv_pr_on_recv_late(struct sv_proto *p, uint32_t buf, uint32_t byte_len);
/* A malformed message: the connection resets. Returns -ECONNRESET. */
int sv_pr_malformed(struct sv_proto *p);
/* The coalescing buffer's slot, taken out of it: the buffer is empty. */
static inline uint32_t sv_pr_take_pending(struct sv_proto *p)
{
	uint32_t slot = (uint32_t)p->pending_slot;
	p->pending_slot = -1;
	p->pending_len = 0;
	p->pending_deadline = 0;
	p->pending_hold = false;
	return slot;
}
/* The i-th unread message (0: the oldest). */
static inline struct sv_rx_slot *sv_pr_rxq_at(struct sv_proto *p, uint32_t i)
{
	return &p->rxq[(p->rxq_head + i) % p->rxq_cap];
}
/* The oldest unread message is gone. */
static inline void sv_pr_rxq_pop(struct sv_proto *p)
{
	p->rxq_head = (p->rxq_head + 1) % p->rxq_cap;
	p->rxq_count--;
}
/* Twice the room for unread DATA (stashed messages hold entries beyond
 * the buffers); 0 or -ENOMEM. */
int sv_pr_rxq_grow(struct sv_proto *p);
/* A consumed heap slot's memory goes. */
void sv_pr_slot_done(struct sv_proto *p, struct sv_rx_slot *s);
/* Payload of receive buffer buf, and of send buffer slot. */
static inline const uint8_t *sv_pr_rx_payload(const struct sv_proto *p, uint32_t buf)
{
	return (const uint8_t *)p->xp.ops->recv_buf(p->xp.ctx, buf) + SV_HDR_SIZE;
}
/* An unread message's payload, wherever it is. */
static inline const uint8_t *sv_pr_slot_payload(const struct sv_proto *p,
						const struct sv_rx_slot *s)
{
	return s->heap ? s->heap : sv_pr_rx_payload(p, s->buf);
}
static inline uint8_t *sv_pr_tx_payload(const struct sv_proto *p, uint32_t slot)
{
	return (uint8_t *)p->xp.ops->send_buf(p->xp.ctx, slot) + SV_HDR_SIZE;
}

#endif
