/* Fuzz target: the protocol core's receive side, the wire parser, against a
 * peer that may send anything.
 *
 * Two cores come up on the in-process fake transport (test/unit/
 * fake_xport.c) as the core's unit tests bring them up; the input first
 * says how: window, reserve, buffer sizes (fixed or growing), coalescing,
 * zero copy, the idle drain, and whether both directions move to the QP
 * with a real handshake between the two cores. From then on B's core is
 * silent and the input speaks for the peer. It is read as a sequence of
 * steps, each a message put into A's oldest posted receive buffer (made to
 * fit A's state, with the deviations the input asks for, or a raw header)
 * or one of A's own operations (send, receive, flush, timers, shutdown, the
 * switches, the way back, the end of the QP); A's completions are handed
 * to it after each step, or held for a later one. What A sends lands in
 * B's buffers, where a sink checks it and reposts the buffer at once, at
 * full size.
 *
 * Whatever the peer sends, A must not crash or trip a sanitizer, and a
 * message it refuses resets it (-ECONNRESET), nothing else. Until it breaks:
 *  - it keeps the transport's rules (fake_xport.h) as long as the peer's
 *    reports of credits and buffer sizes are true;
 *  - each of its messages goes into a buffer the peer reported, and fits
 *    the size reported for it;
 *  - its view of the peer's credits is the peer's own count, and each of
 *    its receive buffers is posted (credited to the peer, or reposted and
 *    not yet reported), holds unread data, or is the one a read holds back;
 *  - it never believes in more credits than the peer has buffers;
 *  - its stream offsets never go back, and reads never pass what arrived;
 *  - the bytes it reads are the peer's stream at the offset read, the bytes
 *    it sends are its application's at the offset sent, and what either
 *    side gives back on the way back is the right stretch of the right
 *    stream.
 * The core's state is read from inside (proto_int.h), as its unit tests
 * do: the invariants are about that state. */
#include "fuzz.h"

#include "fake_xport.h"
#include "proto.h"
#include "proto_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* AddressSanitizer's manual poisoning, where the build has it. */
#if defined(__SANITIZE_ADDRESS__)
#define FZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_ASAN 1
#endif
#endif
#ifdef FZ_ASAN
#include <sanitizer/asan_interface.h>
#define FZ_POISON(p, n) __asan_poison_memory_region((p), (n))
#define FZ_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define FZ_POISON(p, n) ((void)(p), (void)(n))
#define FZ_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

enum { SA = 0, SB = 1 };

#define OWN_MAX (1u << 20)   /* A's stream bytes the harness may write */
#define WRITE_MAX 3000u      /* the most bytes one write or read of A's asks for */
#define MSG_MAX 4096u        /* room for a message in the largest buffer of any set-up */
#define CLAIMS_MAX (1u << 15) /* credit reports one input can make (steps times burst) */
#define STEPS_MAX 4096

/* ---- Reporting ----------------------------------------------------------- */

static void fail(int line, const char *cond, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));

static void fail(int line, const char *cond, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "fuzz_wire.c:%d: %s: ", line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort(); /* libFuzzer keeps the input that got here */
}

#define CHECK(c, ...)                                     \
	do {                                              \
		if (!(c))                                 \
			fail(__LINE__, #c, __VA_ARGS__); \
	} while (0)

/* FUZZ_WIRE_TRACE=1 in the environment prints each step, to follow an
 * input that fails. */
static int trace_on = -1;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void trace(const char *fmt, ...)
{
	if (trace_on < 0)
		trace_on = getenv("FUZZ_WIRE_TRACE") != NULL;
	if (!trace_on)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- The input ----------------------------------------------------------- */

/* Read past its end, the input gives zeros: every prefix of an input is an
 * input, which libFuzzer's shrinking relies on. */
struct input {
	const uint8_t *p;
	size_t n, off;
};

static uint8_t in8(struct input *in)
{
	return in->off < in->n ? in->p[in->off++] : 0;
}

static uint16_t in16(struct input *in)
{
	uint16_t lo = in8(in);
	return (uint16_t)(lo | in8(in) << 8);
}

static uint32_t in32(struct input *in)
{
	uint32_t lo = in16(in);
	return lo | (uint32_t)in16(in) << 16;
}

static uint64_t in64(struct input *in)
{
	uint64_t lo = in32(in);
	return lo | (uint64_t)in32(in) << 32;
}

/* A small signed deviation. */
static int64_t in_delta(struct input *in)
{
	return (int8_t)in8(in);
}

/* ---- The two streams ----------------------------------------------------- */

/* Each byte is a hash of its stream offset, so that a byte read, sent or
 * given back at the wrong offset, or a stale one, shows. */
static uint8_t mix(uint64_t o, uint64_t k)
{
	uint64_t x = (o + 1) * k;
	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	return (uint8_t)(x >> 56);
}

static uint8_t peer_byte(uint64_t o)
{
	return mix(o, 0x9E3779B97F4A7C15ull);
}

static uint8_t own_byte(uint64_t o)
{
	return mix(o, 0xC2B2AE3D27D4EB4Full);
}

/* ---- The state of one run ------------------------------------------------ */

/* A report of the peer's: n buffers of cap payload bytes. */
struct claim {
	uint32_t cap, n;
};

/* A's transport: the fake's, and once the input speaks for the peer, each
 * receive buffer A posts is poisoned for AddressSanitizer until a message
 * is put in it, and then only the message's bytes are readable: a posted
 * buffer is the NIC's until its completion, so a core that touches one, or
 * reads past the bytes a message brought, is caught. */
struct guard {
	struct sv_xport inner;
	struct fake_ep *ep;
	bool on;
};

struct fz {
	struct fake_pair fp;
	struct sv_proto p[2];
	struct guard guard;
	struct sv_xport bx; /* B's transport, which the sink reposts through */
	struct sv_proto_params prm;
	uint64_t now;
	bool unread_clock; /* hand A clocks with no reading yet */

	/* A's application. */
	uint64_t txo;        /* bytes of A's stream written, on TCP or through the core */
	uint64_t owed_taken; /* bytes given back to A and written on TCP */
	bool qp_gone;        /* the QP is over: nothing more arrives */
	bool refused;        /* the peer's switch was refused: A's receiving stays on TCP */

	/* The peer as the input plays it, and the truth about B's buffers. */
	int64_t pc;         /* credits A gave the peer less the messages it sent A */
	uint32_t unrep;     /* B's buffers reposted and not yet reported to A */
	uint32_t phys;      /* payload each of B's buffers holds: the sink posts all at full size */
	uint8_t phys_code;  /* its size code, or 0 */
	uint32_t start_cap; /* B's buffers' size at set-up, as A learnt it */
	bool lied;          /* the peer reported buffers, or sizes, that are not there */
	uint32_t cl_head, cl_tail; /* the reports A may still send into (CLAIMS) */
	uint64_t cl_total;

	/* The sink's view of A's sending. */
	enum sv_tx_state s_state;
	uint64_t s_nxt; /* A's next stream byte */
	uint64_t s_ack; /* the last acknowledgment A sent */
	uint64_t s_ret; /* the next of the peer's bytes A gives back */

	/* What the checks remember from one step to the next. */
	uint64_t snd_nxt, rcv_nxt, rcv_read;
	int err;
};

static struct fz Z;
static struct claim CLAIMS[CLAIMS_MAX];
static uint8_t OWN[OWN_MAX]; /* A's stream; zero-copy sends point into it */
static uint8_t MSG[MSG_MAX];
static uint8_t RBUF[WRITE_MAX];

#define PA (&Z.p[SA])
#define PB (&Z.p[SB])

static struct sv_clock clock_now(void)
{
	fake_clock_us = Z.now;
	return (struct sv_clock){.us = Z.unread_clock ? 0 : Z.now, .source = fake_clock_read};
}

/* ---- A's guarded transport ----------------------------------------------- */

static void *g_recv_buf(void *x, uint32_t i)
{
	struct guard *g = x;
	return g->inner.ops->recv_buf(g->inner.ctx, i);
}

static void *g_send_buf(void *x, uint32_t i)
{
	struct guard *g = x;
	return g->inner.ops->send_buf(g->inner.ctx, i);
}

static int g_post_recv(void *x, uint32_t i, bool big)
{
	struct guard *g = x;
	int r = g->inner.ops->post_recv(g->inner.ctx, i, big);
	if (r == 0 && g->on)
		FZ_POISON(g->ep->rbuf[i], g->ep->buf_size);
	return r;
}

static int g_post_send(void *x, uint32_t slot, uint32_t len, const struct iovec *iov, int iovcnt)
{
	struct guard *g = x;
	return g->inner.ops->post_send(g->inner.ctx, slot, len, iov, iovcnt);
}

static int g_grow(void *x, bool recv)
{
	struct guard *g = x;
	return g->inner.ops->grow(g->inner.ctx, recv);
}

static void g_send_big(void *x, uint32_t slot)
{
	struct guard *g = x;
	g->inner.ops->send_big(g->inner.ctx, slot);
}

static void g_shrink(void *x, bool recv)
{
	struct guard *g = x;
	g->inner.ops->shrink(g->inner.ctx, recv);
}

static const struct sv_xport_ops guard_ops = {
	.recv_buf = g_recv_buf,
	.send_buf = g_send_buf,
	.post_recv = g_post_recv,
	.post_send = g_post_send,
	.grow = g_grow,
	.send_big = g_send_big,
	.shrink = g_shrink,
};

/* ---- The peer's reports -------------------------------------------------- */

static void claim_add(uint32_t cap, uint32_t n)
{
	if (!n)
		return;
	if (Z.cl_tail > Z.cl_head && CLAIMS[Z.cl_tail - 1].cap == cap) {
		CLAIMS[Z.cl_tail - 1].n += n;
	} else {
		CHECK(Z.cl_tail < CLAIMS_MAX, "%u credit reports", Z.cl_tail);
		CLAIMS[Z.cl_tail++] = (struct claim){cap, n};
	}
	Z.cl_total += n;
}

/* A message of A's went into the peer's oldest reported buffer: its size. */
static uint32_t claim_take(void)
{
	struct claim *c = &CLAIMS[Z.cl_head];
	uint32_t cap = c->cap;
	if (--c->n == 0)
		Z.cl_head++;
	Z.cl_total--;
	return cap;
}

/* The peer's message h goes to a live A: it spends a credit, and its report
 * is noted, true or not. */
static void note_report(const struct sv_hdr *h)
{
	Z.pc--;
	uint32_t cap;
	if (h->flags == 0)
		cap = Z.start_cap;
	else if (h->flags >= SV_SIZE_CODE_MIN && h->flags <= SV_SIZE_CODE_MAX)
		cap = 1u << h->flags;
	else
		return; /* no size: A must refuse the message */
	if (h->credits > Z.unrep || (h->credits && cap > Z.phys))
		Z.lied = true;
	else
		Z.unrep -= h->credits;
	claim_add(cap, h->credits);
}

/* ---- The sink: what A sends ---------------------------------------------- */

static void check_sent(const uint8_t *m, uint32_t byte_len)
{
	CHECK(byte_len >= SV_HDR_SIZE, "A sent %u bytes", byte_len);
	struct sv_hdr h;
	sv_hdr_decode(m, &h);
	const uint8_t *pl = m + SV_HDR_SIZE;
	CHECK(byte_len == SV_HDR_SIZE + (uint64_t)h.len, "A's header says %u bytes, it sent %u",
	      h.len, byte_len - SV_HDR_SIZE);
	CHECK(Z.cl_total > 0, "A sent a message (type %u) with no credit reported", h.type);
	uint32_t cap = claim_take();
	CHECK(h.len <= cap, "A sent %u bytes (type %u) into a buffer reported at %u", h.len, h.type,
	      cap);
	CHECK(h.flags == 0 || (h.flags >= SV_SIZE_CODE_MIN && h.flags <= SV_SIZE_CODE_MAX),
	      "A sent size code %u", h.flags);
	Z.pc += h.credits;
	CHECK(Z.pc <= (int64_t)sv_proto_nrecv(&Z.prm),
	      "A gave the peer %lld credits, it has %u buffers", (long long)Z.pc,
	      sv_proto_nrecv(&Z.prm));
	CHECK(h.ack >= Z.s_ack, "A's acknowledgment went back from %llu to %llu",
	      (unsigned long long)Z.s_ack, (unsigned long long)h.ack);
	Z.s_ack = h.ack;
	switch (h.type) {
	case SV_MSG_DATA:
		CHECK(Z.s_state == SV_TX_OPEN, "DATA with A's sending in state %d", Z.s_state);
		CHECK(h.len > 0 && h.seq == Z.s_nxt,
		      "DATA of %u bytes at %llu, A's stream is at %llu", h.len,
		      (unsigned long long)h.seq, (unsigned long long)Z.s_nxt);
		for (uint32_t i = 0; i < h.len; i++)
			CHECK(pl[i] == own_byte(h.seq + i), "byte %llu of A's stream went wrong",
			      (unsigned long long)(h.seq + i));
		Z.s_nxt += h.len;
		break;
	case SV_MSG_UPDATE:
		CHECK(h.len == 0, "an UPDATE of %u bytes", h.len);
		break;
	case SV_MSG_DRAIN:
		CHECK(h.len == 0 && Z.s_state != SV_TX_BACK, "a DRAIN of %u bytes in state %d",
		      h.len, Z.s_state);
		break;
	case SV_MSG_TO_RDMA:
		CHECK(h.len == 0 && Z.s_state == SV_TX_TCP && h.seq >= Z.s_nxt,
		      "TO_RDMA at %llu in state %d, A's stream at %llu", (unsigned long long)h.seq,
		      Z.s_state, (unsigned long long)Z.s_nxt);
		Z.s_state = SV_TX_OPEN;
		Z.s_nxt = h.seq;
		break;
	case SV_MSG_TO_TCP:
	case SV_MSG_FIN:
		CHECK(h.len == 0 && Z.s_state == SV_TX_OPEN && h.seq == Z.s_nxt,
		      "type %u at %llu in state %d, A's stream at %llu", h.type,
		      (unsigned long long)h.seq, Z.s_state, (unsigned long long)Z.s_nxt);
		Z.s_state = h.type == SV_MSG_FIN ? SV_TX_FIN : SV_TX_TCP;
		break;
	case SV_MSG_RESET:
		CHECK(h.len == 0, "a RESET of %u bytes", h.len);
		Z.s_state = SV_TX_RESET;
		break;
	case SV_MSG_BACK: {
		bool sending = Z.s_state == SV_TX_OPEN || Z.s_state == SV_TX_FIN;
		CHECK(h.len == SV_BACK_PAYLOAD && sending && h.seq == Z.s_nxt,
		      "BACK of %u bytes at %llu in state %d", h.len, (unsigned long long)h.seq,
		      Z.s_state);
		uint64_t x = sv_get64(pl);
		CHECK(x <= h.ack, "A's BACK says it consumed %llu bytes, it acknowledged %llu",
		      (unsigned long long)x, (unsigned long long)h.ack);
		Z.s_state = SV_TX_BACK;
		Z.s_ret = x;
		break;
	}
	case SV_MSG_RETURN:
		CHECK(Z.s_state == SV_TX_BACK && h.len > 0 && h.seq == Z.s_ret,
		      "RETURN of %u bytes at %llu in state %d, expected at %llu", h.len,
		      (unsigned long long)h.seq, Z.s_state, (unsigned long long)Z.s_ret);
		for (uint32_t i = 0; i < h.len; i++)
			CHECK(pl[i] == peer_byte(h.seq + i), "A gave back byte %llu wrong",
			      (unsigned long long)(h.seq + i));
		Z.s_ret += h.len;
		break;
	default:
		CHECK(false, "A sent a message of type %u", h.type);
	}
}

/* Take what A sent, check it, and give the buffer back to the NIC at once. */
static void sink(void)
{
	struct fake_evq *q = &Z.fp.ep[SB].cq;
	struct fake_ep *eb = &Z.fp.ep[SB];
	while (q->count) {
		struct fake_ev ev = q->ev[q->head];
		q->head = (q->head + 1) % q->cap;
		q->count--;
		CHECK(ev.kind == FAKE_EV_RECV, "B's core is silent, yet a send of B's completed");
		eb->rstate[ev.idx] = FAKE_RB_OWNED;
		eb->delivered++;
		struct sv_hdr th;
		sv_hdr_decode(eb->rbuf[ev.idx], &th);
		trace("  A sent: type %u flags %u credits %u len %u seq %llu ack %llu", th.type,
		      th.flags, th.credits, th.len, (unsigned long long)th.seq,
		      (unsigned long long)th.ack);
		check_sent(eb->rbuf[ev.idx], ev.byte_len);
		int r = Z.bx.ops->post_recv(Z.bx.ctx, ev.idx, false);
		CHECK(r == 0, "the sink could not repost buffer %u: %s", ev.idx, eb->why);
		Z.unrep++;
	}
}

/* ---- The peer's messages ------------------------------------------------- */

/* Message h into A's oldest posted buffer, `want` bytes of it as the
 * completion reports them; x is a BACK's payload. DATA carries the peer's
 * stream and RETURN A's own, at the header's offset, whether or not that
 * is where they belong. */
static void inject(const struct sv_hdr *h, int64_t want, uint64_t x)
{
	struct fake_ep *ea = &Z.fp.ep[SA];
	if (Z.qp_gone || ea->rcount == 0)
		return; /* no buffer posted: the peer's message would wait (RNR) */
	uint32_t rb = ea->rfifo[ea->rhead];
	/* A message longer than the buffer posted for it ends in an error
	 * completion, never in a receive: it does not reach the core. */
	uint32_t room = ea->rsize[rb];
	uint32_t n = want < 0 ? 0 : want < (int64_t)room ? (uint32_t)want : room;
	uint8_t hb[SV_HDR_SIZE];
	sv_hdr_encode(h, hb);
	memcpy(MSG, hb, n < SV_HDR_SIZE ? n : SV_HDR_SIZE);
	for (uint32_t i = SV_HDR_SIZE; i < n; i++) {
		uint64_t k = i - SV_HDR_SIZE;
		if (h->type == SV_MSG_DATA)
			MSG[i] = peer_byte(h->seq + k);
		else if (h->type == SV_MSG_RETURN)
			MSG[i] = own_byte(h->seq + k);
		else if (h->type == SV_MSG_BACK && k < 8)
			MSG[i] = (uint8_t)(x >> (8 * k));
		else
			MSG[i] = 0x5C;
	}
	trace("  peer: type %u flags %u credits %u len %u seq %llu ack %llu x %llu, %u bytes",
	      h->type, h->flags, h->credits, h->len, (unsigned long long)h->seq,
	      (unsigned long long)h->ack, (unsigned long long)x, n);
	if (sv_proto_error(PA) == 0)
		note_report(h);
	FZ_UNPOISON(ea->rbuf[rb], n);
	int r = fake_inject(ea, MSG, n, n);
	CHECK(r == 0, "fake_inject: %d", r);
}

/* Message types, weighted: mostly the ones that carry the stream. */
static const uint8_t TYPES[32] = {
	SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,
	SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,   SV_MSG_DATA,
	SV_MSG_UPDATE, SV_MSG_UPDATE, SV_MSG_UPDATE, SV_MSG_UPDATE, SV_MSG_UPDATE,
	SV_MSG_TO_RDMA, SV_MSG_TO_RDMA, SV_MSG_TO_TCP, SV_MSG_TO_TCP, SV_MSG_FIN,
	SV_MSG_FIN,    SV_MSG_BACK,   SV_MSG_BACK,   SV_MSG_RETURN, SV_MSG_RETURN,
	SV_MSG_RETURN, SV_MSG_DRAIN,  SV_MSG_DRAIN,  SV_MSG_RESET,  0,
	10,            0xff,
};

/* A message as the peer would send it in A's state now (true credits, the
 * set-up's or B's full size, the next offset, everything A sent
 * acknowledged), then bent where the input says. */
static void peer_message(struct input *in)
{
	struct sv_proto *a = PA;
	struct fake_ep *ea = &Z.fp.ep[SA];
	uint8_t t = in8(in), v = in8(in);
	struct sv_hdr h = {.type = TYPES[t & 31]};
	uint64_t snd, rcv, rd;
	sv_proto_offsets(a, &snd, &rcv, &rd);
	uint32_t room = ea->rcount ? ea->rsize[ea->rfifo[ea->rhead]] : SV_HDR_SIZE + 1;
	uint32_t cap = room > SV_HDR_SIZE ? room - SV_HDR_SIZE : 1;

	if (v & 0x01)
		h.credits = in16(in);
	else
		h.credits = (uint16_t)(in8(in) % (Z.unrep + 1));
	if (v & 0x02)
		h.flags = in8(in);
	else
		h.flags = (t & 0x20) ? Z.phys_code : 0;
	h.seq = rcv;
	switch (h.type) {
	case SV_MSG_DATA:
		/* Full buffers in a row make A's receive buffers grow. */
		h.len = t & 0x80 ? cap : 1 + in16(in) % cap;
		break;
	case SV_MSG_RETURN: {
		uint64_t left = a->back_seq > a->owed_nxt ? a->back_seq - a->owed_nxt : 1;
		uint64_t m = left < cap ? left : cap;
		h.len = (uint32_t)(1 + in16(in) % m);
		h.seq = a->owed_nxt;
		break;
	}
	case SV_MSG_BACK:
		h.len = SV_BACK_PAYLOAD;
		break;
	case SV_MSG_TO_RDMA:
		if (t & 0x40)
			h.seq += in8(in); /* the peer wrote that much more on TCP */
		break;
	default:
		break;
	}
	h.ack = Z.s_nxt;
	uint64_t x = h.ack;
	if (h.type == SV_MSG_BACK)
		x -= in8(in) % (h.ack + 1); /* what the peer's application consumed */
	int64_t want = SV_HDR_SIZE + (int64_t)h.len;
	if (v & 0x04) {
		uint8_t w = in8(in);
		if (w & 0x01)
			h.seq += (uint64_t)in_delta(in);
		if (w & 0x02)
			h.seq = in64(in);
		if (w & 0x04)
			h.len += (uint32_t)in_delta(in);
		if (w & 0x08)
			h.len = in32(in);
		if (w & 0x10)
			h.ack += (uint64_t)in_delta(in);
		if (w & 0x20)
			h.ack = in64(in);
		if (w & 0x40)
			x = in64(in);
		want = SV_HDR_SIZE + (int64_t)h.len;
		if (w & 0x80)
			want += in_delta(in);
	}
	inject(&h, want, x);
}

/* A header straight from the input. */
static void peer_raw(struct input *in)
{
	uint8_t b[SV_HDR_SIZE];
	for (int i = 0; i < SV_HDR_SIZE; i++)
		b[i] = in8(in);
	struct sv_hdr h;
	sv_hdr_decode(b, &h);
	int64_t want = SV_HDR_SIZE + (int64_t)h.len + in_delta(in);
	inject(&h, want, in64(in));
}

/* ---- A's own operations -------------------------------------------------- */

/* [base, base + len) as up to three pieces, cut where the input says. */
static int cut(struct input *in, uint8_t *base, size_t len, struct iovec iov[3])
{
	int k = 1 + in8(in) % 3;
	size_t off = 0;
	for (int i = 0; i < k; i++) {
		size_t left = len - off;
		size_t n = i == k - 1 ? left : in8(in) % (left + 1);
		iov[i] = (struct iovec){base + off, n};
		off += n;
	}
	return k;
}

static void op_send(struct input *in)
{
	uint8_t f = in8(in);
	size_t len = f & 0x80 ? 1 + in16(in) % WRITE_MAX : 1 + in8(in) % 64u;
	if (Z.txo + len > OWN_MAX)
		return;
	struct iovec iov[3];
	int k = cut(in, OWN + Z.txo, len, iov);
	enum sv_tx_state before = sv_proto_tx_state(PA);
	struct sv_clock c = clock_now();
	long r = sv_proto_send(PA, iov, k, f & 1 ? MSG_MORE : 0, &c);
	if (r > 0) {
		CHECK((size_t)r <= len, "send took %ld of %zu bytes", r, len);
		Z.txo += (uint64_t)r;
	} else if (before == SV_TX_TCP && r == -EINVAL) {
		Z.txo += len; /* the stream writes it on TCP */
	} else {
		CHECK(r == -EAGAIN || r == -EPIPE || r == -EINVAL ||
			      (r < 0 && r == sv_proto_error(PA)),
		      "send of %zu bytes returned %ld", len, r);
	}
}

static void op_recv(struct input *in)
{
	uint8_t f = in8(in);
	size_t len = f & 0x80 ? in16(in) % (WRITE_MAX + 1) : in8(in) % 65u;
	struct iovec iov[3];
	int k = cut(in, RBUF, len, iov);
	uint64_t snd, rcv, rd0, rd1;
	sv_proto_offsets(PA, &snd, &rcv, &rd0);
	bool peek = f & 1;
	struct sv_clock c = clock_now();
	long r = sv_proto_recv(PA, iov, k, peek ? MSG_PEEK : 0, &c);
	sv_proto_offsets(PA, &snd, &rcv, &rd1);
	if (r > 0) {
		CHECK((size_t)r <= len, "recv returned %ld for %zu bytes", r, len);
		for (long i = 0; i < r; i++)
			CHECK(RBUF[i] == peer_byte(rd0 + (uint64_t)i),
			      "read byte %llu of the peer's stream wrong",
			      (unsigned long long)(rd0 + (uint64_t)i));
		CHECK(rd1 == (peek ? rd0 : rd0 + (uint64_t)r),
		      "read %ld bytes, rcv_read %llu -> %llu", r, (unsigned long long)rd0,
		      (unsigned long long)rd1);
	} else {
		CHECK(rd1 == rd0, "a read of nothing moved rcv_read");
		CHECK(r == 0 || r == -EAGAIN || r == sv_proto_error(PA), "recv returned %ld", r);
	}
}

static void check_result(int r, const char *what)
{
	CHECK(r == 0 || r == -EAGAIN || r == -EINVAL || r == -EPIPE ||
		      (r < 0 && r == sv_proto_error(PA)),
	      "%s returned %d", what, r);
}

static void op_flush(struct input *in)
{
	struct sv_clock c = clock_now();
	int r = sv_proto_flush(PA, (enum sv_flush_reason)(in8(in) % SV_FLUSH_REASONS), &c);
	check_result(r, "flush");
}

static void op_timers(struct input *in)
{
	uint8_t d = in8(in);
	static const uint64_t unit[4] = {1, 20, 200, 5000};
	Z.now += (uint64_t)(d & 0x3f) * unit[d >> 6];
	struct sv_clock c = clock_now();
	sv_proto_timers(PA, &c);
	c = clock_now();
	sv_proto_next_deadline(PA, &c);
}

static void op_shutdown(struct input *in)
{
	struct sv_clock c = clock_now();
	if (in8(in) & 1)
		check_result(sv_proto_shutdown_tx(PA, &c), "shutdown_tx");
	else
		check_result(sv_proto_send_fin(PA, &c), "send_fin");
}

/* Our sending moves to the QP after what TCP carried, or back to TCP. */
static void op_switch(struct input *in)
{
	uint8_t f = in8(in);
	struct sv_clock c = clock_now();
	bool on_tcp = sv_proto_tx_state(PA) == SV_TX_TCP;
	if (Z.qp_gone && on_tcp)
		return; /* no QP to move to */
	if (on_tcp || (f & 1)) {
		if (on_tcp && (f & 2) && Z.txo + f < OWN_MAX)
			Z.txo += f; /* more bytes on TCP first */
		check_result(sv_proto_send_to_rdma(PA, Z.txo, &c), "send_to_rdma");
	} else {
		check_result(sv_proto_send_to_tcp(PA, &c), "send_to_tcp");
	}
}

/* The stream layer's answer to the peer's TO_RDMA. */
static void op_accept(struct input *in)
{
	uint64_t seq;
	bool sw = sv_proto_peer_switch(PA, &seq);
	/* A refusal leaves the connection on TCP for good (the stream falls
	 * back): the QP's data after the refused point is never read, and no
	 * later switch is accepted. Nor is one after our BACK: the detaching
	 * stream reads TCP as it is (sv_stream_may_switch). */
	if (Z.refused || sv_proto_back_sent(PA))
		return;
	if (!sw || (in8(in) & 1)) {
		int r = sv_proto_rx_accept(PA);
		CHECK(r == 0 || r == -EINVAL || r == sv_proto_error(PA), "rx_accept returned %d",
		      r);
		CHECK(r != 0 || sw, "rx_accept without a TO_RDMA");
	} else {
		sv_proto_rx_refuse(PA);
		Z.refused = true;
	}
}

/* The way back: BACK (with bytes read from TCP and not consumed), or the
 * RETURNs that follow both BACKs. */
static void op_back(struct input *in)
{
	uint8_t f = in8(in);
	struct sv_clock c = clock_now();
	if (f & 1) {
		check_result(sv_proto_send_returns(PA, &c), "send_returns");
		return;
	}
	uint64_t snd, rcv, rd;
	sv_proto_offsets(PA, &snd, &rcv, &rd);
	uint8_t pre[64];
	size_t n = (f >> 1) % (sizeof(pre) + 1);
	if (n > rd)
		n = (size_t)rd;
	for (size_t i = 0; i < n; i++)
		pre[i] = peer_byte(rd - n + i);
	check_result(sv_proto_send_back(PA, pre, n, &c), "send_back");
}

/* The stream writes some of the bytes given back to A on TCP. */
static void op_owed(struct input *in)
{
	const void *buf;
	size_t len;
	sv_proto_owed(PA, &buf, &len);
	if (!len)
		return;
	CHECK(PA->peer_back, "%zu bytes owed without the peer's BACK", len);
	/* They are A's own stream from the peer's BACK on: returned, then
	 * what never went over the QP. */
	uint64_t base = PA->peer_back_x + Z.owed_taken;
	for (size_t i = 0; i < len; i++)
		CHECK(((const uint8_t *)buf)[i] == own_byte(base + i),
		      "owed byte %llu of A's stream is wrong", (unsigned long long)(base + i));
	size_t n = 1 + in16(in) % len;
	sv_proto_owed_consume(PA, n);
	Z.owed_taken += n;
}

/* Send completions held back keep A's messages in flight. */
static void op_hold(struct input *in)
{
	struct fake_ep *ea = &Z.fp.ep[SA];
	uint8_t f = in8(in);
	if (f & 1)
		ea->hold_send_done = !ea->hold_send_done;
	fake_release_sends(ea, ea->hold_send_done ? (size_t)(f >> 1) : SIZE_MAX);
}

static void op_options(struct input *in)
{
	uint8_t f = in8(in);
	struct sv_clock c = clock_now();
	if (f & 1)
		check_result(sv_proto_set_nodelay(PA, f & 2, &c), "set_nodelay");
	if (f & 4)
		check_result(sv_proto_set_cork(PA, f & 8, &c), "set_cork");
	if (f & 16)
		Z.unread_clock = !Z.unread_clock;
}

static void op_reset(struct input *in)
{
	if (in8(in) & 1)
		check_result(sv_proto_send_reset(PA), "send_reset");
	else
		sv_proto_abort(PA, -EIO); /* the stream layer's own failure */
}

/* The QP ends: a flushed work request, a disconnect, then what the stream
 * does once the CQ is drained. Nothing arrives after it. */
static void op_end(struct input *in)
{
	uint8_t f = in8(in);
	if (!Z.qp_gone) {
		bool end = f & 1 ? sv_proto_flush_is_end(PA) : sv_proto_peer_ended(PA);
		if (!end)
			sv_proto_abort(PA, -EIO);
		Z.qp_gone = true;
		return;
	}
	sv_proto_rx_lost_qp(PA);
	const void *buf;
	size_t len;
	uint64_t snd, rcv, rd;
	sv_proto_offsets(PA, &snd, &rcv, &rd);
	if (sv_proto_tx_lost_qp(PA, &buf, &len) == 0)
		for (size_t i = 0; i < len; i++)
			CHECK(((const uint8_t *)buf)[i] == own_byte(snd + i),
			      "coalesced byte %llu of A's stream is wrong",
			      (unsigned long long)(snd + i));
}

/* ---- Checks -------------------------------------------------------------- */

/* After every step; `quiet` when A's completions are all delivered. */
static void check(bool quiet)
{
	struct sv_proto *a = PA;
	struct fake_ep *ea = &Z.fp.ep[SA], *eb = &Z.fp.ep[SB];
	CHECK(eb->violations == 0, "the sink broke the transport's rules: %s", eb->why);
	CHECK(ea->violations == 0 || Z.lied, "A broke the transport's rules: %s", ea->why);
	int err = sv_proto_error(a);
	CHECK(!Z.err || err == Z.err, "the first error %d became %d", Z.err, err);
	Z.err = err;

	uint64_t snd, rcv, rd;
	sv_proto_offsets(a, &snd, &rcv, &rd);
	CHECK(snd >= Z.snd_nxt && rcv >= Z.rcv_nxt && rd >= Z.rcv_read,
	      "offsets went back: snd_nxt %llu -> %llu, rcv_nxt %llu -> %llu, "
	      "rcv_read %llu -> %llu",
	      (unsigned long long)Z.snd_nxt, (unsigned long long)snd,
	      (unsigned long long)Z.rcv_nxt, (unsigned long long)rcv,
	      (unsigned long long)Z.rcv_read, (unsigned long long)rd);
	CHECK(rd <= rcv, "read %llu bytes, %llu arrived", (unsigned long long)rd,
	      (unsigned long long)rcv);
	Z.snd_nxt = snd;
	Z.rcv_nxt = rcv;
	Z.rcv_read = rd;
	uint64_t readable = sv_proto_readable(a);
	CHECK(readable <= rcv - rd, "%llu bytes readable, %llu unread",
	      (unsigned long long)readable, (unsigned long long)(rcv - rd));
	CHECK(a->snd_una <= snd, "the peer acknowledged %llu bytes of %llu",
	      (unsigned long long)a->snd_una, (unsigned long long)snd);
	CHECK(a->nfree <= sv_proto_nsend(&Z.prm), "%u free send buffers", a->nfree);
	CHECK(a->rxq_count <= a->rxq_cap && a->stashed_msgs <= a->rxq_count,
	      "%u unread messages (%u stashed), room for %u", a->rxq_count, a->stashed_msgs,
	      a->rxq_cap);
	CHECK(a->stashed <= (size_t)Z.prm.window * a->payload_max, "%zu bytes stashed",
	      a->stashed);
	/* The questions the stream layer asks must answer whatever the state. */
	(void)sv_proto_writable(a);
	(void)sv_proto_sends_done(a);
	(void)sv_proto_zcopy_busy(a);
	(void)sv_proto_rx_eof(a);
	(void)sv_proto_back_ready(a);
	(void)sv_proto_back_wanted(a);
	(void)sv_proto_back_done(a);
	(void)sv_proto_qp_used(a);
	(void)sv_proto_resumable(a);
	if (err || !quiet)
		return;

	uint32_t nrecv = sv_proto_nrecv(&Z.prm);
	uint32_t posted = fake_posted(ea);
	uint32_t in_bufs = a->rxq_count - a->stashed_msgs;
	uint32_t held = a->rx_held >= 0;
	CHECK(posted + in_bufs + held == nrecv,
	      "%u posted + %u holding data + %u held back != %u receive buffers", posted, in_bufs,
	      held, nrecv);
	CHECK(a->peer_credits + a->unreported == posted,
	      "the peer's credits %u + %u unreported != %u posted", a->peer_credits,
	      a->unreported, posted);
	CHECK((int64_t)a->peer_credits == Z.pc, "A thinks the peer has %u credits, it has %lld",
	      a->peer_credits, (long long)Z.pc);
	CHECK(a->credits <= a->peer_nrecv, "%u credits, the peer has %u buffers", a->credits,
	      a->peer_nrecv);
	CHECK(a->credits == Z.cl_total, "%u credits, the peer reported %llu", a->credits,
	      (unsigned long long)Z.cl_total);
	CHECK(Z.lied || a->credits <= fake_posted(eb), "%u credits, %u buffers posted",
	      a->credits, fake_posted(eb));
}

/* Deliver A's completions. A break in them is a reset, from a message A
 * refused or the peer's RESET, unless the peer lied about its buffers
 * (then a send may fail in the transport). */
static void poll_a(void)
{
	bool alive = sv_proto_error(PA) == 0;
	fake_clock_us = Z.now;
	int r = fake_poll(&Z.fp.ep[SA], PA, Z.unread_clock ? SV_NOW_UNREAD : Z.now);
	int err = sv_proto_error(PA);
	CHECK(r >= 0 || r == err, "a completion returned %d, the core's error is %d", r, err);
	CHECK(!alive || !err || err == -ECONNRESET || Z.lied,
	      "a completion broke the core with %d, not a reset", err);
}

/* ---- Set-up -------------------------------------------------------------- */

static void pump(void)
{
	for (int i = 0; i < 1000; i++) {
		if (!fake_pending(&Z.fp.ep[SA]) && !fake_pending(&Z.fp.ep[SB]))
			return;
		for (int s = 0; s < 2; s++) {
			int r = fake_poll(&Z.fp.ep[s], &Z.p[s], Z.now);
			CHECK(r >= 0, "handshake: side %d: a completion failed: %d", s, r);
		}
	}
	CHECK(false, "the handshake never settles");
}

/* Both directions to the QP, each after a few bytes on TCP, as the unit
 * tests' open_both does. */
static void handshake(struct input *in)
{
	uint64_t b_tcp = in8(in);
	Z.txo = in8(in);
	struct sv_clock c = clock_now();
	int r = sv_proto_send_to_rdma(PA, Z.txo, &c);
	CHECK(r == 0, "A's TO_RDMA: %d", r);
	pump();
	c = clock_now();
	r = sv_proto_send_to_rdma(PB, b_tcp, &c);
	CHECK(r == 0, "B's TO_RDMA: %d", r);
	pump();
	CHECK(sv_proto_rx_accept(PA) == 0 && sv_proto_rx_accept(PB) == 0, "a switch refused");
}

/* The parameters, from the input's first three bytes; *refuse: A's
 * transport has no memory to grow its buffers. */
static struct sv_proto_params params(struct input *in, uint8_t c0, bool *refuse)
{
	static const uint32_t windows[4] = {2, 3, 4, 8};
	static const uint32_t sizes[4] = {64, 256, 1024, 200};
	uint8_t c1 = in8(in), c2 = in8(in);
	struct sv_proto_params prm = {0};
	prm.window = windows[c0 >> 6];
	prm.reserve = SV_RESERVE - 1 + (c1 & 1);
	prm.ack_delay = 1 + (uint32_t)(c1 >> 1 & 7) % (prm.window - 1);
	if (c0 & 0x04) {
		prm.buf_size = 2048 + SV_HDR_SIZE;
		prm.start_size = (c1 & 0x10 ? 1024 : 256) + SV_HDR_SIZE;
	} else {
		prm.buf_size = sizes[c1 >> 4 & 3] + SV_HDR_SIZE;
	}
	uint32_t pmax = prm.buf_size - SV_HDR_SIZE;
	prm.coalesce = c0 & 0x02;
	prm.coalesce_size = c1 & 0x40 ? pmax : pmax < 64 ? pmax : 64;
	prm.ack_timeout_us = 100 + (uint64_t)(c2 >> 1) * 10;
	prm.coalesce_timeout_us = 50 + (uint64_t)(c2 >> 1);
	prm.zcopy_threshold = c0 & 0x08 ? 200 : 1u << 30;
	prm.idle_us = c0 & 0x10 ? 500 : 0;
	Z.unread_clock = c1 & 0x80;
	*refuse = c2 & 1;
	return prm;
}

static void setup(struct input *in)
{
	static bool own_ready;
	if (!own_ready) {
		for (uint32_t o = 0; o < OWN_MAX; o++)
			OWN[o] = own_byte(o);
		own_ready = true;
	}
	memset(&Z, 0, sizeof(Z));
	Z.now = 1000;
	uint8_t c0 = in8(in);
	bool refuse;
	struct sv_proto_params prm = params(in, c0, &refuse);
	Z.prm = prm;
	uint32_t nr = sv_proto_nrecv(&prm), ns = sv_proto_nsend(&prm);
	uint32_t start = sv_proto_start_size(&prm);
	CHECK(fake_pair_init(&Z.fp, nr, ns, prm.buf_size) == 0, "fake_pair_init");
	CHECK(prm.buf_size <= MSG_MAX, "buffers of %u bytes", prm.buf_size);
	for (int s = 0; s < 2; s++)
		if (start < prm.buf_size)
			fake_ep_grows(&Z.fp.ep[s], start);
	Z.fp.ep[SA].refuse_grow = refuse;
	Z.guard = (struct guard){.inner = fake_xport(&Z.fp.ep[SA]), .ep = &Z.fp.ep[SA]};
	struct sv_xport ax = {.ops = &guard_ops, .ctx = &Z.guard};
	Z.bx = fake_xport(&Z.fp.ep[SB]);
	CHECK(sv_proto_init(PA, &prm, &ax) == 0, "A: sv_proto_init");
	CHECK(sv_proto_init(PB, &prm, &Z.bx) == 0, "B: sv_proto_init");
	CHECK(sv_proto_set_peer(PA, nr, start) == 0 && sv_proto_set_peer(PB, nr, start) == 0,
	      "sv_proto_set_peer");
	if (c0 & 0x01)
		handshake(in);

	/* From here on the input is the peer. B's buffers all go to the NIC
	 * at full size, so that whatever A sends into a buffer that was
	 * reported to it fits. */
	struct fake_ep *ea = &Z.fp.ep[SA], *eb = &Z.fp.ep[SB];
	CHECK(ea->violations == 0 && eb->violations == 0, "handshake: %s%s", ea->why, eb->why);
	CHECK(PA->peer_credits == PB->credits && PB->peer_credits == PA->credits,
	      "handshake: credit views differ");
	CHECK(PA->run_count == 1, "handshake: %u sizes of credits", PA->run_count);
	eb->start_size = 0;
	for (uint32_t i = 0; i < eb->nrecv; i++)
		eb->rsize[i] = eb->buf_size;
	for (uint32_t i = 0; i < eb->nrecv; i++)
		if (eb->rstate[i] == FAKE_RB_OWNED)
			CHECK(Z.bx.ops->post_recv(Z.bx.ctx, i, false) == 0, "sink: %s", eb->why);
	CHECK(PA->credits <= fake_posted(eb), "handshake: %u credits", PA->credits);
	Z.unrep = fake_posted(eb) - PA->credits;
	Z.phys = eb->buf_size - SV_HDR_SIZE;
	Z.phys_code = sv_size_code(Z.phys);
	Z.start_cap = start - SV_HDR_SIZE;
	Z.pc = PB->credits;
	claim_add(PA->runs[PA->run_head].cap, PA->credits);
	Z.s_state = PA->tx_state;
	sv_proto_offsets(PA, &Z.s_nxt, &Z.s_ack, &Z.rcv_read);
	Z.snd_nxt = Z.s_nxt;
	Z.rcv_nxt = Z.s_ack;
	for (uint32_t i = 0; i < ea->nrecv; i++)
		if (ea->rstate[i] == FAKE_RB_POSTED)
			FZ_POISON(ea->rbuf[i], ea->buf_size);
	Z.guard.on = true;
	ea->hold_send_done = c0 & 0x20;
}

static void teardown(void)
{
	struct fake_ep *ea = &Z.fp.ep[SA];
	for (uint32_t i = 0; i < ea->nrecv; i++)
		FZ_UNPOISON(ea->rbuf[i], ea->buf_size);
	sv_proto_destroy(PA);
	sv_proto_destroy(PB);
	fake_pair_destroy(&Z.fp);
}

/* ---- One input ----------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = {data, size, 0};
	setup(&in);
	for (int step = 0; step < STEPS_MAX && in.off < in.n; step++) {
		uint8_t op = in8(&in);
		trace("step %d: op %u (%#x) tx %d err %d", step, op & 0x1f, op,
		      sv_proto_tx_state(PA), sv_proto_error(PA));
		switch (op & 0x1f) {
		case 10:
			peer_raw(&in);
			break;
		case 11:
			for (int k = 2 + in8(&in) % 3; k > 0; k--)
				peer_message(&in);
			break;
		case 12:
		case 13:
		case 14:
		case 30:
			op_send(&in);
			break;
		case 15:
		case 16:
		case 17:
		case 31:
			op_recv(&in);
			break;
		case 18:
			op_flush(&in);
			break;
		case 19:
		case 20:
			op_timers(&in);
			break;
		case 21:
			op_shutdown(&in);
			break;
		case 22:
			op_switch(&in);
			break;
		case 23:
			op_accept(&in);
			break;
		case 24:
			op_back(&in);
			break;
		case 25:
			op_owed(&in);
			break;
		case 26:
			op_hold(&in);
			break;
		case 27:
			op_options(&in);
			break;
		case 28:
			op_reset(&in);
			break;
		case 29:
			op_end(&in);
			break;
		default:
			peer_message(&in);
			break;
		}
		/* Now and then the completions wait for a later step, as they
		 * wait in the CQ while the application calls in. */
		bool quiet = (op & 0xe0) != 0xe0;
		if (quiet)
			poll_a();
		sink();
		check(quiet);
	}
	/* The end: every completion delivered, nothing left broken. */
	fake_release_sends(&Z.fp.ep[SA], SIZE_MAX);
	poll_a();
	sink();
	check(true);
	teardown();
	return 0;
}
