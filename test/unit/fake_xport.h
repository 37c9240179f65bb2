/* An in-process fake of the message transport under the protocol core: two
 * endpoints connected like the two ends of an RC queue pair.
 *
 * It enforces what the hardware would: a message can only be sent into a
 * receive buffer the peer has posted (the pre-post rule), it must fit that
 * buffer, a send buffer cannot be reused before its completion, a receive
 * buffer cannot be posted twice. Every breach is counted in `violations`
 * (and described in `why`) and the call fails: the tests assert the count
 * is 0. Messages are delivered in order; completions are queued and handed
 * to the core only by fake_poll(), so a test decides when each side sees
 * what. Send completions can be held to keep messages "in flight". */
#ifndef SV_FAKE_XPORT_H
#define SV_FAKE_XPORT_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum fake_ev_kind {
	FAKE_EV_RECV = 1, /* a message landed in receive buffer idx, byte_len bytes */
	FAKE_EV_SEND = 2, /* the send from buffer idx completed */
};

struct fake_ev {
	enum fake_ev_kind kind;
	uint32_t idx;
	uint32_t byte_len;
};

/* A queue of events that grows as needed. */
struct fake_evq {
	struct fake_ev *ev;
	size_t head, count, cap;
};

/* One message an endpoint sent, as the peer received it. */
struct fake_msg {
	struct sv_hdr h;   /* the decoded header */
	uint32_t total;    /* bytes on the wire: header + payload */
	uint32_t slot;     /* the send buffer */
	int iovcnt;        /* > 0: zero copy from user memory */
	uint64_t payload_off; /* where its payload starts in the endpoint's `sent` */
};

enum fake_rbuf_state {
	FAKE_RB_OWNED = 0,  /* with the core (never posted, or delivered) */
	FAKE_RB_POSTED = 1, /* posted, waiting for a message */
	FAKE_RB_FILLED = 2, /* holds a message whose completion is not delivered yet */
};

struct fake_ep {
	uint32_t nrecv, nsend, buf_size;
	uint8_t **rbuf, **sbuf;
	uint8_t *scratch; /* returned for out-of-range buffer indices */
	uint8_t *rstate;  /* enum fake_rbuf_state per receive buffer */
	uint8_t *sbusy;   /* per send buffer: posted, completion not delivered */

	uint32_t *rfifo; /* posted receive buffers, oldest first (a ring) */
	uint32_t rhead, rcount;

	struct fake_evq cq;   /* completions waiting for fake_poll */
	struct fake_evq held; /* send completions held back */
	bool hold_send_done;  /* queue send completions in `held` */

	struct fake_ep *peer;

	/* What this endpoint sent. */
	struct fake_msg *log;
	size_t nlog, caplog;
	uint8_t *sent; /* every DATA payload byte sent, in order */
	size_t nsent, capsent;

	/* Counters. */
	unsigned violations;
	char why[256]; /* the first violation */
	unsigned posts;        /* successful post_send calls */
	unsigned zcopy_posts;  /* ... with iovcnt > 0 */
	unsigned recv_posts;   /* successful post_recv calls */
	uint64_t delivered;    /* completions handed to the core */
	int poll_err;          /* the first error a core returned from a completion */
	int fail_sends;        /* test hook: fail the next N post_send with -EIO */
	/* Buffers that grow (fake_ep_grows): they start at start_size, a
	 * receive buffer is at the size it was posted with, a send buffer at
	 * buf_size once the core said so. 0: all at buf_size. */
	uint32_t start_size;
	bool rgrown, sgrown;
	uint32_t *rsize;       /* per receive buffer: its size as posted */
	uint8_t *sbig;         /* per send buffer: at buf_size */
	bool refuse_grow;      /* test hook: grow fails with -ENOBUFS */
	unsigned grows;        /* successful grow calls */
	unsigned shrinks;      /* shrink calls */
};

struct fake_pair {
	struct fake_ep ep[2];
};

/* Two connected endpoints with the same buffer counts and size. */
int fake_pair_init(struct fake_pair *fp, uint32_t nrecv, uint32_t nsend, uint32_t buf_size);
/* ... or each with its own: index 0 and 1 are the two endpoints. */
int fake_pair_init2(struct fake_pair *fp, const uint32_t nrecv[2], const uint32_t nsend[2],
		    const uint32_t buf_size[2]);
void fake_pair_destroy(struct fake_pair *fp);

/* ep's buffers start at start_size bytes and grow to its buf_size (call
 * before sv_proto_init). */
void fake_ep_grows(struct fake_ep *ep, uint32_t start_size);
/* The transport handle to give to sv_proto_init for this endpoint. */
struct sv_xport fake_xport(struct fake_ep *ep);

/* Hand the queued completions to the core, oldest first, until none is left
 * (completions the core causes meanwhile are delivered too), with a clock
 * reading now_us (SV_NOW_UNREAD: a clock the core reads from fake_clock_us
 * if it needs the time). Returns the number delivered, or the first
 * negative value the core returned (the rest are still delivered). */
int fake_poll(struct fake_ep *ep, struct sv_proto *p, uint64_t now_us);

/* Completions queued and not yet polled; ... of them, received messages. */
size_t fake_pending(const struct fake_ep *ep);
size_t fake_pending_recvs(const struct fake_ep *ep);

/* Send completions held back (hold_send_done). */
size_t fake_held(const struct fake_ep *ep);

/* Move up to n held send completions (oldest first) into the completion
 * queue; returns how many moved. */
size_t fake_release_sends(struct fake_ep *ep, size_t n);

/* Receive buffers currently posted at ep. */
uint32_t fake_posted(const struct fake_ep *ep);

/* Messages ep sent of one type (0 = all). */
size_t fake_count(const struct fake_ep *ep, int type);

/* The n-th message ep sent (from 0), or NULL. */
const struct fake_msg *fake_msg_at(const struct fake_ep *ep, size_t n);

/* The last message ep sent, or NULL. */
const struct fake_msg *fake_last(const struct fake_ep *ep);

/* Put raw bytes into ep's oldest posted receive buffer as if the peer had
 * sent them, and queue a completion reporting byte_len (which may disagree
 * with the bytes, to test the core's checks). -ENOBUFS when nothing is
 * posted, -EINVAL when the bytes do not fit a buffer. */
int fake_inject(struct fake_ep *ep, const void *bytes, uint32_t nbytes, uint32_t byte_len);

/* Encode a header (then the payload) and inject it with byte_len. */
int fake_inject_msg(struct fake_ep *ep, const struct sv_hdr *h, const void *payload,
		    uint32_t plen, uint32_t byte_len);

/* The tests' clock source: what it says (tests set it) and how often the
 * core read it (only through clocks with no reading yet). */
extern uint64_t fake_clock_us;
extern unsigned fake_clock_reads;
uint64_t fake_clock_read(void);

/* The tests give the time as a number: a clock with that reading, or, for
 * SV_NOW_UNREAD, one with none yet, which reads fake_clock_us when the core
 * needs the time. */
#define SV_NOW_UNREAD 0u
#define FAKE_CLK(now) (&(struct sv_clock){.us = (now), .source = fake_clock_read})

#endif
