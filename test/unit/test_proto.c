/* The protocol core against the in-process fake transport (fake_xport.c).
 *
 * Written from the contract in src/proto.h (and the notes that go with it):
 * credits and the pre-post rule, delayed and piggybacked ACKs, the coalescing
 * flush rules, zero copy, the medium-switch byte accounting, FIN, malformed
 * input, and a randomized soak. Everything is deterministic: time is a
 * number the tests pass in, and the soak uses fixed seeds.
 *
 * Side A is P[SA] on FP.ep[SA], side B is P[SB] on FP.ep[SB]. Each side
 * writes its own fixed pseudo-random byte stream (STREAM[s]); TXO[s] is how
 * much of it the core took, RXO[s] how much of the peer's stream s consumed,
 * and every byte received is compared with the stream. */
#include "fake_xport.h"
#include "log.h"
#include "proto.h"
#include "proto_int.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* The calls that take a clock, with the time as a number (FAKE_CLK). */
static long t_send(struct sv_proto *p, const struct iovec *iov, int n, int fl, uint64_t now)
{
	return sv_proto_send(p, iov, n, fl, FAKE_CLK(now));
}
static long t_recv(struct sv_proto *p, const struct iovec *iov, int n, int fl, uint64_t now)
{
	return sv_proto_recv(p, iov, n, fl, FAKE_CLK(now));
}
static int t_flush(struct sv_proto *p, enum sv_flush_reason why, uint64_t now)
{
	return sv_proto_flush(p, why, FAKE_CLK(now));
}
static uint64_t t_timers(struct sv_proto *p, uint64_t now)
{
	return sv_proto_timers(p, FAKE_CLK(now));
}
static uint64_t t_next_deadline(struct sv_proto *p, uint64_t now)
{
	return sv_proto_next_deadline(p, FAKE_CLK(now));
}
static int t_send_to_rdma(struct sv_proto *p, uint64_t seq, uint64_t now)
{
	return sv_proto_send_to_rdma(p, seq, FAKE_CLK(now));
}
static int t_send_to_tcp(struct sv_proto *p, uint64_t now)
{
	return sv_proto_send_to_tcp(p, FAKE_CLK(now));
}
static int t_send_fin(struct sv_proto *p, uint64_t now)
{
	return sv_proto_send_fin(p, FAKE_CLK(now));
}
static int t_shutdown_tx(struct sv_proto *p, uint64_t now)
{
	return sv_proto_shutdown_tx(p, FAKE_CLK(now));
}
static int t_send_back(struct sv_proto *p, const void *pre, size_t n, uint64_t now)
{
	return sv_proto_send_back(p, pre, n, FAKE_CLK(now));
}
static int t_send_returns(struct sv_proto *p, uint64_t now)
{
	return sv_proto_send_returns(p, FAKE_CLK(now));
}
#define sv_proto_send t_send
#define sv_proto_recv t_recv
#define sv_proto_flush t_flush
#define sv_proto_timers t_timers
#define sv_proto_next_deadline t_next_deadline
#define sv_proto_send_to_rdma t_send_to_rdma
#define sv_proto_send_to_tcp t_send_to_tcp
#define sv_proto_send_fin t_send_fin
#define sv_proto_shutdown_tx t_shutdown_tx
#define sv_proto_send_back t_send_back
#define sv_proto_send_returns t_send_returns
/* The receive side reads TCP (the core's own view, BACK or not). */
#define sv_proto_rx_on_tcp(p) (!(p)->rx_on_qp)

enum { SA = 0, SB = 1 };

#define STREAM_LEN (1u << 20)
#define RBUF_LEN (1u << 16)

static struct fake_pair FP;
static struct sv_proto P[2];
static bool P_UP[2];
static bool FP_UP;
static struct sv_proto_params PRM;
static uint64_t NOW;
static uint8_t *STREAM[2];
static uint64_t TXO[2], RXO[2];
static uint8_t RBUF[RBUF_LEN];
static uint64_t TO_RDMA_SEQ[2]; /* soak_switching: side s's last TO_RDMA offset */
static bool ACCEPTED[2];        /* ... the peer accepted side s's last TO_RDMA */

static char side_name(int s)
{
	return s == SA ? 'A' : 'B';
}

/* xorshift64*, all eight bytes of each output: every test fills 2 MiB,
 * and a step per byte was a seventh of the ASan copy's CPU time. */
static void fill_stream(uint8_t *buf, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		uint64_t w = x * 0x2545F4914F6CDD1Dull;
		if (n - i >= 8)
			memcpy(buf + i, &w, 8); /* one store */
		else
			memcpy(buf + i, &w, n - i);
	}
}

static void setup(void)
{
	sv_log_threshold = -1; /* malformed input is logged: keep the output quiet */
	NOW = 1000;
	memset(TXO, 0, sizeof(TXO));
	memset(RXO, 0, sizeof(RXO));
	memset(TO_RDMA_SEQ, 0, sizeof(TO_RDMA_SEQ));
	memset(ACCEPTED, 0, sizeof(ACCEPTED));
	for (int s = 0; s < 2; s++) {
		STREAM[s] = malloc(STREAM_LEN);
		cr_assert_not_null(STREAM[s]);
		fill_stream(STREAM[s], STREAM_LEN, (uint64_t)s + 7);
	}
}

static void teardown(void)
{
	for (int s = 0; s < 2; s++) {
		if (P_UP[s])
			sv_proto_destroy(&P[s]);
		P_UP[s] = false;
	}
	if (FP_UP)
		fake_pair_destroy(&FP);
	FP_UP = false;
	for (int s = 0; s < 2; s++) {
		free(STREAM[s]);
		STREAM[s] = NULL;
	}
}

TestSuite(proto, .init = setup, .fini = teardown, .timeout = 60);

/* ---- The harness ---------------------------------------------------------- */

static struct sv_proto_params prm_default(void)
{
	struct sv_proto_params p = {
		.window = 8,
		.reserve = 3,
		.buf_size = 256,
		.ack_delay = 4,
		.ack_timeout_us = 1000,
		.coalesce = false,
		.coalesce_size = 64,
		.coalesce_timeout_us = 500,
		.zcopy_threshold = 1u << 30,
	};
	return p;
}

static struct sv_proto_params prm_coalesce(void)
{
	struct sv_proto_params p = prm_default();
	p.coalesce = true;
	return p;
}

static uint32_t NRECV(void)
{
	return sv_proto_nrecv(&PRM);
}

/* Receive buffers side s posted. */
static uint32_t nrecv_of(int s)
{
	return FP.ep[s].nrecv;
}

static uint32_t PAYLOAD_MAX(void)
{
	return PRM.buf_size - SV_HDR_SIZE;
}

/* Two cores on a fresh fake pair, each with its own parameters (the
 * reserve must agree; the window and buffer size need not): both
 * directions on TCP, every receive buffer posted, each side's credits =
 * the peer's nrecv. PRM is A's. */
static void conn_up2(const struct sv_proto_params *pa, const struct sv_proto_params *pb)
{
	const struct sv_proto_params *prm2[2] = {pa, pb};
	PRM = *pa;
	uint32_t nr[2], ns[2], bs[2];
	for (int s = 0; s < 2; s++) {
		nr[s] = sv_proto_nrecv(prm2[s]);
		ns[s] = sv_proto_nsend(prm2[s]);
		bs[s] = prm2[s]->buf_size;
	}
	cr_assert_eq(fake_pair_init2(&FP, nr, ns, bs), 0);
	FP_UP = true;
	for (int s = 0; s < 2; s++) {
		struct sv_xport x = fake_xport(&FP.ep[s]);
		int r = sv_proto_init(&P[s], prm2[s], &x);
		cr_assert_eq(r, 0, "sv_proto_init (%c): %d", side_name(s), r);
		P_UP[s] = true;
	}
	for (int s = 0; s < 2; s++) {
		int r = sv_proto_set_peer(&P[s], nr[1 - s], bs[1 - s]);
		cr_assert_eq(r, 0, "sv_proto_set_peer (%c): %d", side_name(s), r);
		/* A message must fit our send buffer and the peer's receive buffer. */
		uint32_t small = bs[s] < bs[1 - s] ? bs[s] : bs[1 - s];
		cr_assert_eq(sv_pr_tx_cap(&P[s]), small - SV_HDR_SIZE);
	}
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(fake_posted(&FP.ep[s]), nr[s],
			     "%c: init must post all %u receive buffers, posted %u", side_name(s),
			     nr[s], fake_posted(&FP.ep[s]));
		cr_assert_eq(P[s].credits, nr[1 - s], "%c: credits start at the peer's nrecv",
			     side_name(s));
		cr_assert_eq(P[s].peer_credits, nr[s],
			     "%c: the peer's credits start at our nrecv", side_name(s));
		cr_assert_eq(P[s].tx_state, SV_TX_TCP);
		cr_assert_not(P[s].rx_on_qp);
		cr_assert(sv_proto_rx_on_tcp(&P[s]), "%c: rx starts on TCP", side_name(s));
		cr_assert_eq(P[s].payload_max, bs[s] - SV_HDR_SIZE);
		cr_assert_eq(P[s].pending_slot, -1);
		cr_assert_eq(P[s].error, 0);
		cr_assert_eq(fake_count(&FP.ep[s], 0), 0, "init sends nothing");
	}
}

static void conn_up(const struct sv_proto_params *prm)
{
	conn_up2(prm, prm);
}

/* No transport violation, no error, and a side never believes in more
 * credits than the peer has receive buffers posted. */
static void check_clean(void)
{
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(FP.ep[s].violations, 0, "%c broke the transport rules (%u): %s",
			     side_name(s), FP.ep[s].violations, FP.ep[s].why);
		cr_assert_eq(P[s].error, 0, "%c: unexpected error %d", side_name(s), P[s].error);
		cr_assert_leq(P[s].credits, nrecv_of(1 - s),
			      "%c: credits %u above the peer's nrecv %u (wrapped?)", side_name(s),
			      P[s].credits, nrecv_of(1 - s));
		cr_assert_leq(P[s].credits, fake_posted(&FP.ep[1 - s]),
			      "%c believes in %u credits, the peer has %u buffers posted",
			      side_name(s), P[s].credits, fake_posted(&FP.ep[1 - s]));
	}
}

/* Deliver completions on both sides until none is left. */
static void pump(void)
{
	for (int i = 0; i < 100000; i++) {
		if (!fake_pending(&FP.ep[SA]) && !fake_pending(&FP.ep[SB])) {
			check_clean();
			return;
		}
		for (int s = 0; s < 2; s++) {
			int r = fake_poll(&FP.ep[s], &P[s], NOW);
			cr_assert_geq(r, 0, "%c: a completion failed: %d", side_name(s), r);
		}
	}
	cr_assert_fail("completions never stop (UPDATE ping-pong?)");
}

/* Credit conservation, once every message is delivered: each of a side's
 * receive buffers is credited to the peer, or reposted and not yet
 * reported, or holds unread data, or is the one the last receive call
 * emptied (held back until the next call: sv_pr_rx_release). And each
 * side's view of the peer's credits is exact. */
static void check_conservation(void)
{
	for (int s = 0; s < 2; s++) {
		int o = 1 - s;
		uint32_t held = P[o].rx_held >= 0;
		cr_assert_eq(P[s].credits + P[o].unreported + P[o].rxq_count + held, nrecv_of(o),
			     "%c credits %u + %c unreported %u + %c unread buffers %u + held %u "
			     "!= nrecv %u",
			     side_name(s), P[s].credits, side_name(o), P[o].unreported,
			     side_name(o), P[o].rxq_count, held, nrecv_of(o));
		cr_assert_eq(P[o].peer_credits, P[s].credits,
			     "%c's view of %c's credits is %u, they are %u", side_name(o),
			     side_name(s), P[o].peer_credits, P[s].credits);
		cr_assert_eq(fake_posted(&FP.ep[o]) + P[o].rxq_count + held, nrecv_of(o),
			     "%c: %u posted + %u unread buffers + held %u != nrecv", side_name(o),
			     fake_posted(&FP.ep[o]), P[o].rxq_count, held);
	}
}

static void check_quiescent(void)
{
	pump();
	check_conservation();
}

/* Side s writes the next len bytes of its stream. */
static long put(int s, size_t len, int flags)
{
	cr_assert_leq(TXO[s] + len, STREAM_LEN);
	struct iovec iov = {STREAM[s] + TXO[s], len};
	long r = sv_proto_send(&P[s], &iov, 1, flags, NOW);
	if (r > 0) {
		cr_assert_leq((size_t)r, len, "send took %ld of %zu bytes", r, len);
		TXO[s] += (uint64_t)r;
	}
	return r;
}

static void put_all(int s, size_t len, int flags)
{
	long r = put(s, len, flags);
	cr_assert_eq(r, (long)len, "%c: send of %zu bytes returned %ld", side_name(s), len, r);
}

static void verify_rx(int s, const uint8_t *buf, size_t n)
{
	const uint8_t *want = STREAM[1 - s] + RXO[s];
	cr_assert_leq(RXO[s] + n, TXO[1 - s], "%c received %zu bytes at %llu, the peer only sent %llu",
		      side_name(s), n, (unsigned long long)RXO[s],
		      (unsigned long long)TXO[1 - s]);
	if (memcmp(buf, want, n) != 0) {
		size_t i = 0;
		while (buf[i] == want[i])
			i++;
		cr_assert_fail("%c: byte %llu of the stream is %#x, expected %#x", side_name(s),
			       (unsigned long long)(RXO[s] + i), buf[i], want[i]);
	}
}

/* Side s reads up to len bytes and checks them against the peer's stream. */
static long get(int s, size_t len, int flags)
{
	cr_assert_leq(len, RBUF_LEN);
	memset(RBUF, 0xEE, len);
	struct iovec iov = {RBUF, len};
	long r = sv_proto_recv(&P[s], &iov, 1, flags, NOW);
	if (r > 0) {
		cr_assert_leq((size_t)r, len, "recv returned %ld for %zu bytes", r, len);
		verify_rx(s, RBUF, (size_t)r);
		if (!(flags & MSG_PEEK))
			RXO[s] += (uint64_t)r;
	}
	return r;
}

/* Read everything readable; returns the bytes read. The last result must
 * be -EAGAIN (or 0 at EOF). */
static uint64_t drain(int s)
{
	uint64_t n = 0;
	for (;;) {
		long r = get(s, RBUF_LEN, 0);
		if (r <= 0) {
			cr_assert(r == -EAGAIN || r == 0, "%c: recv returned %ld", side_name(s), r);
			return n;
		}
		n += (uint64_t)r;
	}
}

/* Both sides read until each has everything the other sent (at most
 * `rounds` rounds): writes collected without a credit go as the reads give
 * credits back. With tick_us, each round also advances the clock by it and
 * fires the timers; without, a test shows nothing needed them. */
static void settle(uint64_t tick_us, int rounds)
{
	for (int k = 0; k < rounds && (RXO[SB] < TXO[SA] || RXO[SA] < TXO[SB]); k++) {
		drain(SA);
		drain(SB);
		pump();
		if (tick_us) {
			NOW += tick_us;
			sv_proto_timers(&P[SA], NOW);
			sv_proto_timers(&P[SB], NOW);
			pump();
		}
	}
}

/* Move both directions onto the QP: A's TO_RDMA first, then B's. */
static void open_both(void)
{
	int r = sv_proto_send_to_rdma(&P[SA], TXO[SA], NOW);
	cr_assert_eq(r, 0, "A: TO_RDMA: %d", r);
	pump();
	r = sv_proto_send_to_rdma(&P[SB], TXO[SB], NOW);
	cr_assert_eq(r, 0, "B: TO_RDMA: %d", r);
	pump();
	for (int s = 0; s < 2; s++) {
		cr_assert(P[s].peer_to_rdma, "%c did not record the peer's TO_RDMA", side_name(s));
		cr_assert_eq(sv_proto_rx_accept(&P[s]), 0);
		cr_assert(P[s].rx_on_qp);
		cr_assert_not(sv_proto_rx_on_tcp(&P[s]));
		cr_assert_eq(P[s].tx_state, SV_TX_OPEN);
	}
}

static const struct fake_msg *msg_of(int s, size_t n)
{
	const struct fake_msg *m = fake_msg_at(&FP.ep[s], n);
	cr_assert_not_null(m, "%c sent only %zu messages, wanted #%zu", side_name(s),
			   fake_count(&FP.ep[s], 0), n);
	return m;
}

static const struct fake_msg *last_of(int s)
{
	const struct fake_msg *m = fake_last(&FP.ep[s]);
	cr_assert_not_null(m, "%c sent nothing", side_name(s));
	return m;
}

/* The n-th DATA message side s sent (from 0). */
static const struct fake_msg *data_msg(int s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < fake_count(&FP.ep[s], 0); i++) {
		const struct fake_msg *m = fake_msg_at(&FP.ep[s], i);
		if (m->h.type == SV_MSG_DATA && k++ == n)
			return m;
	}
	cr_assert_fail("%c sent only %zu DATA messages, wanted #%zu", side_name(s),
		       fake_count(&FP.ep[s], SV_MSG_DATA), n);
	return NULL;
}

static size_t ndata(int s)
{
	return fake_count(&FP.ep[s], SV_MSG_DATA);
}

/* ---- Wire header ------------------------------------------------------------ */

Test(proto, hdr_little_endian_layout)
{
	struct sv_hdr h = {
		.type = SV_MSG_DATA,
		.flags = 0,
		.credits = 0x1234,
		.len = 0x89ABCDEFu,
		.seq = 0x0102030405060708ull,
		.ack = 0x1112131415161718ull,
	};
	static const uint8_t want[SV_HDR_SIZE] = {
		0x01, 0x00, 0x34, 0x12, 0xEF, 0xCD, 0xAB, 0x89, /* type flags credits len */
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* seq */
		0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, /* ack */
	};
	uint8_t out[SV_HDR_SIZE + 4];
	memset(out, 0xCC, sizeof(out));
	sv_hdr_encode(&h, out);
	for (int i = 0; i < SV_HDR_SIZE; i++)
		cr_assert_eq(out[i], want[i], "byte %d is %#x, expected %#x", i, out[i], want[i]);
	for (int i = SV_HDR_SIZE; i < SV_HDR_SIZE + 4; i++)
		cr_assert_eq(out[i], 0xCC, "encode wrote past the header (byte %d)", i);

	/* Decoding the bytes (not the struct) gives the fields back. */
	struct sv_hdr d;
	memset(&d, 0xFF, sizeof(d));
	sv_hdr_decode(want, &d);
	cr_assert_eq(d.type, SV_MSG_DATA);
	cr_assert_eq(d.flags, 0);
	cr_assert_eq(d.credits, 0x1234);
	cr_assert_eq(d.len, 0x89ABCDEFu);
	cr_assert_eq(d.seq, 0x0102030405060708ull);
	cr_assert_eq(d.ack, 0x1112131415161718ull);
	cr_assert_eq(sizeof(struct sv_hdr), SV_HDR_SIZE);
}

Test(proto, hdr_round_trip)
{
	static const struct sv_hdr cases[] = {
		{0, 0, 0, 0, 0, 0},
		{SV_MSG_UPDATE, 0, 1, 0, 1, 2},
		{SV_MSG_RESET, 0xFF, 0xFFFF, 0xFFFFFFFFu, UINT64_MAX, UINT64_MAX},
		{SV_MSG_FIN, 0x80, 0x8000, 0x80000000u, 0x8000000000000000ull, 1ull << 32},
		{SV_MSG_TO_TCP, 1, 0x00FF, 0x000000FFu, 0xFFull, 0xFF00ull},
		{0xEE, 0x7F, 0x7FFF, 0x7FFFFFFFu, 0x7FFFFFFFFFFFFFFFull, 0x0123456789ABCDEFull},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t b[SV_HDR_SIZE];
		struct sv_hdr d;
		memset(&d, 0x55, sizeof(d));
		sv_hdr_encode(&cases[i], b);
		sv_hdr_decode(b, &d);
		cr_assert_eq(d.type, cases[i].type, "case %zu", i);
		cr_assert_eq(d.flags, cases[i].flags, "case %zu", i);
		cr_assert_eq(d.credits, cases[i].credits, "case %zu", i);
		cr_assert_eq(d.len, cases[i].len, "case %zu", i);
		cr_assert_eq(d.seq, cases[i].seq, "case %zu", i);
		cr_assert_eq(d.ack, cases[i].ack, "case %zu", i);
		/* seq's low byte is at offset 8, ack's at 16 */
		cr_assert_eq(b[8], (uint8_t)cases[i].seq, "case %zu", i);
		cr_assert_eq(b[23], (uint8_t)(cases[i].ack >> 56), "case %zu", i);
	}
}

/* ---- The TO_RDMA handshake and its credit accounting ----------------------- */

Test(proto, handshake_credit_accounting)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	uint32_t n = NRECV();

	/* A: TCP carried 1000 bytes, the QP carries the rest. */
	TXO[SA] = RXO[SB] = 1000;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 1000, NOW), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN);
	cr_assert_eq(P[SA].snd_nxt, 1000);
	cr_assert_eq(P[SA].credits, n - 1, "TO_RDMA costs one credit");
	const struct fake_msg *m = last_of(SA);
	cr_assert_eq(m->h.type, SV_MSG_TO_RDMA);
	cr_assert_eq(m->h.seq, 1000);
	cr_assert_eq(m->h.len, 0);
	cr_assert_eq(m->h.flags, 0);
	cr_assert_eq(m->h.credits, 0, "nothing to report yet");
	cr_assert_eq(m->h.ack, 0);
	cr_assert_eq(m->iovcnt, 0);
	pump();

	cr_assert(P[SB].peer_to_rdma);
	cr_assert_eq(P[SB].peer_to_rdma_seq, 1000);
	cr_assert_eq(P[SB].rcv_nxt, 1000);
	cr_assert_not(P[SB].rx_on_qp, "rx stays on TCP until rx_accept");
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(P[SB].unreported, 1, "the control buffer is reposted and unreported");
	cr_assert_eq(P[SB].unreported_data, 0);
	cr_assert_eq(fake_posted(&FP.ep[SB]), n, "control buffers are reposted at once");
	cr_assert_eq(P[SB].peer_credits, n - 1);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), 0, "a TO_RDMA is not answered by itself");

	/* B's TO_RDMA carries B's report. */
	cr_assert_eq(sv_proto_send_to_rdma(&P[SB], 0, NOW), 0);
	m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_TO_RDMA);
	cr_assert_eq(m->h.seq, 0);
	cr_assert_eq(m->h.credits, 1);
	cr_assert_eq(m->h.ack, 1000, "ack = rcv_nxt");
	cr_assert_eq(P[SB].unreported, 0);
	pump();
	cr_assert_eq(P[SA].credits, n, "A got its credit back");
	cr_assert_eq(P[SA].unreported, 1);
	cr_assert_eq(P[SA].peer_to_rdma_seq, 0);

	cr_assert_eq(sv_proto_rx_accept(&P[SA]), 0);
	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert(P[SA].rx_on_qp);
	cr_assert(P[SB].rx_on_qp);
	cr_assert_not(sv_proto_rx_on_tcp(&P[SA]));
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]));
	check_quiescent();

	/* The ACK timer is for consumed data: a reposted control buffer alone
	 * never makes an UPDATE. */
	NOW += 100 * prm.ack_timeout_us;
	sv_proto_timers(&P[SA], NOW);
	sv_proto_timers(&P[SB], NOW);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SA], SV_MSG_UPDATE), 0);
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), 0);

	/* A's first DATA piggybacks the report for B's TO_RDMA. */
	put_all(SA, 10, 0);
	m = last_of(SA);
	cr_assert_eq(m->h.type, SV_MSG_DATA);
	cr_assert_eq(m->h.seq, 1000);
	cr_assert_eq(m->h.len, 10);
	cr_assert_eq(m->h.credits, 1);
	cr_assert_eq(P[SA].st.acks_piggybacked, 1);
	pump();
	cr_assert_eq(P[SB].credits, n);
	cr_assert_eq(sv_proto_readable(&P[SB]), 10);
	cr_assert_eq(drain(SB), 10);
	check_quiescent();
}

Test(proto, to_rdma_pending_until_its_completion)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	cr_assert_not(sv_proto_to_rdma_pending(&P[SA]));
	FP.ep[SA].hold_send_done = true;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 0, NOW), 0);
	cr_assert(sv_proto_to_rdma_pending(&P[SA]));
	put_all(SA, 10, 0); /* data may follow at once */
	pump();
	cr_assert(sv_proto_to_rdma_pending(&P[SA]), "not completed yet");
	cr_assert(P[SB].peer_to_rdma);
	fake_release_sends(&FP.ep[SA], 1);
	pump();
	cr_assert_not(sv_proto_to_rdma_pending(&P[SA]));
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	pump();
	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert_eq(drain(SB), 10);
	check_quiescent();
}

/* Each side sends messages that fit the peer's buffers, not its own. */
Test(proto, peer_buffer_size_bounds_messages)
{
	struct sv_proto_params pa = prm_default(), pb = prm_default();
	pa.buf_size = 256;
	pb.buf_size = 128;
	pa.window = pb.window = 16;
	conn_up2(&pa, &pb);
	open_both();
	put_all(SA, 1000, 0);
	put_all(SB, 1000, 0);
	pump();
	/* A's messages must fit B's buffers; B's must fit its own send buffers. */
	for (int s = 0; s < 2; s++) {
		for (size_t i = 0; i < ndata(s); i++)
			cr_assert_leq(data_msg(s, i)->h.len, 128 - SV_HDR_SIZE);
		cr_assert_eq(data_msg(s, 0)->h.len, 128 - SV_HDR_SIZE, "full messages");
	}
	cr_assert_eq(drain(SA), 1000);
	cr_assert_eq(drain(SB), 1000);
	check_quiescent();
}

/* ---- Credits: the window, stalls, the reserve ------------------------------- */

struct cw_param {
	uint32_t window, reserve, ack_delay;
};

ParameterizedTestParameters(proto, credit_window)
{
	static struct cw_param params[] = {
		{2, 3, 1}, {2, 3, 2}, {3, 3, 2}, {4, 3, 2},  {5, 3, 2}, {4, 4, 3},
		{8, 3, 4}, {8, 3, 8}, {7, 4, 3}, {16, 5, 4}, {32, 3, 8}, {64, 6, 16},
	};
	return cr_make_param_array(struct cw_param, params, sizeof(params) / sizeof(params[0]));
}

ParameterizedTest(struct cw_param *cw, proto, credit_window)
{
	struct sv_proto_params prm = prm_default();
	prm.window = cw->window;
	prm.reserve = cw->reserve;
	prm.ack_delay = cw->ack_delay;
	prm.buf_size = 128;
	conn_up(&prm);
	open_both();
	cr_assert_eq(P[SA].credits, NRECV());

	/* The receiver does not read: exactly `window` DATA messages go. */
	for (uint32_t i = 0; i < cw->window; i++) {
		size_t len = 1 + i % PAYLOAD_MAX();
		long r = put(SA, len, 0);
		cr_assert_eq(r, (long)len, "write %u of a window of %u: %ld", i + 1, cw->window, r);
		pump();
	}
	cr_assert_eq(ndata(SA), cw->window);
	cr_assert_eq(P[SA].credits, cw->reserve, "the data window is used up");
	cr_assert_eq(P[SA].st.credit_stalls, 0);
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), 0,
		     "B has consumed nothing, so it has nothing to report");

	/* The window is closed: a large write (>= coalesce_size) waits; a
	 * small one is collected in a send buffer, as TCP's send buffer takes
	 * writes while the peer's window is closed, and goes when credits
	 * come. Each write that found no credit counts a stall. */
	cr_assert_eq(put(SA, 100, 0), -EAGAIN);
	cr_assert_eq(P[SA].st.credit_stalls, 1);
	cr_assert_eq(put(SA, 1, 0), 1);
	cr_assert_eq(P[SA].st.credit_stalls, 2);
	cr_assert_eq(P[SA].pending_len, 1, "the small write waits in a send buffer");
	cr_assert_eq(P[SA].st.collected_writes, 1);
	cr_assert_eq(put(SA, 1, 0), 1, "a second small write joins it");
	cr_assert_eq(P[SA].st.credit_stalls, 3, "one stall per write, not per flush tried");
	cr_assert_eq(P[SA].pending_len, 2);
	cr_assert_eq(P[SA].st.collected_writes, 2);
	cr_assert_eq(P[SA].st.coalesced_writes, 0, "NODELAY: nothing coalesced");
	/* A large write takes the room the collected buffer has left, as
	 * TCP's send buffer takes what fits: poll() said POLLOUT for that
	 * room, so the write must not fail with EAGAIN. A full buffer takes
	 * nothing. */
	cr_assert_eq(put(SA, 100, 0), 100, "a large write joins the collected bytes");
	cr_assert_eq(P[SA].pending_len, 102);
	cr_assert_eq(put(SA, 100, 0), (long)PAYLOAD_MAX() - 102, "what room is left");
	cr_assert_eq(P[SA].pending_len, PAYLOAD_MAX());
	cr_assert_eq(put(SA, 100, 0), -EAGAIN, "a full buffer takes nothing");
	cr_assert_eq(put(SA, 1, 0), -EAGAIN);
	cr_assert_eq(ndata(SA), cw->window, "a stalled send posts nothing");
	cr_assert_eq(P[SA].credits, cw->reserve);
	check_quiescent();

	/* B reads: credits come back and release the collected bytes; the
	 * rest is reported by the timer. */
	uint64_t sent = TXO[SA] - PAYLOAD_MAX();
	cr_assert_eq(drain(SB), sent);
	pump();
	cr_assert_eq(P[SA].pending_slot, -1, "the returned credits sent the collected bytes");
	cr_assert_eq(ndata(SA), cw->window + 1, "all in one message");
	cr_assert_eq(drain(SB), PAYLOAD_MAX());
	pump();
	NOW += SV_ACK_BULK_FACTOR * prm.ack_timeout_us; /* a full message is bulk (section 6) */
	sv_proto_timers(&P[SA], NOW);
	sv_proto_timers(&P[SB], NOW);
	check_quiescent();
	cr_assert_eq(P[SB].unreported_data, 0, "every consumed buffer is reported");
	cr_assert_gt(P[SA].credits, cw->reserve, "A can send again");

	/* ... and A really can: one more full window. */
	uint32_t more = P[SA].credits - cw->reserve;
	for (uint32_t i = 0; i < more; i++)
		put_all(SA, PAYLOAD_MAX(), 0);
	cr_assert_eq(put(SA, PAYLOAD_MAX(), 0), -EAGAIN);
	pump();
	cr_assert_eq(drain(SB), (uint64_t)more * PAYLOAD_MAX());
	check_quiescent();
}

/* A caller that has not read the clock (SV_NOW_UNREAD) costs a reading only
 * where a timer is armed or checked: a write that goes out at once reads
 * none (a clock_gettime is a system call under emulation). */
Test(proto, clock_read_only_for_timers)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	unsigned reads = fake_clock_reads;
	/* Idle connection: the write goes at once; no timer, no clock. */
	struct iovec iov = {STREAM[SA], 10};
	cr_assert_eq(sv_proto_send(&P[SA], &iov, 1, 0, SV_NOW_UNREAD), 10);
	TXO[SA] += 10;
	cr_assert_eq(sv_proto_timers(&P[SA], SV_NOW_UNREAD), 0, "nothing armed");
	cr_assert_eq(fake_clock_reads, reads, "no clock read for an immediate send");
	/* Not idle now: the next small write opens a buffer and arms the
	 * coalescing timer from the transport's clock, read once. */
	fake_clock_us = 50000;
	iov = (struct iovec){STREAM[SA] + TXO[SA], 10};
	cr_assert_eq(sv_proto_send(&P[SA], &iov, 1, 0, SV_NOW_UNREAD), 10);
	TXO[SA] += 10;
	cr_assert_eq(fake_clock_reads, reads + 1);
	cr_assert_eq(sv_proto_flush_deadline(&P[SA]), 50000 + prm.coalesce_timeout_us);
	iov = (struct iovec){STREAM[SA] + TXO[SA], 10};
	cr_assert_eq(sv_proto_send(&P[SA], &iov, 1, 0, SV_NOW_UNREAD), 10, "appended");
	TXO[SA] += 10;
	cr_assert_eq(fake_clock_reads, reads + 1, "appending arms nothing");
	/* The armed timer is checked against the clock, and fires on time. */
	cr_assert_eq(sv_proto_timers(&P[SA], SV_NOW_UNREAD), 50000 + prm.coalesce_timeout_us);
	cr_assert_eq(P[SA].pending_len, 20, "not due yet");
	fake_clock_us = 50000 + prm.coalesce_timeout_us;
	sv_proto_timers(&P[SA], SV_NOW_UNREAD);
	cr_assert_eq(P[SA].pending_slot, -1, "the timer sent the buffer");
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_TIMER], 1);
	pump();
	cr_assert_eq(drain(SB), 30);
	check_quiescent();
}

/* Credits that release collected NODELAY bytes read no clock: only a buffer
 * that would stay needs its timer looked at. A's messages stay in flight
 * (their send completions held), so the credits, not an idle sender,
 * release the byte. */
Test(proto, credits_release_collected_bytes_without_a_clock_read)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 2;
	prm.reserve = 3;
	prm.ack_delay = 1;
	prm.buf_size = 128;
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	pump();
	put_all(SA, 10, 0);
	pump();
	cr_assert_eq(P[SA].inflight, 2);
	cr_assert_eq(put(SA, 1, 0), 1, "collected: the window is closed");
	cr_assert_eq(P[SA].pending_len, 1);
	cr_assert_eq(drain(SB), 20);
	for (int i = 0; i < 100 && fake_pending(&FP.ep[SB]); i++)
		cr_assert_geq(fake_poll(&FP.ep[SB], &P[SB], NOW), 0); /* B's UPDATE goes */
	unsigned reads = fake_clock_reads;
	for (int i = 0; i < 100 && fake_pending(&FP.ep[SA]); i++)
		cr_assert_geq(fake_poll(&FP.ep[SA], &P[SA], SV_NOW_UNREAD), 0);
	cr_assert_eq(P[SA].pending_slot, -1, "the credits sent the collected byte");
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 0, "not as an idle sender's");
	cr_assert_eq(fake_clock_reads, reads, "no clock read to release it");
	FP.ep[SA].hold_send_done = false;
	fake_release_sends(&FP.ep[SA], 10);
	pump();
	cr_assert_eq(drain(SB), 1);
}

/* Writes collected while the window is closed come before the FIN: it waits
 * for the credit that sends them, as TCP's FIN follows its send buffer. */
Test(proto, fin_waits_for_collected_writes)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 4;
	conn_up(&prm);
	open_both();
	for (uint32_t i = 0; i < prm.window; i++)
		put_all(SA, 50, 0);
	put_all(SA, 7, 0);
	put_all(SA, 9, 0);
	cr_assert_eq(P[SA].pending_len, 16);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), -EAGAIN);
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN);
	pump();
	cr_assert_eq(drain(SB), 4 * 50);
	pump(); /* B's UPDATE: the collected bytes go */
	cr_assert_eq(P[SA].pending_slot, -1);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	pump();
	cr_assert_eq(drain(SB), 16);
	cr_assert_eq(get(SB, 10, 0), 0, "EOF after the data");
	check_quiescent();
}

/* Coalesced small writes do not need a credit to start a buffer: with the
 * window closed the writer fills one more buffer, which goes (as full) when
 * credits come; only then does it block. */
Test(proto, coalesce_fills_a_buffer_while_the_window_is_closed)
{
	struct sv_proto_params prm = prm_coalesce();
	prm.window = 2;
	conn_up(&prm);
	open_both();
	long taken = 0, r;
	while ((r = put(SA, 8, 0)) > 0)
		taken += r;
	cr_assert_eq(r, -EAGAIN);
	cr_assert_eq(ndata(SA), 2, "the window's two messages");
	cr_assert_eq(P[SA].pending_len, PAYLOAD_MAX() / 8 * 8, "and one full buffer collected");
	cr_assert_eq(taken, (long)TXO[SA]);
	pump();
	settle(prm.ack_timeout_us, 10);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(ndata(SA), 3, "the collected buffer went as one message");
	cr_assert_eq(data_msg(SA, 2)->h.len, PAYLOAD_MAX() / 8 * 8);
	check_quiescent();
}

/* shutdown(SHUT_WR) never waits: with collected writes still waiting for a
 * credit, the FIN follows them by itself once the peer reads. (A shutdown
 * that waited deadlocked an echo: the epoll echo client of bed.examples
 * blocked in shutdown while the server waited for it to read the echo.) */
Test(proto, shutdown_does_not_wait_for_collected_writes)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 4;
	conn_up(&prm);
	open_both();
	for (uint32_t i = 0; i < prm.window; i++)
		put_all(SA, 50, 0);
	put_all(SA, 7, 0);
	cr_assert_eq(sv_proto_shutdown_tx(&P[SA], NOW), 0, "shutdown returns at once");
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN, "the FIN waits for the collected bytes");
	cr_assert(P[SA].fin_wanted);
	pump();
	cr_assert_eq(drain(SB), 4 * 50);
	pump(); /* B's UPDATE: the collected bytes go, then the FIN */
	cr_assert_eq(P[SA].tx_state, SV_TX_FIN);
	cr_assert_not(P[SA].fin_wanted);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_FIN);
	cr_assert_eq(last_of(SA)->h.seq, TXO[SA]);
	cr_assert_eq(drain(SB), 7);
	cr_assert_eq(get(SB, 10, 0), 0, "EOF after the data");
	cr_assert_eq(sv_proto_shutdown_tx(&P[SA], NOW), -EPIPE, "shut already");
	check_quiescent();
}

/* With nothing waiting, shutdown sends the FIN at once. */
Test(proto, shutdown_sends_fin_at_once)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 30, 0);
	cr_assert_eq(sv_proto_shutdown_tx(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_FIN);
	cr_assert_not(P[SA].fin_wanted);
	pump();
	cr_assert_eq(drain(SB), 30);
	cr_assert_eq(get(SB, 10, 0), 0, "EOF after the data");
	check_quiescent();
}

/* NODELAY writes collected while the window is closed go, in order, as soon
 * as credits come, without waiting for a timer. */
Test(proto, nodelay_collected_writes_go_with_credits)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 2;
	conn_up(&prm);
	open_both();
	for (int i = 0; i < 40; i++)
		put_all(SA, 1 + i % 5, 0);
	cr_assert_eq(ndata(SA), 2, "two went with the window's credits");
	cr_assert_gt(P[SA].pending_len, 0);
	cr_assert_eq(P[SA].st.collected_writes, 38);
	cr_assert_eq(P[SA].st.coalesced_writes, 0, "NODELAY: nothing coalesced");
	pump();
	settle(0, 10);
	cr_assert_eq(RXO[SB], TXO[SA], "everything arrived without the timer");
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_TIMER], 0);
	check_quiescent();
}

/* A control message uses the reserve: FIN goes out while the data window is
 * exhausted. */
Test(proto, fin_uses_reserve_when_window_is_full)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 4;
	conn_up(&prm);
	open_both();
	for (uint32_t i = 0; i < prm.window; i++)
		put_all(SA, 50, 0);
	cr_assert_eq(put(SA, 100, 0), -EAGAIN);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_FIN);
	cr_assert_eq(last_of(SA)->h.seq, TXO[SA]);
	cr_assert_eq(put(SA, 1, 0), -EPIPE);
	pump();
	cr_assert_eq(drain(SB), TXO[SA]);
	cr_assert_eq(get(SB, 10, 0), 0, "EOF after the data");
	check_quiescent();
}

/* The reserve keeps the last credit for an UPDATE: control messages need
 * two credits. And when the peer's view of our credits has fallen to the
 * reserve with two buffers unreported, it reports at once. */
Test(proto, control_needs_two_credits_and_low_credits_trigger_update)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 4;
	prm.reserve = 3;
	prm.ack_delay = 4;
	conn_up(&prm);
	open_both();
	for (uint32_t i = 0; i < prm.window; i++)
		put_all(SA, 10, 0);
	cr_assert_eq(P[SA].credits, 3);
	pump();
	cr_assert_eq(P[SB].peer_credits, 3);
	size_t b0 = fake_count(&FP.ep[SB], 0);

	uint64_t x = TXO[SA];
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_TCP);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_TO_TCP);
	cr_assert_eq(last_of(SA)->h.seq, x);
	/* TCP carries 5 bytes, then A moves back to the QP. */
	TXO[SA] += 5;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], x + 5, NOW), 0);
	cr_assert_eq(P[SA].credits, 1);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), -EAGAIN, "FIN needs two credits");
	cr_assert_eq(P[SA].credits, 1, "a refused control message costs nothing");
	size_t a0 = fake_count(&FP.ep[SA], 0);

	pump();
	/* B: peer_credits 1 <= reserve, 2 control buffers unreported. */
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), 1,
		     "B must report the two control buffers when A is low on credits");
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	cr_assert_eq(last_of(SB)->h.credits, 2);
	cr_assert_eq(P[SA].credits, 3);
	cr_assert_eq(fake_count(&FP.ep[SA], 0), a0, "A does not answer the UPDATE");
	check_quiescent();

	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	pump();

	/* B: the QP bytes up to the TO_TCP, then TCP's 5, then the QP again. */
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(drain(SB), x);
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert(P[SB].peer_to_rdma);
	cr_assert_eq(P[SB].peer_to_rdma_seq, x + 5);
	RXO[SB] += 5; /* the stream layer read them from TCP */
	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert_eq(get(SB, 10, 0), 0, "FIN right after the switch: EOF");
	check_quiescent();
}

/* ---- Delayed ACKs and piggybacking ------------------------------------------ */

static void ack_conn(void)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 16;
	prm.ack_delay = 4;
	prm.ack_timeout_us = 1000;
	conn_up(&prm);
	open_both();
}

Test(proto, delayed_ack_by_count)
{
	ack_conn();
	for (int i = 0; i < 6; i++)
		put_all(SA, 1, 0);
	pump();
	size_t b0 = fake_count(&FP.ep[SB], 0);
	uint32_t ac = P[SA].credits;

	for (uint32_t i = 0; i < PRM.ack_delay - 1; i++) {
		cr_assert_eq(get(SB, 1, 0), 1);
		pump();
		cr_assert_eq(fake_count(&FP.ep[SB], 0), b0, "no UPDATE after %u of %u", i + 1,
			     PRM.ack_delay);
		cr_assert_eq(P[SB].st.updates_sent, 0);
		cr_assert_eq(P[SB].unreported_data, i + 1);
	}
	cr_assert_eq(P[SA].credits, ac);

	cr_assert_eq(get(SB, 1, 0), 1);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1, "the ack_delay-th consumption sends");
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_UPDATE);
	cr_assert_eq(m->h.len, 0);
	cr_assert_eq(m->h.flags, 0);
	cr_assert_eq(m->h.credits, PRM.ack_delay);
	cr_assert_eq(m->h.ack, 6, "ack = bytes received");
	cr_assert_eq(m->total, SV_HDR_SIZE);
	cr_assert_eq(P[SB].st.updates_sent, 1);
	cr_assert_eq(P[SB].unreported, 0);
	cr_assert_eq(P[SB].unreported_data, 0);
	size_t a0 = fake_count(&FP.ep[SA], 0);
	pump();
	cr_assert_eq(P[SA].credits, ac + PRM.ack_delay);
	cr_assert_eq(P[SA].snd_una, 6);
	cr_assert_eq(fake_count(&FP.ep[SA], 0), a0, "an UPDATE is not answered");

	/* Two more: below the count, so only the timer reports them. */
	cr_assert_eq(get(SB, 2, 0), 2);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	check_quiescent();
}

Test(proto, delayed_ack_by_timer)
{
	ack_conn();
	for (int i = 0; i < 3; i++)
		put_all(SA, 1, 0);
	pump();
	size_t b0 = fake_count(&FP.ep[SB], 0);
	uint32_t ac = P[SA].credits;
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), 0, "nothing consumed: no timer");

	NOW = 2000;
	cr_assert_eq(get(SB, 1, 0), 1);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), 2000 + PRM.ack_timeout_us);
	NOW = 2500;
	cr_assert_eq(get(SB, 1, 0), 1);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), 2000 + PRM.ack_timeout_us,
		     "the timer runs from the first unreported consumption");

	uint64_t dl = 2000 + PRM.ack_timeout_us;
	NOW = dl - 1;
	cr_assert_eq(sv_proto_timers(&P[SB], NOW), dl);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0, "nothing before the deadline");

	NOW = dl;
	cr_assert_eq(sv_proto_timers(&P[SB], NOW), 0, "nothing else is armed");
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_UPDATE);
	cr_assert_eq(m->h.credits, 2);
	cr_assert_eq(m->h.ack, 3);
	cr_assert_eq(P[SB].st.updates_sent, 1);
	pump();
	cr_assert_eq(P[SA].credits, ac + 2);

	/* Disarmed: later timers send nothing. */
	NOW += 10 * PRM.ack_timeout_us;
	cr_assert_eq(sv_proto_timers(&P[SB], NOW), 0);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), 0);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	check_quiescent();
}

/* A sends one byte; B reads it as a read that found it at once would,
 * without a clock reading. */
static void byte_to_b_unclocked(void)
{
	put_all(SA, 1, 0);
	pump();
	struct iovec iov = {RBUF, 1};
	cr_assert_eq(sv_proto_recv(&P[SB], &iov, 1, 0, SV_NOW_UNREAD), 1);
	verify_rx(SB, RBUF, 1);
	RXO[SB] += 1;
}

/* A read that found its data at once has no clock reading: the delayed ACK
 * is armed without one, and the next reading starts it. A reply that
 * carries the ACK disarms it first, so a ping-pong reads no clock. */
Test(proto, delayed_ack_armed_without_a_clock)
{
	ack_conn();
	uint64_t t = PRM.ack_timeout_us;
	unsigned reads = fake_clock_reads;
	byte_to_b_unclocked();
	cr_assert(sv_proto_ack_armed(&P[SB]));
	cr_assert_eq(P[SB].ack_deadline, 0, "no deadline without a clock");
	cr_assert_eq(fake_clock_reads, reads, "the read read no clock");

	/* The reply carries the ACK and disarms the timer. */
	struct iovec iov = {STREAM[SB] + TXO[SB], 1};
	cr_assert_eq(sv_proto_send(&P[SB], &iov, 1, 0, SV_NOW_UNREAD), 1);
	TXO[SB] += 1;
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_DATA);
	cr_assert_eq(m->h.ack, 1);
	cr_assert_eq(m->h.credits, 0, "the buffer the read emptied is still held back");
	cr_assert(!sv_proto_ack_armed(&P[SB]));
	uint32_t posted = fake_posted(&FP.ep[SB]);
	cr_assert_eq(sv_proto_timers(&P[SB], SV_NOW_UNREAD), 0);
	cr_assert_eq(fake_posted(&FP.ep[SB]), posted + 1, "the next pass reposts it");
	cr_assert_eq(P[SB].unreported, 1, "its credit rides on the next message");
	cr_assert(!sv_proto_ack_armed(&P[SB]), "a credit alone arms no timer");
	cr_assert_eq(fake_clock_reads, reads, "a ping-pong round reads no clock");
	pump();
	cr_assert_eq(drain(SA), 1);

	/* Armed again, nothing to carry it: the next reading starts the
	 * timer, later readings do not move it, and it fires on time. */
	byte_to_b_unclocked();
	size_t b0 = fake_count(&FP.ep[SB], 0);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], 7000), 7000 + t);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], 7500), 7000 + t);
	cr_assert_eq(sv_proto_timers(&P[SB], 7000 + t - 1), 7000 + t);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0, "nothing before the deadline");
	cr_assert_eq(sv_proto_timers(&P[SB], 7000 + t), 0);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_UPDATE);
	cr_assert_eq(m->h.ack, 2);
	pump();

	/* A timer check without a reading reads the clock for it. */
	byte_to_b_unclocked();
	fake_clock_us = 9000;
	reads = fake_clock_reads;
	cr_assert_eq(sv_proto_timers(&P[SB], SV_NOW_UNREAD), 9000 + t);
	cr_assert_eq(fake_clock_reads, reads + 1);
	cr_assert_eq(sv_proto_timers(&P[SB], 9000 + t), 0);
	cr_assert_eq(last_of(SB)->h.type, SV_MSG_UPDATE);
	pump();
	check_quiescent();
}

/* Bulk DATA alone (messages of coalesce_size or more) runs the ACK timer
 * SV_ACK_BULK_FACTOR times longer: at emulated speeds 1 ms fired after
 * nearly every message. A small message brings it back to ack_timeout_us
 * (its sender's Nagle may wait for the acknowledgment). */
Test(proto, ack_timer_longer_for_bulk_data)
{
	ack_conn();
	uint64_t t = PRM.ack_timeout_us;
	size_t big = PRM.coalesce_size; /* the smallest "bulk" message */
	put_all(SA, big, 0);
	put_all(SA, big, 0);
	pump();
	size_t b0 = fake_count(&FP.ep[SB], 0);
	NOW = 2000;
	cr_assert_eq(get(SB, 2 * big, 0), (long)(2 * big));
	cr_assert_eq(P[SB].unreported_data, 2);
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), 2000 + SV_ACK_BULK_FACTOR * t);
	NOW = 2000 + t;
	sv_proto_timers(&P[SB], NOW);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0, "no UPDATE for bulk data after one delay");

	/* A small message: the timer is the short one again. */
	put_all(SA, big - 1, 0);
	pump();
	NOW = 2000 + 2 * t;
	cr_assert_eq(get(SB, big - 1, 0), (long)(big - 1));
	uint64_t dl = NOW + t;
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), dl);
	NOW = dl;
	cr_assert_eq(sv_proto_timers(&P[SB], NOW), 0);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 1);
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_UPDATE);
	cr_assert_eq(m->h.credits, 3);

	/* Bulk alone again: reported at the long deadline. */
	put_all(SA, big, 0);
	pump();
	cr_assert_eq(get(SB, big, 0), (long)big);
	dl = NOW + SV_ACK_BULK_FACTOR * t;
	cr_assert_eq(sv_proto_next_deadline(&P[SB], NOW), dl);
	NOW = dl;
	cr_assert_eq(sv_proto_timers(&P[SB], NOW), 0);
	cr_assert_eq(fake_count(&FP.ep[SB], 0), b0 + 2);
	cr_assert_eq(last_of(SB)->h.type, SV_MSG_UPDATE);
	check_quiescent();
}

/* Bulk data does not wait for the timer to flow: a sender that used its
 * whole data window gets credits back once the receiver has read it. */
Test(proto, bulk_window_reopens_without_timer)
{
	ack_conn();
	size_t big = PRM.buf_size - SV_HDR_SIZE;
	long n = 0;
	while (put(SA, big, 0) > 0)
		n++;
	cr_assert_eq(n, (long)PRM.window, "the data window is the window");
	pump();
	NOW = 5000;
	for (long i = 0; i < n; i++)
		cr_assert_eq(get(SB, big, 0), (long)big);
	pump(); /* no timer ran: the reports came by count and low credit */
	cr_assert_gt(P[SA].credits, PRM.reserve, "the sender may send DATA again");
	put_all(SA, big, 0);
	pump();
	cr_assert_eq(get(SB, big, 0), (long)big);
	check_quiescent();
}

Test(proto, ack_piggybacked_on_data)
{
	ack_conn();
	for (int i = 0; i < 3; i++)
		put_all(SA, 5, 0);
	pump();
	cr_assert_eq(get(SB, 10, 0), 10); /* two buffers consumed, 2 < ack_delay */
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), 0);
	uint32_t ac = P[SA].credits;
	uint64_t pb = P[SB].st.acks_piggybacked;

	put_all(SB, 20, 0);
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_DATA);
	/* The read reposted its first buffer; the one it emptied last is held
	 * until the next call (sv_pr_rx_release), so its credit comes later. */
	cr_assert_eq(m->h.credits, 1, "the DATA carries the reposted buffer");
	cr_assert(P[SB].rx_held >= 0, "the read's last buffer is held back");
	cr_assert_eq(m->h.ack, 15);
	cr_assert_eq(P[SB].st.acks_piggybacked, pb + 1);
	cr_assert_eq(P[SB].st.updates_sent, 0);
	cr_assert_eq(P[SB].unreported, 0);
	cr_assert_eq(P[SB].unreported_data, 0);
	pump();
	cr_assert_eq(P[SA].credits, ac + 1, "A's credits went back up by one");
	cr_assert_eq(drain(SA), 20);

	/* The consumed data was reported: the ACK timer sends nothing now. Its
	 * pass reposts the held buffer, a credit alone, which waits for the
	 * next message. */
	NOW += 10 * PRM.ack_timeout_us;
	sv_proto_timers(&P[SB], NOW);
	pump();
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), 0);
	cr_assert_eq(P[SB].rx_held, -1);
	cr_assert_eq(P[SB].unreported, 1);
	put_all(SB, 2, 0);
	cr_assert_eq(last_of(SB)->h.credits, 1);
	pump();
	cr_assert_eq(P[SA].credits, ac + 2, "A's credits are all back");
	cr_assert_eq(drain(SA), 2);

	/* A DATA with nothing to report does not count as a piggybacked ACK. */
	pb = P[SB].st.acks_piggybacked;
	put_all(SB, 3, 0);
	cr_assert_eq(last_of(SB)->h.credits, 0);
	cr_assert_eq(P[SB].st.acks_piggybacked, pb);
	pump();
	drain(SA);
	drain(SB);
	check_quiescent();
}

/* ---- Coalescing ------------------------------------------------------------------ */

/* Side `rx`'s delayed ACK goes out (its timer fires) and arrives. */
static void deliver_ack(int rx)
{
	NOW += P[rx].prm.ack_timeout_us;
	sv_proto_timers(&P[rx], NOW);
	pump();
}

Test(proto, coalesce_first_write_on_idle_is_sent)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	cr_assert_eq(ndata(SA), 1, "an idle connection never delays the first write");
	cr_assert_eq(data_msg(SA, 0)->h.len, 10);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 1);
	cr_assert_eq(P[SA].pending_slot, -1);
	cr_assert_eq(P[SA].inflight, 1);
	/* Neither completed nor acknowledged: the next small write waits... */
	put_all(SA, 7, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(P[SA].pending_len, 7);
	/* ... past the completion, which is not the peer's acknowledgment ... */
	pump();
	cr_assert_eq(ndata(SA), 1, "completed but not acknowledged: still held");
	/* ... until the peer acknowledges every byte (Nagle). */
	cr_assert_eq(drain(SB), 10);
	deliver_ack(SB);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 7);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 2);
	cr_assert_eq(drain(SB), 7);
	check_quiescent();
}

Test(proto, coalesce_flushed_by_a_piggybacked_ack)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	put_all(SA, 7, 0);
	pump();
	cr_assert_eq(ndata(SA), 1);
	/* The peer's own data carries its acknowledgment of our 10 bytes. */
	put_all(SB, 5, 0);
	pump();
	cr_assert_eq(ndata(SA), 2, "everything acknowledged: the held bytes go");
	cr_assert_eq(data_msg(SA, 1)->h.len, 7);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 2);
	cr_assert_eq(drain(SB), 17);
	cr_assert_eq(drain(SA), 5);
	check_quiescent();
}

Test(proto, coalesce_holds_while_in_flight_then_idle)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	cr_assert_eq(ndata(SA), 1);
	uint64_t c0 = P[SA].st.coalesced_writes;
	put_all(SA, 20, 0); /* opens the pending buffer (counted or not) */
	uint64_t c1 = P[SA].st.coalesced_writes;
	cr_assert(c1 == c0 || c1 == c0 + 1);
	put_all(SA, 15, 0); /* appended to it: counted */
	cr_assert_eq(P[SA].st.coalesced_writes, c1 + 1);
	pump();
	cr_assert_eq(ndata(SA), 1, "held while a DATA is in flight");
	cr_assert_eq(P[SA].pending_len, 35);
	cr_assert_eq(drain(SB), 10);

	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	pump();
	cr_assert_eq(ndata(SA), 1, "completed, not yet acknowledged");
	deliver_ack(SB);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 35, "both writes in one message");
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 2);
	cr_assert_eq(P[SA].pending_slot, -1);
	cr_assert_eq(drain(SB), 35);
	FP.ep[SA].hold_send_done = false;
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_full_when_next_write_does_not_fit)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	/* Small writes (below coalesce_size, 64) fill the whole buffer,
	 * 256 - 24 = 232 bytes of payload, as TCP fills a segment. */
	for (int i = 0; i < 3; i++)
		put_all(SA, 60, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(P[SA].pending_len, 180, "held past coalesce_size");
	/* 180 + 60 > 232: the write tops the buffer up to 232, which goes,
	 * and its last 8 bytes start the next one. */
	put_all(SA, 60, 0);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_FULL], 1);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 232, "a full message, as TCP fills a segment");
	cr_assert_eq(P[SA].pending_len, 8);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	pump();
	cr_assert_eq(drain(SB), 242);
	deliver_ack(SB);
	cr_assert_eq(ndata(SA), 3);
	cr_assert_eq(data_msg(SA, 2)->h.len, 8);
	cr_assert_eq(data_msg(SA, 2)->h.seq, 242);
	cr_assert_eq(drain(SB), 8);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_full_when_size_reached)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	for (int i = 0; i < 3; i++)
		put_all(SA, 60, 0);
	cr_assert_eq(ndata(SA), 1);
	put_all(SA, 52, 0); /* 180 + 52 = 232: the buffer is full */
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_FULL], 1);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 232);
	cr_assert_eq(P[SA].pending_slot, -1);
	pump();
	cr_assert_eq(drain(SB), 242);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

/* A large write (>= coalesce_size) joins the pending bytes: if it fits in
 * the buffer's room, all of it, and the buffer goes at once; if not, it
 * fills the buffer (one full message) and its rest goes at once as a
 * message of its own: the rest of a large write is not held. */
Test(proto, coalesce_flush_large_keeps_order)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	put_all(SA, 20, 0);
	cr_assert_eq(ndata(SA), 1);
	put_all(SA, 100, 0); /* fits in the buffer's room */
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_LARGE], 1);
	cr_assert_eq(ndata(SA), 2, "the pending bytes and the large write, at once, together");
	cr_assert_eq(data_msg(SA, 1)->h.len, 120);
	cr_assert_eq(data_msg(SA, 1)->h.seq, 10);
	cr_assert_eq(P[SA].pending_slot, -1);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	pump();
	cr_assert_eq(drain(SB), 130); /* verify_rx checks the bytes and their order */
	deliver_ack(SB);

	put_all(SA, 10, 0); /* idle: goes at once */
	put_all(SA, 20, 0);
	cr_assert_eq(P[SA].pending_len, 20);
	put_all(SA, 300, 0); /* 20 + 300 > 232 */
	cr_assert_eq(ndata(SA), 5);
	cr_assert_eq(data_msg(SA, 3)->h.len, 232, "a full message");
	cr_assert_eq(data_msg(SA, 3)->h.seq, 140);
	cr_assert_eq(data_msg(SA, 4)->h.len, 88);
	cr_assert_eq(data_msg(SA, 4)->h.seq, 372);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_FULL], 1);
	cr_assert_eq(P[SA].pending_slot, -1, "the rest of a large write is not held");
	pump();
	cr_assert_eq(drain(SB), 330);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_timer)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	NOW += 100;
	uint64_t opened = NOW, dl = opened + prm.coalesce_timeout_us;
	put_all(SA, 20, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(sv_proto_next_deadline(&P[SA], NOW), dl);
	NOW = dl - 1;
	cr_assert_eq(sv_proto_timers(&P[SA], NOW), dl);
	cr_assert_eq(ndata(SA), 1, "not before the deadline");
	put_all(SA, 5, 0); /* appending does not move the deadline */
	cr_assert_eq(sv_proto_next_deadline(&P[SA], NOW), dl);
	NOW = dl;
	cr_assert_eq(sv_proto_timers(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_TIMER], 1);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 25);
	cr_assert_eq(P[SA].pending_slot, -1);
	pump();
	cr_assert_eq(drain(SB), 35);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_on_recv)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	put_all(SA, 20, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(get(SA, 100, 0), -EAGAIN);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_RECV], 1);
	cr_assert_eq(ndata(SA), 2);
	cr_assert_eq(data_msg(SA, 1)->h.len, 20);
	pump();
	cr_assert_eq(drain(SB), 30);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_on_fin)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	put_all(SA, 20, 0);
	size_t n0 = fake_count(&FP.ep[SA], 0);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_CLOSE], 1);
	cr_assert_eq(fake_count(&FP.ep[SA], 0), n0 + 2);
	cr_assert_eq(msg_of(SA, n0)->h.type, SV_MSG_DATA);
	cr_assert_eq(msg_of(SA, n0)->h.len, 20);
	cr_assert_eq(msg_of(SA, n0 + 1)->h.type, SV_MSG_FIN);
	cr_assert_eq(msg_of(SA, n0 + 1)->h.seq, 30);
	cr_assert_eq(P[SA].tx_state, SV_TX_FIN);
	pump();
	cr_assert_eq(drain(SB), 30);
	cr_assert_eq(get(SB, 10, 0), 0);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, coalesce_flush_on_switch_to_tcp)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	put_all(SA, 20, 0);
	size_t n0 = fake_count(&FP.ep[SA], 0);
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_CLOSE], 1);
	cr_assert_eq(fake_count(&FP.ep[SA], 0), n0 + 2);
	cr_assert_eq(msg_of(SA, n0)->h.len, 20);
	cr_assert_eq(msg_of(SA, n0 + 1)->h.type, SV_MSG_TO_TCP);
	cr_assert_eq(msg_of(SA, n0 + 1)->h.seq, 30);
	pump();
	cr_assert_eq(drain(SB), 30);
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, nodelay_sends_every_write)
{
	struct sv_proto_params prm = prm_default(); /* coalesce = false */
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 10, 0);
	put_all(SA, 20, 0);
	put_all(SA, 5, 0);
	cr_assert_eq(ndata(SA), 3);
	cr_assert_eq(data_msg(SA, 0)->h.len, 10);
	cr_assert_eq(data_msg(SA, 1)->h.len, 20);
	cr_assert_eq(data_msg(SA, 2)->h.len, 5);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_NODELAY], 3);
	cr_assert_eq(P[SA].st.coalesced_writes, 0);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 0);
	cr_assert_eq(P[SA].pending_slot, -1);
	pump();
	cr_assert_eq(drain(SB), 35);
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	check_quiescent();
}

Test(proto, msg_more_holds_until_a_write_without_it)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, MSG_MORE);
	pump();
	cr_assert_eq(ndata(SA), 0, "MSG_MORE holds even on an idle connection");
	put_all(SA, 5, MSG_MORE);
	cr_assert_eq(ndata(SA), 0);
	cr_assert_eq(P[SA].pending_len, 15);
	put_all(SA, 7, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(data_msg(SA, 0)->h.len, 22);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_IDLE], 1);
	pump();
	cr_assert_eq(drain(SB), 22);
	check_quiescent();
}

Test(proto, msg_more_is_flushed_by_the_timer)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, MSG_MORE);
	cr_assert_eq(ndata(SA), 0);
	NOW += prm.coalesce_timeout_us;
	sv_proto_timers(&P[SA], NOW);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_TIMER], 1);
	pump();
	cr_assert_eq(drain(SB), 10);
	check_quiescent();
}

Test(proto, cork_holds_small_writes)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	P[SA].cork = true;
	put_all(SA, 10, 0);
	put_all(SA, 10, 0);
	pump();
	cr_assert_eq(ndata(SA), 0, "cork holds on an idle connection");
	NOW += prm.coalesce_timeout_us;
	sv_proto_timers(&P[SA], NOW);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(data_msg(SA, 0)->h.len, 20);
	cr_assert_eq(P[SA].st.flushes[SV_FLUSH_TIMER], 1);
	pump();
	cr_assert_eq(drain(SB), 20);
	deliver_ack(SB);
	P[SA].cork = false;
	put_all(SA, 3, 0);
	cr_assert_eq(ndata(SA), 2, "uncorked and idle: sent at once");
	pump();
	cr_assert_eq(drain(SB), 3);
	check_quiescent();
}

/* ---- Zero copy --------------------------------------------------------------- */

Test(proto, zero_copy_at_threshold)
{
	struct sv_proto_params prm = prm_coalesce();
	prm.zcopy_threshold = 512;
	prm.window = 16;
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;

	/* Below the threshold: copied. */
	put_all(SA, 511, 0);
	cr_assert_eq(FP.ep[SA].zcopy_posts, 0);
	cr_assert_eq(P[SA].st.tx_zcopy_bytes, 0);
	cr_assert_not(sv_proto_zcopy_busy(&P[SA]), "copied data does not pin the caller");
	size_t d0 = ndata(SA);

	/* At the threshold: from the caller's memory. */
	put_all(SA, 512, 0);
	size_t d1 = ndata(SA);
	cr_assert_gt(FP.ep[SA].zcopy_posts, 0);
	uint64_t bytes = 0;
	for (size_t i = d0; i < d1; i++) {
		const struct fake_msg *m = data_msg(SA, i);
		cr_assert_gt(m->iovcnt, 0, "DATA #%zu of the zero-copy write was copied", i);
		bytes += m->h.len;
	}
	cr_assert_eq(bytes, 512);
	cr_assert_eq(P[SA].st.tx_zcopy_bytes, 512);
	cr_assert(sv_proto_zcopy_busy(&P[SA]));

	put_all(SA, 700, 0);
	cr_assert_eq(P[SA].st.tx_zcopy_bytes, 1212);
	pump();
	cr_assert(sv_proto_zcopy_busy(&P[SA]), "busy until the send completions");

	/* The copied messages' completions come first: still busy. */
	fake_release_sends(&FP.ep[SA], d0);
	pump();
	cr_assert(sv_proto_zcopy_busy(&P[SA]));
	FP.ep[SA].hold_send_done = false;
	fake_release_sends(&FP.ep[SA], SIZE_MAX);
	pump();
	cr_assert_not(sv_proto_zcopy_busy(&P[SA]));
	cr_assert_eq(P[SA].zc_inflight, 0);
	cr_assert_eq(drain(SB), 511 + 512 + 700);
	check_quiescent();
}

/* ---- Switching media, FIN, RESET ---------------------------------------------- */

Test(proto, switch_over_byte_accounting)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	/* TCP carried A's first 100 bytes. */
	TXO[SA] = RXO[SB] = 100;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 100, NOW), 0);
	cr_assert_eq(P[SA].snd_nxt, 100);
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN);
	put_all(SA, 30, 0);
	put_all(SA, 20, 0);
	cr_assert_eq(data_msg(SA, 0)->h.seq, 100);
	cr_assert_eq(data_msg(SA, 1)->h.seq, 130);
	pump();
	cr_assert(P[SB].peer_to_rdma);
	cr_assert_eq(P[SB].peer_to_rdma_seq, 100);
	cr_assert_not(P[SB].rx_on_qp);
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(get(SB, 1000, 0), -EAGAIN, "queued until rx_accept");
	cr_assert_eq(P[SB].rxq_count, 2, "the DATA is queued");

	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert(P[SB].rx_on_qp);
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(drain(SB), 50);
	cr_assert_eq(P[SB].rcv_nxt, 150);

	/* 30 more bytes in three messages, then back to TCP at 180. */
	put_all(SA, 10, 0);
	put_all(SA, 10, 0);
	put_all(SA, 10, 0);
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_TCP);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_TO_TCP);
	cr_assert_eq(last_of(SA)->h.seq, 180);
	pump();
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]), "30 QP bytes are still unread");
	cr_assert_eq(sv_proto_readable(&P[SB]), 30);
	cr_assert_eq(drain(SB), 30, "exactly the bytes up to the switch");
	cr_assert_eq(RXO[SB], 180);
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(get(SB, 1000, 0), -EAGAIN);
	cr_assert_not(P[SB].rx_on_qp);

	/* TCP carries 70 bytes; the QP again from 250. */
	pump(); /* B's UPDATE gives A its credits back */
	TXO[SA] += 70;
	RXO[SB] += 70;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 250, NOW), 0);
	cr_assert_eq(P[SA].snd_nxt, 250);
	put_all(SA, 20, 0);
	cr_assert_eq(last_of(SA)->h.seq, 250);
	pump();
	cr_assert(P[SB].peer_to_rdma);
	cr_assert_eq(P[SB].peer_to_rdma_seq, 250);
	cr_assert_eq(get(SB, 1000, 0), -EAGAIN);
	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert_eq(drain(SB), 20);
	cr_assert_eq(P[SB].rcv_nxt, 270);
	check_quiescent();
}

/* TO_TCP and a new TO_RDMA arrive before the old QP bytes are read, with new
 * QP bytes behind them: recv stops at the switch point, the TCP part comes
 * in between, and the new QP bytes only after rx_accept. */
Test(proto, switch_back_and_forth_before_reading)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 30, 0);
	put_all(SA, 20, 0);
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	TXO[SA] += 20; /* TCP carries [50, 70) */
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 70, NOW), 0);
	put_all(SA, 30, 0);
	cr_assert_eq(last_of(SA)->h.seq, 70);
	pump();
	cr_assert_eq(P[SB].rx_switch_seq, 50);
	cr_assert(P[SB].peer_to_rdma);
	cr_assert_eq(P[SB].peer_to_rdma_seq, 70);
	cr_assert_eq(sv_proto_readable(&P[SB]), 50, "only the bytes before the switch");
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(get(SB, 1000, 0), 50, "recv stops at the switch point");
	cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(get(SB, 1000, 0), -EAGAIN);
	cr_assert_eq(sv_proto_readable(&P[SB]), 0);
	RXO[SB] += 20; /* the stream layer reads [50, 70) from TCP */
	cr_assert_eq(sv_proto_rx_accept(&P[SB]), 0);
	cr_assert_eq(sv_proto_readable(&P[SB]), 30);
	cr_assert_eq(drain(SB), 30);
	cr_assert_eq(RXO[SB], 100);
	check_quiescent();
}

/* A TO_TCP with nothing unread before it moves the receive side to TCP at
 * once: the stream layer asks sv_proto_rx_on_tcp before it reads again. */
Test(proto, to_tcp_with_nothing_unread_is_on_tcp_at_once)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	pump();
	cr_assert_eq(drain(SB), 10);
	cr_assert_not(sv_proto_rx_on_tcp(&P[SB]));
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	pump();
	cr_assert(sv_proto_rx_on_tcp(&P[SB]), "every QP byte before the TO_TCP is consumed");
	cr_assert_eq(sv_proto_readable(&P[SB]), 0);
	check_quiescent();
}

/* A QP that fails under the core (it is aborted) after delivering bytes
 * the application has not read: they stay readable, then the receive side
 * is on TCP, where the peer goes on. */
Test(proto, a_lost_qp_keeps_what_it_delivered_readable)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 300, 0);
	pump();
	cr_assert_eq(get(SB, 100, 0), 100);
	sv_proto_abort(&P[SB], -ECONNRESET);
	sv_proto_rx_lost_qp(&P[SB]);
	cr_assert_eq(sv_proto_readable(&P[SB]), 200);
	cr_assert_eq(get(SB, 150, 0), 150);
	cr_assert_eq(get(SB, 150, 0), 50);
	cr_assert(sv_proto_rx_on_tcp(&P[SB]), "the QP's part is read: TCP next");
	cr_assert_eq(sv_proto_readable(&P[SB]), 0);
}

/* The QP fails under a sender: with DATA in flight at that moment, the
 * completions that come back later (flushed, slots freed) do not make it
 * whole: bytes may be lost, and the sending side cannot go on over TCP.
 * With nothing in flight it goes on there, the coalesced bytes first. */
Test(proto, a_lost_qp_with_data_in_flight_cannot_go_on)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 1000, 0); /* large: messages of their own */
	sv_proto_abort(&P[SA], -ECONNRESET);
	fake_release_sends(&FP.ep[SA], 1000);
	fake_poll(&FP.ep[SA], &P[SA], NOW);
	cr_assert(sv_proto_sends_done(&P[SA]), "every slot came back");
	const void *buf;
	size_t len;
	cr_assert_eq(sv_proto_tx_lost_qp(&P[SA], &buf, &len), -EIO);
}

Test(proto, a_lost_qp_with_nothing_in_flight_goes_on_over_tcp)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 1000, 0);
	pump();
	drain(SB);
	pump();
	put_all(SA, 10, MSG_MORE); /* coalesced, held */
	sv_proto_abort(&P[SA], -ECONNRESET);
	const void *buf;
	size_t len;
	cr_assert_eq(sv_proto_tx_lost_qp(&P[SA], &buf, &len), 0);
	cr_assert_eq(len, 10);
	cr_assert_eq(memcmp(buf, STREAM[SA] + 1000, 10), 0);
	cr_assert_eq(sv_proto_tx_state(&P[SA]), SV_TX_TCP);
}

/* A TO_RDMA taken back (a held client whose server did not prove itself):
 * its direction is TCP's again whether the QP still works, carried our FIN
 * or was reset. */
Test(proto, a_to_rdma_with_nothing_after_it_is_taken_back)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 100, NOW), 0);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	cr_assert_eq(sv_proto_send_reset(&P[SA]), 0);
	cr_assert_eq(sv_proto_tx_state(&P[SA]), SV_TX_RESET);
	cr_assert_eq(sv_proto_tx_retract(&P[SA]), 0);
	cr_assert_eq(sv_proto_tx_state(&P[SA]), SV_TX_TCP);
	cr_assert_eq(sv_proto_tx_retract(&P[SA]), 0);
}

/* ... but never once bytes went to the QP after it, sent or coalesced:
 * TCP would carry them again, or skip them. */
Test(proto, a_to_rdma_with_bytes_after_it_stays)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 0, NOW), 0);
	put_all(SA, 10, MSG_MORE); /* coalesced, held */
	cr_assert_eq(sv_proto_tx_retract(&P[SA]), -EINVAL);
	cr_assert_eq(sv_proto_flush(&P[SA], SV_FLUSH_CLOSE, NOW), 0);
	cr_assert_eq(sv_proto_tx_retract(&P[SA]), -EINVAL);
	cr_assert_eq(sv_proto_tx_state(&P[SA]), SV_TX_OPEN);
}

/* A TO_RDMA whose completion comes after the QP failed is not known to
 * have arrived: its echo must never be written. */
Test(proto, to_rdma_completing_after_an_abort_stays_pending)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	FP.ep[SA].hold_send_done = true;
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 0, NOW), 0);
	sv_proto_abort(&P[SA], -ECONNRESET);
	fake_release_sends(&FP.ep[SA], 1);
	fake_poll(&FP.ep[SA], &P[SA], NOW);
	cr_assert(sv_proto_to_rdma_pending(&P[SA]));
}

Test(proto, fin_after_data)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 100, 0);
	put_all(SA, 300, 0);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_FIN);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_FIN);
	cr_assert_eq(last_of(SA)->h.seq, 400);
	cr_assert_eq(put(SA, 1, 0), -EPIPE);
	pump();
	cr_assert_eq(sv_proto_readable(&P[SB]), 400);
	cr_assert_eq(get(SB, 150, 0), 150);
	cr_assert_eq(sv_proto_readable(&P[SB]), 250);
	cr_assert_eq(drain(SB), 250);
	cr_assert_eq(get(SB, 10, 0), 0, "EOF");
	cr_assert_eq(get(SB, 10, 0), 0, "EOF stays");
	cr_assert(P[SB].rx_fin);
	cr_assert_eq(P[SB].rx_fin_seq, 400);
	/* The other direction is unaffected. */
	put_all(SB, 50, 0);
	pump();
	cr_assert_eq(drain(SA), 50);
	check_quiescent();
}

/* A connection up on the QP both ways where side s sent len bytes and
 * then shut down: all of it delivered, the peer has the bytes and the FIN. */
static void sent_then_fin(int s, size_t len)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(s, len, 0);
	cr_assert_eq(sv_proto_shutdown_tx(&P[s], NOW), 0);
	pump();
	cr_assert(P[1 - s].rx_fin);
}

/* The peer's FIN came after its bytes; then our end of the connection
 * broke (here our own reset; in verbs.c a QP torn down under us). The bytes
 * before the FIN are all here: they are read first, then the error. */
Test(proto, bytes_before_fin_survive_a_break)
{
	sent_then_fin(SA, 300);
	cr_assert_eq(get(SB, 100, 0), 100);
	cr_assert_eq(sv_proto_send_reset(&P[SB]), 0);
	cr_assert_eq(P[SB].error, -ECONNRESET);
	cr_assert_eq(sv_proto_readable(&P[SB]), 200);
	cr_assert_eq(get(SB, 150, 0), 150);
	cr_assert_eq(get(SB, 100, 0), 50);
	cr_assert_eq(sv_proto_readable(&P[SB]), 0);
	cr_assert_eq(get(SB, 100, 0), -ECONNRESET, "the error once the bytes are read");
	cr_assert_eq(put(SB, 10, 0), -ECONNRESET);
}

/* The peer sent its bytes and its FIN, then disconnected: our QP goes to
 * the error state and every receive buffer still posted comes back
 * flushed, one completion each. Each is the same normal end. The first one
 * closes our open direction; the second one used to find it RESET, not
 * "nothing lost", and broke the connection (bed.semantics' TCP_NODELAY
 * client ended "broken" about one exit in 25). */
Test(proto, every_flush_after_the_peers_fin_is_the_end)
{
	sent_then_fin(SB, 100);
	cr_assert_eq(P[SA].inflight, 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN, "our direction still open: the peer went first");
	for (int i = 0; i < 3; i++) {
		cr_assert(sv_proto_flush_is_end(&P[SA]), "flush %d judged a loss", i + 1);
		cr_assert_eq(P[SA].error, 0, "flush %d set an error", i + 1);
		cr_assert_eq(P[SA].tx_state, SV_TX_RESET);
	}
	/* TCP's writes to a peer that closed and reset fail with EPIPE
	 * (bed.semantics checks the SIGPIPE): so do ours, every time. */
	cr_assert_eq(put(SA, 10, 0), -EPIPE, "no QP to send on");
	cr_assert_eq(put(SA, 10, 0), -EPIPE);
	cr_assert_eq(sv_proto_readable(&P[SA]), 100);
	cr_assert_eq(drain(SA), 100, "the peer's bytes stay readable");
	cr_assert_eq(get(SA, 10, 0), 0, "then its EOF");
}

/* A flush is no normal end while bytes of ours may be lost with the QP:
 * DATA still in flight, or no FIN from the peer. */
Test(proto, a_flush_that_may_lose_bytes_is_not_the_end)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	cr_assert_not(sv_proto_flush_is_end(&P[SA]), "no FIN from the peer");
	cr_assert_not(P[SA].qp_ended);
	cr_assert_eq(sv_proto_shutdown_tx(&P[SB], NOW), 0);
	pump();
	cr_assert(P[SA].rx_fin);
	put_all(SA, 10, 0); /* posted, its completion not yet reported */
	cr_assert_eq(P[SA].inflight, 1);
	cr_assert_not(sv_proto_flush_is_end(&P[SA]), "our DATA still in flight");
	cr_assert_not(P[SA].qp_ended);
	cr_assert_eq(P[SA].tx_state, SV_TX_OPEN, "the state is the transport's to break");
	/* After a break every flush is its aftermath. */
	cr_assert_eq(sv_proto_send_reset(&P[SA]), 0);
	cr_assert_eq(P[SA].error, -ECONNRESET);
	cr_assert(sv_proto_flush_is_end(&P[SA]));
}

Test(proto, peer_reset)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	pump();
	cr_assert_eq(sv_proto_send_reset(&P[SA]), 0);
	cr_assert_eq(last_of(SA)->h.type, SV_MSG_RESET);
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(P[SB].error, -ECONNRESET);
	cr_assert_eq(get(SB, 100, 0), -ECONNRESET);
	cr_assert_eq(put(SB, 10, 0), -ECONNRESET);
	cr_assert_eq(FP.ep[SA].violations, 0, "%s", FP.ep[SA].why);
	cr_assert_eq(FP.ep[SB].violations, 0, "%s", FP.ep[SB].why);
}

/* Our DATA arrived, then the peer reset (its check of us failed, or it
 * found a message of ours malformed): it refuses what came over the QP, so
 * going on over TCP from our next byte would leave a gap in its stream. */
Test(proto, data_the_peer_reset_is_not_taken_for_delivered)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SB, 10, 0);
	pump();
	cr_assert(sv_proto_sends_done(&P[SB]), "B's DATA completed");
	cr_assert_eq(sv_proto_send_reset(&P[SA]), 0);
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(P[SB].error, -ECONNRESET);
	const void *buf;
	size_t len;
	cr_assert_lt(sv_proto_tx_lost_qp(&P[SB], &buf, &len), 0,
		     "B's bytes over the QP count as delivered to a peer that reset");
}

/* ---- Two full windows ----------------------------------------------------------- */

ParameterizedTestParameters(proto, two_full_windows)
{
	static struct cw_param params[] = {
		{4, 3, 2}, {8, 3, 8}, {3, 3, 2}, {2, 3, 1}, {2, 4, 2}, {16, 4, 5},
	};
	return cr_make_param_array(struct cw_param, params, sizeof(params) / sizeof(params[0]));
}

static void full_windows_exchange(const struct cw_param *cw)
{
	struct sv_proto_params prm = prm_default();
	prm.window = cw->window;
	prm.reserve = cw->reserve;
	prm.ack_delay = cw->ack_delay;
	prm.buf_size = 128;
	conn_up(&prm);
	open_both();
	uint64_t target = 3ull * cw->window * PAYLOAD_MAX();

	for (int round = 0; round < 200; round++) {
		for (int s = 0; s < 2; s++) {
			while (TXO[s] < target) {
				size_t len = PAYLOAD_MAX();
				if (TXO[s] + len > target)
					len = (size_t)(target - TXO[s]);
				long r = put(s, len, 0);
				if (r == -EAGAIN)
					break;
				cr_assert_gt(r, 0, "%c: send returned %ld", side_name(s), r);
			}
			pump();
		}
		if (round == 0) {
			/* Neither has read: both sent exactly a full window. */
			cr_assert_eq(ndata(SA), cw->window);
			cr_assert_eq(ndata(SB), cw->window);
			cr_assert_eq(P[SA].credits, cw->reserve);
			cr_assert_eq(P[SB].credits, cw->reserve);
			check_conservation();
		}
		uint64_t moved = drain(SA) + drain(SB);
		pump();
		if (RXO[SA] == target && RXO[SB] == target)
			break;
		if (moved == 0) {
			/* Nothing moved: advancing time must unblock it. */
			NOW += prm.ack_timeout_us;
			sv_proto_timers(&P[SA], NOW);
			sv_proto_timers(&P[SB], NOW);
			pump();
		}
	}
	cr_assert_eq(RXO[SB], target, "w=%u c=%u t=%u: B received %llu of %llu", cw->window,
		     cw->reserve, cw->ack_delay, (unsigned long long)RXO[SB],
		     (unsigned long long)target);
	cr_assert_eq(RXO[SA], target, "w=%u c=%u t=%u: A received %llu of %llu", cw->window,
		     cw->reserve, cw->ack_delay, (unsigned long long)RXO[SA],
		     (unsigned long long)target);
	check_quiescent();
}

ParameterizedTest(struct cw_param *cw, proto, two_full_windows)
{
	full_windows_exchange(cw);
}

/* A window of one: either the core refuses it, or it works like any other
 * (the credit rules must not deadlock when both sides are at the reserve). */
Test(proto, window_of_one_is_refused_or_works)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 1;
	prm.ack_delay = 1;
	struct fake_pair fp;
	struct sv_proto tmp;
	cr_assert_eq(fake_pair_init(&fp, sv_proto_nrecv(&prm), sv_proto_nsend(&prm), prm.buf_size), 0);
	struct sv_xport x = fake_xport(&fp.ep[0]);
	int r = sv_proto_init(&tmp, &prm, &x);
	if (r == 0)
		sv_proto_destroy(&tmp);
	fake_pair_destroy(&fp);
	if (r == -EINVAL)
		return;
	cr_assert_eq(r, 0);
	struct cw_param cw = {1, prm.reserve, 1};
	full_windows_exchange(&cw);
}

/* Windows need not agree: each side's credits are the peer's buffers. */
Test(proto, asymmetric_windows)
{
	struct sv_proto_params pa = prm_default(), pb = prm_default();
	pa.window = 4;
	pb.window = 16;
	pa.ack_delay = 2;
	pb.ack_delay = 8;
	conn_up2(&pa, &pb);
	/* The handshake: B's TO_RDMA reports 1 buffer, giving A back the
	 * credit its TO_RDMA cost: A is at B's nrecv again, above its own. */
	cr_assert_eq(sv_proto_send_to_rdma(&P[SA], 0, NOW), 0);
	pump();
	cr_assert_eq(sv_proto_send_to_rdma(&P[SB], 0, NOW), 0);
	uint32_t before = P[SA].credits;
	int r = fake_poll(&FP.ep[SA], &P[SA], NOW);
	cr_assert_geq(r, 0,
		      "A (%u buffers) reset on B's report of 1 buffer, which takes A's "
		      "credits from %u to %u = B's nrecv: %d",
		      nrecv_of(SA), before, before + 1, r);
	cr_assert_eq(P[SA].credits, nrecv_of(SB));
	pump();
	for (int s = 0; s < 2; s++)
		cr_assert_eq(sv_proto_rx_accept(&P[s]), 0);
	/* A fills B's 16-buffer window, B fills A's 4-buffer one. */
	for (int s = 0; s < 2; s++) {
		while (put(s, 10, 0) > 0)
			pump(); /* send completions free our send buffers */
		pump();
	}
	cr_assert_eq(ndata(SA), pb.window, "A may send B's window: sent %zu", ndata(SA));
	cr_assert_eq(ndata(SB), pa.window, "B may send A's window: sent %zu", ndata(SB));
	check_conservation();
	/* Read everything, exchange more, read again. */
	for (int round = 0; round < 4; round++) {
		drain(SA);
		drain(SB);
		pump();
		NOW += pa.ack_timeout_us;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
		check_conservation();
		for (int s = 0; s < 2; s++) {
			while (put(s, 10, 0) > 0)
				pump(); /* send completions free our send buffers */
			pump();
		}
	}
	settle(pa.ack_timeout_us, 8);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(RXO[SA], TXO[SB]);
	cr_assert_gt(TXO[SA], 16 * 10 * 3);
	check_quiescent();
}

/* An UPDATE that found no free send buffer is not lost: it goes out once a
 * send completion frees one (or at the latest when the ACK timer fires). */
Test(proto, update_waits_for_a_send_buffer)
{
	struct sv_proto_params prm = prm_default(); /* w 8, c 3, t 4; nsend 12 */
	conn_up(&prm);
	open_both();
	FP.ep[SB].hold_send_done = true;
	/* B posts as many DATA as it has send buffers, none completes. */
	while (put(SB, 1, 0) > 0)
		;
	pump();
	drain(SA); /* A reports: B gets credits, not buffers */
	NOW += prm.ack_timeout_us;
	sv_proto_timers(&P[SA], NOW);
	pump();
	while (put(SB, 1, 0) > 0)
		;
	pump();
	cr_assert_gt(P[SB].credits, prm.reserve, "B is short of buffers, not of credits");
	cr_assert_eq(P[SB].nfree, 0, "every send buffer of B is in flight");
	cr_assert_eq(fake_held(&FP.ep[SB]), sv_proto_nsend(&prm));

	/* A sends ack_delay messages; B consumes them: an UPDATE is due. */
	size_t u0 = fake_count(&FP.ep[SB], SV_MSG_UPDATE);
	for (uint32_t i = 0; i < prm.ack_delay; i++)
		put_all(SA, 1, 0);
	pump();
	cr_assert_eq(drain(SB), prm.ack_delay);
	cr_assert_eq(fake_count(&FP.ep[SB], SV_MSG_UPDATE), u0, "no buffer, no UPDATE yet");

	/* B's sends complete; B's application reads nothing more. */
	FP.ep[SB].hold_send_done = false;
	fake_release_sends(&FP.ep[SB], SIZE_MAX);
	pump();
	NOW += prm.ack_timeout_us;
	sv_proto_timers(&P[SA], NOW);
	sv_proto_timers(&P[SB], NOW);
	pump();
	cr_assert_gt(fake_count(&FP.ep[SB], SV_MSG_UPDATE), u0,
		     "the UPDATE due at consumption was dropped: B owes A %u buffers, "
		     "next deadline %llu", P[SB].unreported,
		     (unsigned long long)sv_proto_next_deadline(&P[SB], NOW));
	cr_assert_eq(P[SB].unreported_data, 0);
	check_quiescent();
}

/* MSG_MORE data waits for the listed flush reasons; a message arriving from
 * the peer is not one of them. */
Test(proto, msg_more_not_flushed_by_arrivals)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, MSG_MORE);
	cr_assert_eq(ndata(SA), 0);
	put_all(SB, 100, 0); /* DATA arrives at A */
	pump();
	cr_assert_eq(ndata(SA), 0, "A's MSG_MORE bytes were sent when B's DATA arrived "
				   "(flushes_idle %llu)",
		     (unsigned long long)P[SA].st.flushes[SV_FLUSH_IDLE]);
	cr_assert_eq(P[SA].pending_len, 10);
	put_all(SA, 5, 0);
	cr_assert_eq(ndata(SA), 1);
	cr_assert_eq(data_msg(SA, 0)->h.len, 15);
	pump();
	cr_assert_eq(drain(SB), 15);
	check_quiescent();
}

/* ---- Reads: partial, spanning, scattered, peeking ----------------------------- */

static void three_messages(void)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 5, 0);
	put_all(SA, 7, 0);
	put_all(SA, 3, 0);
	cr_assert_eq(ndata(SA), 3);
	pump();
	cr_assert_eq(sv_proto_readable(&P[SB]), 15);
}

Test(proto, recv_one_byte_at_a_time)
{
	three_messages();
	uint32_t posted = fake_posted(&FP.ep[SB]);
	static const int ends[] = {5, 12, 15}; /* message boundaries */
	int k = 0;
	for (int i = 1; i <= 15; i++) {
		cr_assert_eq(get(SB, 1, 0), 1, "byte %d", i);
		cr_assert_eq(sv_proto_readable(&P[SB]), (uint64_t)(15 - i));
		/* A buffer the call emptied is held back until the next call. */
		uint32_t just = k < 3 && i == ends[k];
		k += (int)just;
		cr_assert_eq(fake_posted(&FP.ep[SB]), posted + (uint32_t)k - just,
			     "after %d bytes, %d buffers consumed fully, %u of them held", i, k, just);
		cr_assert_eq(P[SB].rx_held >= 0, just != 0, "byte %d: held", i);
	}
	cr_assert_eq(get(SB, 1, 0), -EAGAIN);
	pump();
	check_quiescent();
}

Test(proto, recv_spans_messages)
{
	three_messages();
	cr_assert_eq(get(SB, 10, 0), 10, "recv copies across message boundaries");
	cr_assert_eq(sv_proto_readable(&P[SB]), 5);
	cr_assert_eq(get(SB, 100, 0), 5);
	cr_assert_eq(get(SB, 100, 0), -EAGAIN);
	check_quiescent();
}

Test(proto, recv_into_several_iovecs)
{
	three_messages();
	uint8_t a[3], b[1], c[4], d[100];
	memset(d, 0xEE, sizeof(d));
	struct iovec iov[] = {{a, 3}, {b, 0}, {c, 4}, {d, sizeof(d)}};
	long r = sv_proto_recv(&P[SB], iov, 4, 0, NOW);
	cr_assert_eq(r, 15);
	uint8_t all[15];
	memcpy(all, a, 3);
	memcpy(all + 3, c, 4);
	memcpy(all + 7, d, 8);
	verify_rx(SB, all, 15);
	RXO[SB] += 15;
	cr_assert_eq(d[8], 0xEE, "recv wrote past the data");
	cr_assert_eq(get(SB, 1, 0), -EAGAIN);
	check_quiescent();
}

Test(proto, send_from_several_iovecs)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	const uint8_t *s = STREAM[SA];
	struct iovec iov[] = {{(void *)s, 2}, {(void *)(s + 2), 0}, {(void *)(s + 2), 9}};
	long r = sv_proto_send(&P[SA], iov, 3, 0, NOW);
	cr_assert_eq(r, 11);
	TXO[SA] += 11;
	cr_assert_eq(ndata(SA), 1, "one message for one write");
	cr_assert_eq(data_msg(SA, 0)->h.len, 11);
	cr_assert_eq(memcmp(FP.ep[SA].sent, s, 11), 0);
	pump();
	cr_assert_eq(drain(SB), 11);
	check_quiescent();
}

Test(proto, recv_peek_leaves_the_data)
{
	three_messages();
	uint32_t posted = fake_posted(&FP.ep[SB]);
	cr_assert_eq(get(SB, 10, MSG_PEEK), 10);
	cr_assert_eq(get(SB, 100, MSG_PEEK), 15);
	cr_assert_eq(sv_proto_readable(&P[SB]), 15);
	cr_assert_eq(fake_posted(&FP.ep[SB]), posted, "peeking consumes no buffer");
	cr_assert_eq(P[SB].unreported_data, 0);
	cr_assert_eq(get(SB, 6, 0), 6);
	cr_assert_eq(get(SB, 3, MSG_PEEK), 3);
	cr_assert_eq(drain(SB), 9);
	check_quiescent();
}

Test(proto, large_write_takes_what_the_credits_allow)
{
	struct sv_proto_params prm = prm_default();
	prm.window = 4;
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	put_all(SA, 10, 0); /* two data credits left */
	long r = put(SA, 10 * PAYLOAD_MAX(), 0);
	cr_assert_gt(r, 0, "a partial write takes what fits: %ld", r);
	cr_assert_leq(r, (long)(2 * PAYLOAD_MAX()));
	cr_assert_eq(ndata(SA), 4);
	cr_assert_eq(put(SA, PAYLOAD_MAX(), 0), -EAGAIN);
	pump();
	cr_assert_eq(drain(SB), TXO[SA]);
	check_quiescent();
}

/* ---- Malformed input ------------------------------------------------------------ */

enum bad_kind {
	BAD_TYPE_0,
	BAD_TYPE_10,
	BAD_TYPE_255,
	BAD_FLAGS,
	BAD_LEN_OVER_MAX,
	BAD_LEN_HUGE,
	BAD_LEN_WRAPS,
	BAD_SEQ_AHEAD,
	BAD_SEQ_BEHIND,
	BAD_DATA_RX_TCP,
	BAD_DATA_AFTER_TO_TCP,
	BAD_UPDATE_PAYLOAD,
	BAD_DRAIN_PAYLOAD,
	BAD_CREDITS_OVER_NRECV,
	BAD_CREDITS_HUGE,
	BAD_SHORT,
	BAD_EMPTY,
	BAD_BYTE_LEN_LONGER,
	BAD_BYTE_LEN_SHORTER,
	BAD_ACK_AHEAD,
	BAD_DATA_EMPTY,
	BAD_FIN_PAYLOAD,
	BAD_TO_TCP_PAYLOAD,
	BAD_FIN_TWICE,
	BAD_DATA_AFTER_FIN,
	BAD_FIN_SEQ,
	BAD_TO_TCP_SEQ,
	BAD_TO_RDMA_ON_QP,
	BAD_TO_TCP_ON_TCP,
};

static const char *const bad_names[] = {
	"unknown type 0", "unknown type 10", "unknown type 255", "nonzero flags",
	"len > payload max", "len 0xffffffff", "24 + len wraps to byte_len",
	"DATA seq ahead", "DATA seq behind", "DATA while rx on TCP, no TO_RDMA",
	"DATA after TO_TCP", "UPDATE with payload", "DRAIN with payload", "credits over nrecv",
	"credits 0xffff", "byte_len < header", "byte_len 0", "byte_len > 24 + len",
	"byte_len < 24 + len", "ack beyond snd_nxt", "DATA with no payload",
	"FIN with payload", "TO_TCP with payload", "second FIN", "DATA after FIN",
	"FIN seq != rcv_nxt", "TO_TCP seq != rcv_nxt", "TO_RDMA while on the QP",
	"TO_TCP while on TCP",
};

struct bad_case {
	int kind;
};

ParameterizedTestParameters(proto, malformed_resets)
{
	static struct bad_case cases[] = {
		{BAD_TYPE_0},         {BAD_TYPE_10},           {BAD_TYPE_255},
		{BAD_FLAGS},          {BAD_LEN_OVER_MAX},     {BAD_LEN_HUGE},
		{BAD_LEN_WRAPS},      {BAD_SEQ_AHEAD},        {BAD_SEQ_BEHIND},
		{BAD_DATA_RX_TCP},    {BAD_DATA_AFTER_TO_TCP}, {BAD_UPDATE_PAYLOAD},
		{BAD_DRAIN_PAYLOAD},
		{BAD_CREDITS_OVER_NRECV}, {BAD_CREDITS_HUGE}, {BAD_SHORT},
		{BAD_EMPTY},          {BAD_BYTE_LEN_LONGER},  {BAD_BYTE_LEN_SHORTER},
		{BAD_ACK_AHEAD},      {BAD_DATA_EMPTY},       {BAD_FIN_PAYLOAD},
		{BAD_TO_TCP_PAYLOAD}, {BAD_FIN_TWICE},        {BAD_DATA_AFTER_FIN},
		{BAD_FIN_SEQ},        {BAD_TO_TCP_SEQ},       {BAD_TO_RDMA_ON_QP},
		{BAD_TO_TCP_ON_TCP},
	};
	return cr_make_param_array(struct bad_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct bad_case *bc, proto, malformed_resets)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	if (bc->kind != BAD_DATA_RX_TCP && bc->kind != BAD_TO_TCP_ON_TCP) {
		open_both();
		put_all(SA, 10, 0);
		pump();
	}
	if (bc->kind == BAD_FIN_TWICE || bc->kind == BAD_DATA_AFTER_FIN) {
		/* A valid FIN first. */
		struct sv_hdr fin = {.type = SV_MSG_FIN, .seq = P[SB].rcv_nxt, .ack = P[SB].snd_nxt};
		cr_assert_eq(fake_inject_msg(&FP.ep[SB], &fin, NULL, 0, SV_HDR_SIZE), 0);
		int r0 = fake_poll(&FP.ep[SB], &P[SB], NOW);
		cr_assert_geq(r0, 0, "a valid FIN was refused: %d", r0);
		cr_assert(P[SB].rx_fin);
	}
	if (bc->kind == BAD_DATA_AFTER_TO_TCP) {
		cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
		pump();
		cr_assert_eq(drain(SB), 10);
		cr_assert(sv_proto_rx_on_tcp(&P[SB]));
	}
	check_clean();
	cr_assert_eq(sizeof(bad_names) / sizeof(bad_names[0]), BAD_TO_TCP_ON_TCP + 1);

	uint32_t pmax = PAYLOAD_MAX();
	uint8_t payload[512];
	memset(payload, 0x42, sizeof(payload));
	struct sv_hdr h = {
		.type = SV_MSG_DATA,
		.flags = 0,
		.credits = 0,
		.len = 4,
		.seq = P[SB].rcv_nxt,
		.ack = P[SB].snd_nxt,
	};
	uint32_t plen = 4;
	uint32_t byte_len = SV_HDR_SIZE + 4;
	switch (bc->kind) {
	case BAD_TYPE_0:
		h.type = 0;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	case BAD_TYPE_10:
		h.type = 10;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	case BAD_TYPE_255:
		h.type = 255;
		break;
	case BAD_FLAGS:
		h.flags = 1;
		break;
	case BAD_LEN_OVER_MAX: /* the header claims one byte more than fits */
		h.len = pmax + 1;
		plen = pmax;
		byte_len = PRM.buf_size;
		break;
	case BAD_LEN_HUGE:
		h.len = 0xFFFFFFFFu;
		plen = pmax;
		byte_len = PRM.buf_size;
		break;
	case BAD_LEN_WRAPS: /* SV_HDR_SIZE + len wraps around to byte_len in 32 bits */
		h.len = 0xFFFFFFFFu - SV_HDR_SIZE + 1 + 6;
		plen = 0;
		byte_len = 6;
		break;
	case BAD_SEQ_AHEAD:
		h.seq += 1;
		break;
	case BAD_SEQ_BEHIND:
		h.seq -= 1;
		break;
	case BAD_DATA_RX_TCP:
		cr_assert_not(P[SB].rx_on_qp);
		cr_assert_not(P[SB].peer_to_rdma);
		break;
	case BAD_DATA_AFTER_TO_TCP:
		break;
	case BAD_UPDATE_PAYLOAD:
		h.type = SV_MSG_UPDATE;
		h.seq = P[SB].snd_nxt;
		break;
	case BAD_DRAIN_PAYLOAD:
		h.type = SV_MSG_DRAIN;
		h.seq = P[SB].snd_nxt;
		break;
	case BAD_CREDITS_OVER_NRECV:
		h.type = SV_MSG_UPDATE;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		h.credits = (uint16_t)(NRECV() - P[SB].credits + 1);
		break;
	case BAD_CREDITS_HUGE:
		h.type = SV_MSG_UPDATE;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		h.credits = 0xFFFF;
		break;
	case BAD_SHORT:
		h.type = SV_MSG_UPDATE;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE - 1;
		break;
	case BAD_EMPTY:
		h.type = SV_MSG_UPDATE;
		h.len = plen = 0;
		byte_len = 0;
		break;
	case BAD_BYTE_LEN_LONGER:
		h.len = 4;
		plen = 8;
		byte_len = SV_HDR_SIZE + 8;
		break;
	case BAD_BYTE_LEN_SHORTER:
		h.len = 8;
		plen = 8;
		byte_len = SV_HDR_SIZE + 4;
		break;
	case BAD_ACK_AHEAD: /* acknowledges a byte B never sent */
		h.type = SV_MSG_UPDATE;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		h.ack = P[SB].snd_nxt + 1;
		break;
	case BAD_DATA_EMPTY: /* DATA carries 1 .. payload_max bytes */
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	case BAD_FIN_PAYLOAD:
		h.type = SV_MSG_FIN;
		break;
	case BAD_TO_TCP_PAYLOAD:
		h.type = SV_MSG_TO_TCP;
		break;
	case BAD_FIN_TWICE:
		h.type = SV_MSG_FIN;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	case BAD_DATA_AFTER_FIN:
		break;
	case BAD_FIN_SEQ:
		h.type = SV_MSG_FIN;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		h.seq = P[SB].rcv_nxt + 5;
		break;
	case BAD_TO_TCP_SEQ:
		h.type = SV_MSG_TO_TCP;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		h.seq = P[SB].rcv_nxt - 1;
		break;
	case BAD_TO_RDMA_ON_QP: /* the direction is already on the QP */
		h.type = SV_MSG_TO_RDMA;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	case BAD_TO_TCP_ON_TCP: /* the direction never left TCP */
		h.type = SV_MSG_TO_TCP;
		h.len = plen = 0;
		byte_len = SV_HDR_SIZE;
		break;
	default:
		cr_assert_fail("unknown case %d", bc->kind);
	}

	cr_assert_eq(fake_inject_msg(&FP.ep[SB], &h, payload, plen, byte_len), 0);
	int r = fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(r, -ECONNRESET, "%s: on_recv returned %d", bad_names[bc->kind], r);
	cr_assert_eq(P[SB].error, -ECONNRESET, "%s", bad_names[bc->kind]);

	/* After a valid FIN the bytes before it are read first (as TCP reads
	 * what it queued before an RST); then every call reports the reset,
	 * and nothing crashes. */
	if (bc->kind == BAD_FIN_TWICE || bc->kind == BAD_DATA_AFTER_FIN) {
		cr_assert_eq(sv_proto_readable(&P[SB]), 10, "%s", bad_names[bc->kind]);
		cr_assert_eq(get(SB, 100, MSG_PEEK), 10);
		cr_assert_eq(get(SB, 100, 0), 10);
		cr_assert_eq(sv_proto_readable(&P[SB]), 0);
	}
	cr_assert_eq(get(SB, 100, 0), -ECONNRESET);
	cr_assert_eq(get(SB, 100, MSG_PEEK), -ECONNRESET);
	cr_assert_eq(put(SB, 10, 0), -ECONNRESET);
	cr_assert_eq(put(SB, 1000, 0), -ECONNRESET);
	NOW += 10000;
	sv_proto_timers(&P[SB], NOW);
	(void)sv_proto_flush(&P[SB], SV_FLUSH_CLOSE, NOW);
	(void)sv_proto_readable(&P[SB]);
	(void)sv_proto_rx_on_tcp(&P[SB]);
	/* More traffic from A, and a second malformed message. */
	if (P[SA].tx_state == SV_TX_OPEN) {
		for (int i = 0; i < 3; i++)
			(void)put(SA, 10, 0);
	}
	struct sv_hdr h2 = {.type = 99, .len = 0};
	if (fake_posted(&FP.ep[SB]) > 0)
		cr_assert_eq(fake_inject_msg(&FP.ep[SB], &h2, NULL, 0, SV_HDR_SIZE), 0);
	for (int i = 0; i < 10; i++) {
		fake_poll(&FP.ep[SA], &P[SA], NOW);
		fake_poll(&FP.ep[SB], &P[SB], NOW);
	}
	cr_assert_eq(P[SB].error, -ECONNRESET);
	cr_assert_eq(get(SB, 100, 0), -ECONNRESET);
	cr_assert_eq(put(SB, 10, 0), -ECONNRESET);
	cr_assert_eq(FP.ep[SA].violations, 0, "%s", FP.ep[SA].why);
	cr_assert_eq(FP.ep[SB].violations, 0, "%s", FP.ep[SB].why);
}

/* ---- Randomized soak ------------------------------------------------------------- */

struct soak_param {
	uint32_t seed;
	uint32_t window, reserve, ack_delay, buf_size, coalesce_size, zcopy_threshold;
	uint32_t steps;
	uint8_t coalesce;
};

ParameterizedTestParameters(proto, soak)
{
	static struct soak_param params[] = {
		{1, 8, 3, 4, 256, 64, 1u << 30, 30000, 1},
		{2, 4, 3, 2, 128, 32, 300, 30000, 1},
		{3, 16, 4, 8, 512, 128, 1024, 30000, 0},
		{4, 2, 3, 1, 64, 16, 100, 30000, 1},
		{5, 2, 3, 1, 100, 50, 1u << 30, 30000, 1},
		{6, 32, 3, 16, 1024, 256, 2048, 20000, 1},
		{7, 3, 5, 3, 200, 100, 400, 30000, 0},
		{8, 8, 3, 8, 256, 200, 256, 30000, 1},
		/* Zero copy below the coalescing size (as the default config has
		 * with SOVIA_REG_THRESHOLD under SOVIA_COALESCE_SIZE). */
		{9, 8, 3, 4, 256, 200, 100, 30000, 1},
		{10, 4, 3, 2, 256, 232, 64, 30000, 0},
	};
	return cr_make_param_array(struct soak_param, params, sizeof(params) / sizeof(params[0]));
}

static uint64_t RNG;

static uint64_t rnd(void)
{
	uint64_t x = RNG;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	RNG = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t rnd_below(uint32_t n)
{
	return (uint32_t)(rnd() % n);
}

/* Split len bytes at p into up to 3 iovecs at random points. */
static int rnd_iov(struct iovec *iov, uint8_t *p, size_t len)
{
	int n = 1 + (int)rnd_below(3);
	size_t left = len;
	for (int i = 0; i < n; i++) {
		size_t k = (i == n - 1) ? left : (left ? rnd_below((uint32_t)left + 1) : 0);
		iov[i].iov_base = p;
		iov[i].iov_len = k;
		p += k;
		left -= k;
	}
	return n;
}

static uint64_t soak_limit(void)
{
	return STREAM_LEN - 4 * (uint64_t)PRM.buf_size;
}

static void soak_write(int s)
{
	if (P[s].tx_state != SV_TX_OPEN)
		return;
	/* The stream layer does not return to the application (which
	 * would write again) while a zero-copy send is in flight. */
	if (sv_proto_zcopy_busy(&P[s]))
		return;
	/* Half small writes (coalescing), half up to three buffers. */
	size_t len = rnd_below(2) ? 1 + rnd_below(PRM.coalesce_size)
				  : 1 + rnd_below(3 * PRM.buf_size);
	if (TXO[s] + len > soak_limit())
		return;
	int flags = rnd_below(4) == 0 ? MSG_MORE : 0;
	struct iovec iov[3];
	int n = rnd_iov(iov, STREAM[s] + TXO[s], len);
	long r = sv_proto_send(&P[s], iov, n, flags, NOW);
	cr_assert((r > 0 && (size_t)r <= len) || r == -EAGAIN, "%c: send(%zu) returned %ld",
		  side_name(s), len, r);
	if (r > 0)
		TXO[s] += (uint64_t)r;
}

static void soak_read(int s)
{
	size_t len = 1 + rnd_below(2 * PRM.buf_size);
	int flags = rnd_below(8) == 0 ? MSG_PEEK : 0;
	struct iovec iov[3];
	memset(RBUF, 0xEE, len);
	int n = rnd_iov(iov, RBUF, len);
	uint64_t readable = sv_proto_readable(&P[s]);
	long r = sv_proto_recv(&P[s], iov, n, flags, NOW);
	if (r == -EAGAIN) {
		cr_assert_eq(readable, 0, "%c: recv said -EAGAIN with %llu bytes readable",
			     side_name(s), (unsigned long long)readable);
		return;
	}
	cr_assert_gt(r, 0, "%c: recv returned %ld", side_name(s), r);
	size_t want = readable < len ? (size_t)readable : len;
	cr_assert_eq((size_t)r, want, "%c: recv of %zu with %llu readable returned %ld",
		     side_name(s), len, (unsigned long long)readable, r);
	verify_rx(s, RBUF, (size_t)r);
	if (!(flags & MSG_PEEK))
		RXO[s] += (uint64_t)r;
}

/* A soak's step on the transport and the clock, for op in [60, 100): a
 * completion of side s delivered (18), its sends held back or let go (5)
 * or some of them let go (5), the clock moved by less than tick_max with
 * both sides' timers fired (8), or side s's timers fired (4). */
static void soak_io(int s, uint32_t op, uint64_t tick_max, uint32_t step)
{
	struct fake_ep *ep = &FP.ep[s];
	if (op < 78) {
		int r = fake_poll(ep, &P[s], NOW);
		cr_assert_geq(r, 0, "step %u: %c: completion failed: %d", step, side_name(s), r);
	} else if (op < 83) {
		ep->hold_send_done = !ep->hold_send_done;
		if (!ep->hold_send_done)
			fake_release_sends(ep, SIZE_MAX);
	} else if (op < 88) {
		fake_release_sends(ep, 1 + rnd_below(4));
	} else if (op < 96) {
		NOW += rnd_below((uint32_t)tick_max);
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
	} else {
		sv_proto_timers(&P[s], NOW);
	}
}

/* Bytes written and not yet read, or a writer that still has data to
 * write (it stops near the end of its stream). */
static bool soak_work_left(void)
{
	for (int s = 0; s < 2; s++)
		if (RXO[1 - s] < TXO[s] || TXO[s] + 3 * PRM.buf_size < soak_limit())
			return true;
	return false;
}

static bool soak_undelivered(void)
{
	for (int s = 0; s < 2; s++)
		if (RXO[1 - s] < TXO[s])
			return true;
	return false;
}

ParameterizedTest(struct soak_param *sp, proto, soak)
{
	struct sv_proto_params prm = {
		.window = sp->window,
		.reserve = sp->reserve,
		.buf_size = sp->buf_size,
		.ack_delay = sp->ack_delay,
		.ack_timeout_us = 300,
		.coalesce = sp->coalesce != 0,
		.coalesce_size = sp->coalesce_size,
		.coalesce_timeout_us = 200,
		.zcopy_threshold = sp->zcopy_threshold,
	};
	conn_up(&prm);
	open_both();
	RNG = 0x243F6A8885A308D3ull ^ ((uint64_t)sp->seed * 0x9E3779B97F4A7C15ull);
	/* The longest timer: the delayed ACK of bulk data. */
	uint64_t tmax = SV_ACK_BULK_FACTOR * prm.ack_timeout_us > prm.coalesce_timeout_us
				? SV_ACK_BULK_FACTOR * prm.ack_timeout_us
				: prm.coalesce_timeout_us;

	uint64_t progress = 0;
	uint32_t last_progress = 0;
	int unblocks = 0;
	for (uint32_t step = 0; step < sp->steps; step++) {
		int s = (int)rnd_below(2);
		uint32_t op = rnd_below(100);
		if (op < 30) {
			soak_write(s);
		} else if (op < 60) {
			soak_read(s);
		} else {
			soak_io(s, op, tmax * 3 / 2 + 1, step);
		}
		check_clean();
		if (!fake_pending_recvs(&FP.ep[SA]) && !fake_pending_recvs(&FP.ep[SB]))
			check_conservation();

		uint64_t p = TXO[SA] + TXO[SB] + RXO[SA] + RXO[SB];
		if (p != progress) {
			progress = p;
			last_progress = step;
			unblocks = 0;
		} else if (step - last_progress > 400 && soak_work_left()) {
			/* Stuck: completions arrive eventually, and advancing
			 * time must unblock whatever is left. */
			cr_assert_lt(unblocks, 3,
				     "seed %u step %u: deadlock: no progress even after advancing "
				     "time (A sent %llu, B got %llu; B sent %llu, A got %llu; "
				     "credits A %u B %u, unreported A %u/%u B %u/%u)",
				     sp->seed, step, (unsigned long long)TXO[SA],
				     (unsigned long long)RXO[SB], (unsigned long long)TXO[SB],
				     (unsigned long long)RXO[SA], P[SA].credits, P[SB].credits,
				     P[SA].unreported, P[SA].unreported_data, P[SB].unreported,
				     P[SB].unreported_data);
			for (int k = 0; k < 2; k++) {
				FP.ep[k].hold_send_done = false;
				fake_release_sends(&FP.ep[k], SIZE_MAX);
			}
			pump();
			NOW += tmax + 1;
			sv_proto_timers(&P[SA], NOW);
			sv_proto_timers(&P[SB], NOW);
			pump();
			last_progress = step;
			unblocks++;
		}
	}

	/* Drain: completions in, time forward, read everything. */
	for (int round = 0; round < 100 && soak_undelivered(); round++) {
		for (int k = 0; k < 2; k++) {
			FP.ep[k].hold_send_done = false;
			fake_release_sends(&FP.ep[k], SIZE_MAX);
		}
		pump();
		drain(SA);
		drain(SB);
		pump();
		NOW += tmax + 1;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
	}
	cr_assert_eq(RXO[SB], TXO[SA], "B got %llu of A's %llu bytes", (unsigned long long)RXO[SB],
		     (unsigned long long)TXO[SA]);
	cr_assert_eq(RXO[SA], TXO[SB], "A got %llu of B's %llu bytes", (unsigned long long)RXO[SA],
		     (unsigned long long)TXO[SB]);
	cr_assert_gt(TXO[SA], 10000, "seed %u: the soak moved too little data (A sent %llu, B sent %llu)", sp->seed, (unsigned long long)TXO[SA], (unsigned long long)TXO[SB]);
	cr_assert_gt(TXO[SB], 10000);
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(FP.ep[s].nsent, TXO[s], "%c: %zu DATA bytes on the wire, %llu written",
			     side_name(s), FP.ep[s].nsent, (unsigned long long)TXO[s]);
		cr_assert_eq(memcmp(FP.ep[s].sent, STREAM[s], FP.ep[s].nsent), 0);
	}
	NOW += tmax + 1;
	sv_proto_timers(&P[SA], NOW);
	sv_proto_timers(&P[SB], NOW);
	check_quiescent();
	cr_assert_eq(P[SA].unreported_data, 0);
	cr_assert_eq(P[SB].unreported_data, 0);

	/* Both close; each sees EOF. */
	for (int s = 0; s < 2; s++) {
		int r = sv_proto_send_fin(&P[s], NOW);
		cr_assert_eq(r, 0, "%c: FIN: %d", side_name(s), r);
	}
	pump();
	cr_assert_eq(get(SA, 10, 0), 0);
	cr_assert_eq(get(SB, 10, 0), 0);
	check_quiescent();
	if (sp->coalesce) {
		uint64_t fl = 0;
		for (int s = 0; s < 2; s++)
			fl += P[s].st.flushes[SV_FLUSH_TIMER] + P[s].st.flushes[SV_FLUSH_FULL] +
			      P[s].st.flushes[SV_FLUSH_IDLE] + P[s].st.flushes[SV_FLUSH_RECV];
		cr_assert_gt(fl, 0);
	}
}

/* ---- Randomized soak with medium switches ------------------------------------------
 *
 * Each direction starts on TCP and moves between TCP and the QP at random.
 * The harness plays TCP: while a side's sending is on TCP its writes go to
 * a TCP pipe (they just advance TXO), and the receiver reads the pipe when
 * sv_proto_rx_on_tcp() says so, up to the peer's switch point, and then
 * calls sv_proto_rx_accept. Bytes the core delivers are checked against
 * the stream, so a QP byte delivered at the wrong offset shows. A sender
 * moves back to TCP only after the receiver accepted its last TO_RDMA
 * (one switch in flight per direction). */


/* Where TCP's part of side s's stream currently ends. */
static uint64_t tcp_end(int s)
{
	return P[s].tx_state == SV_TX_TCP ? TXO[s] : TO_RDMA_SEQ[s];
}

/* Side s reads up to max bytes of the peer's stream from TCP, and moves its
 * receive side to the QP at the switch point. */
static void sw_tcp_read(int s, uint64_t max)
{
	int o = 1 - s;
	if (!sv_proto_rx_on_tcp(&P[s]))
		return;
	cr_assert_eq(sv_proto_recv(&P[s], &(struct iovec){RBUF, 16}, 1, 0, NOW), -EAGAIN,
		     "%c: recv delivered QP bytes while on TCP", side_name(s));
	uint64_t lim = tcp_end(o);
	if (P[s].peer_to_rdma) {
		cr_assert_eq(P[s].peer_to_rdma_seq, TO_RDMA_SEQ[o]);
		lim = P[s].peer_to_rdma_seq;
	}
	cr_assert_geq(lim, RXO[s], "%c read past TCP's part", side_name(s));
	uint64_t n = lim - RXO[s] < max ? lim - RXO[s] : max;
	RXO[s] += n;
	if (P[s].peer_to_rdma && RXO[s] == P[s].peer_to_rdma_seq) {
		int r = sv_proto_rx_accept(&P[s]);
		cr_assert_eq(r, 0, "%c: rx_accept: %d", side_name(s), r);
		ACCEPTED[o] = true;
	}
}

static void sw_write(int s)
{
	size_t len = rnd_below(2) ? 1 + rnd_below(PRM.coalesce_size)
				  : 1 + rnd_below(3 * PRM.buf_size);
	if (TXO[s] + len > soak_limit())
		return;
	if (P[s].tx_state == SV_TX_TCP) {
		TXO[s] += len; /* written to the TCP socket */
		return;
	}
	soak_write(s);
}

static void sw_switch(int s)
{
	if (P[s].tx_state == SV_TX_OPEN && ACCEPTED[s]) {
		int r = sv_proto_send_to_tcp(&P[s], NOW);
		cr_assert(r == 0 || r == -EAGAIN, "%c: TO_TCP: %d", side_name(s), r);
		if (r == 0) {
			cr_assert_eq(last_of(s)->h.type, SV_MSG_TO_TCP);
			cr_assert_eq(last_of(s)->h.seq, TXO[s], "TO_TCP after every byte taken");
			ACCEPTED[s] = false;
		}
	} else if (P[s].tx_state == SV_TX_TCP) {
		int r = sv_proto_send_to_rdma(&P[s], TXO[s], NOW);
		cr_assert(r == 0 || r == -EAGAIN, "%c: TO_RDMA: %d", side_name(s), r);
		if (r == 0)
			TO_RDMA_SEQ[s] = TXO[s];
	}
}

ParameterizedTestParameters(proto, soak_switching)
{
	static struct soak_param params[] = {
		{11, 8, 3, 4, 256, 64, 1u << 30, 30000, 1},
		{12, 4, 4, 2, 128, 32, 300, 30000, 1},
		{13, 16, 4, 8, 512, 128, 1024, 30000, 0},
		{14, 2, 3, 1, 64, 16, 100, 30000, 1},
		{15, 6, 4, 3, 200, 100, 400, 30000, 1},
	};
	return cr_make_param_array(struct soak_param, params, sizeof(params) / sizeof(params[0]));
}

ParameterizedTest(struct soak_param *sp, proto, soak_switching)
{
	struct sv_proto_params prm = {
		.window = sp->window,
		.reserve = sp->reserve,
		.buf_size = sp->buf_size,
		.ack_delay = sp->ack_delay,
		.ack_timeout_us = 300,
		.coalesce = sp->coalesce != 0,
		.coalesce_size = sp->coalesce_size,
		.coalesce_timeout_us = 200,
		.zcopy_threshold = sp->zcopy_threshold,
	};
	conn_up(&prm);
	RNG = 0x13198A2E03707344ull ^ ((uint64_t)sp->seed * 0x9E3779B97F4A7C15ull);
	uint64_t tmax = SV_ACK_BULK_FACTOR * 300; /* the bulk data's delayed ACK */
	unsigned switches[2] = {0, 0};

	uint64_t progress = 0;
	uint32_t last_progress = 0;
	int unblocks = 0;
	for (uint32_t step = 0; step < sp->steps; step++) {
		int s = (int)rnd_below(2);
		struct fake_ep *ep = &FP.ep[s];
		uint32_t op = rnd_below(100);
		if (op < 28) {
			sw_write(s);
		} else if (op < 48) {
			soak_read(s);
		} else if (op < 58) {
			sw_tcp_read(s, 1 + rnd_below(3 * PRM.buf_size));
		} else if (op < 74) {
			int r = fake_poll(ep, &P[s], NOW);
			cr_assert_geq(r, 0, "seed %u step %u: %c: completion failed: %d", sp->seed,
				      step, side_name(s), r);
		} else if (op < 78) {
			ep->hold_send_done = !ep->hold_send_done;
			if (!ep->hold_send_done)
				fake_release_sends(ep, SIZE_MAX);
		} else if (op < 82) {
			fake_release_sends(ep, 1 + rnd_below(4));
		} else if (op < 90) {
			NOW += rnd_below((uint32_t)(tmax * 3 / 2 + 1));
			sv_proto_timers(&P[SA], NOW);
			sv_proto_timers(&P[SB], NOW);
		} else if (op < 93) {
			enum sv_tx_state before = P[s].tx_state;
			sw_switch(s);
			switches[s] += P[s].tx_state != before;
		} else {
			sv_proto_timers(&P[s], NOW);
		}
		check_clean();
		if (!fake_pending_recvs(&FP.ep[SA]) && !fake_pending_recvs(&FP.ep[SB]))
			check_conservation();

		uint64_t p = TXO[SA] + TXO[SB] + RXO[SA] + RXO[SB];
		if (p != progress) {
			progress = p;
			last_progress = step;
			unblocks = 0;
		} else if (step - last_progress > 400 && soak_work_left()) {
			cr_assert_lt(unblocks, 3,
				     "seed %u step %u: deadlock (A sent %llu, B got %llu; B sent "
				     "%llu, A got %llu)",
				     sp->seed, step, (unsigned long long)TXO[SA],
				     (unsigned long long)RXO[SB], (unsigned long long)TXO[SB],
				     (unsigned long long)RXO[SA]);
			for (int k = 0; k < 2; k++) {
				FP.ep[k].hold_send_done = false;
				fake_release_sends(&FP.ep[k], SIZE_MAX);
			}
			pump();
			NOW += tmax + 1;
			sv_proto_timers(&P[SA], NOW);
			sv_proto_timers(&P[SB], NOW);
			pump();
			last_progress = step;
			unblocks++;
		}
	}

	for (int round = 0; round < 100 && soak_undelivered(); round++) {
		for (int k = 0; k < 2; k++) {
			FP.ep[k].hold_send_done = false;
			fake_release_sends(&FP.ep[k], SIZE_MAX);
		}
		pump();
		for (int k = 0; k < 2; k++) {
			drain(k);
			sw_tcp_read(k, UINT64_MAX);
			drain(k);
		}
		pump();
		NOW += tmax + 1;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
	}
	cr_assert_eq(RXO[SB], TXO[SA], "seed %u: B got %llu of A's %llu bytes", sp->seed,
		     (unsigned long long)RXO[SB], (unsigned long long)TXO[SA]);
	cr_assert_eq(RXO[SA], TXO[SB], "seed %u: A got %llu of B's %llu bytes", sp->seed,
		     (unsigned long long)RXO[SA], (unsigned long long)TXO[SB]);
	cr_assert_gt(switches[SA], 10, "seed %u: A switched only %u times", sp->seed,
		     switches[SA]);
	cr_assert_gt(switches[SB], 10, "seed %u: B switched only %u times", sp->seed,
		     switches[SB]);
	cr_assert_gt(FP.ep[SA].nsent, 10000, "seed %u: little went over the QP", sp->seed);
	cr_assert_gt(FP.ep[SB].nsent, 10000, "seed %u: little went over the QP", sp->seed);
	check_quiescent();
}

/* ---- The way back: BACK and RETURN ---------------------------------------------- */

/* Both sides exchange BACKs and give back what their applications have not
 * read; loop until both are done. Side `first` starts; prefix (of the peer's
 * stream, read from TCP but not by the application) is given by each side. */
static void back_exchange(int first, const uint8_t *prefix[2], const size_t plen[2])
{
	int r = sv_proto_send_back(&P[first], prefix[first], plen[first], NOW);
	cr_assert_eq(r, 0, "%c: BACK: %d", side_name(first), r);
	cr_assert_eq(P[first].tx_state, SV_TX_BACK);
	for (int round = 0; round < 1000; round++) {
		pump();
		int other = 1 - first;
		if (sv_proto_back_wanted(&P[other])) {
			r = sv_proto_send_back(&P[other], prefix[other], plen[other], NOW);
			cr_assert_eq(r, 0, "%c: answering BACK: %d", side_name(other), r);
			continue;
		}
		bool done = true;
		for (int s = 0; s < 2; s++) {
			r = sv_proto_send_returns(&P[s], NOW);
			cr_assert(r == 0 || r == -EAGAIN, "%c: returns: %d", side_name(s), r);
			done = done && r == 0 && sv_proto_back_done(&P[s]);
		}
		if (done) {
			pump();
			if (sv_proto_back_done(&P[SA]) && sv_proto_back_done(&P[SB]))
				return;
		}
		/* Credits may wait on the delayed-ACK timer. */
		NOW += PRM.ack_timeout_us;
		for (int s = 0; s < 2; s++)
			sv_proto_timers(&P[s], NOW);
	}
	cr_assert_fail("the BACK exchange never finished");
}

/* Side s's owed bytes must be exactly its own stream from `from` to its end. */
static void check_owed(int s, uint64_t from)
{
	const void *buf;
	size_t len;
	sv_proto_owed(&P[s], &buf, &len);
	cr_assert_eq(len, TXO[s] - from, "%c: %zu bytes given back, expected %llu", side_name(s),
		     len, (unsigned long long)(TXO[s] - from));
	if (len)
		cr_assert_arr_eq(buf, STREAM[s] + from, len, "%c: the bytes given back differ",
				 side_name(s));
	cr_assert_leq(P[s].back_seq, TXO[s]); /* the rest never went over the QP */
}

Test(proto, back_returns_exactly_what_was_not_read)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 1000, 0);
	put_all(SB, 700, 0);
	pump();
	cr_assert_eq(get(SB, 300, 0), 300);
	const uint8_t *pre[2] = {NULL, NULL};
	size_t pl[2] = {0, 0};
	back_exchange(SA, pre, pl);
	check_owed(SA, 300); /* B read 300 of A's 1000 */
	check_owed(SB, 0);   /* A read nothing of B's */
	cr_assert_eq(P[SA].peer_back_x, 300);
	cr_assert_eq(P[SB].back_x, 300);
	/* Neither side delivers anything more from the QP. */
	uint8_t b[16];
	struct iovec iov = {b, sizeof(b)};
	cr_assert_eq(sv_proto_recv(&P[SA], &iov, 1, 0, NOW), -EAGAIN);
	cr_assert_eq(sv_proto_recv(&P[SB], &iov, 1, 0, NOW), -EAGAIN);
	cr_assert_eq(sv_proto_readable(&P[SB]), 0);
	/* And sending over the QP is over. */
	struct iovec w = {b, 1};
	cr_assert_eq(sv_proto_send(&P[SA], &w, 1, 0, NOW), -EINVAL);
	check_quiescent();
	/* Writing the owed bytes on TCP empties the owed buffer. */
	sv_proto_owed_consume(&P[SA], 700);
	const void *ob;
	size_t ol;
	sv_proto_owed(&P[SA], &ob, &ol);
	cr_assert_eq(ol, 0);
}

/* The buffer a read emptied last goes back with the BACK, its credit on
 * it: after the BACK nothing else may come to report it. */
Test(proto, back_reposts_the_held_buffer)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 100, 0);
	pump();
	cr_assert_eq(get(SB, 100, 0), 100);
	cr_assert(P[SB].rx_held >= 0, "the read's buffer is held");
	uint32_t posted = fake_posted(&FP.ep[SB]);
	cr_assert_eq(sv_proto_send_back(&P[SB], NULL, 0, NOW), 0);
	cr_assert_eq(P[SB].rx_held, -1);
	cr_assert_eq(fake_posted(&FP.ep[SB]), posted + 1, "the BACK reposted it");
	const struct fake_msg *m = last_of(SB);
	cr_assert_eq(m->h.type, SV_MSG_BACK);
	cr_assert_eq(m->h.credits, 1, "the BACK carries its credit");
}

/* Data the peer sent before it saw our BACK is given back too, and the
 * coalescing buffer goes out before the BACK. */
Test(proto, back_returns_data_in_flight_and_flushes_coalesced)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 500, 0); /* on its way to B, not delivered */
	put_all(SB, 5, 0);   /* idle: goes at once */
	put_all(SB, 7, 0);   /* held for coalescing behind the first */
	cr_assert_geq(P[SB].pending_slot, 0);
	const uint8_t *pre[2] = {NULL, NULL};
	size_t pl[2] = {0, 0};
	back_exchange(SB, pre, pl);
	cr_assert_eq(P[SB].back_seq, 12, "the coalesced bytes went before the BACK");
	check_owed(SA, 0);
	check_owed(SB, 0);
	check_quiescent();
}

/* Bytes the receiver read from TCP before the switch point but the
 * application did not consume go back first, then the QP's. */
Test(proto, back_returns_tcp_prefix_first)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	TXO[SA] = 100; /* TCP carried A's first 100 bytes */
	open_both();
	put_all(SA, 50, 0);
	pump();
	/* B's application read 40 of the TCP bytes: 60 sit in B's TCP buffer. */
	RXO[SB] = 40;
	const uint8_t *pre[2] = {NULL, STREAM[SA] + 40};
	size_t pl[2] = {0, 60};
	back_exchange(SB, pre, pl);
	cr_assert_eq(P[SB].back_x, 40);
	check_owed(SA, 40);
	check_quiescent();
}

/* After the peer's FIN, the bytes before it still come back. */
Test(proto, back_after_fin)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 200, 0);
	cr_assert_eq(sv_proto_send_fin(&P[SA], NOW), 0);
	pump();
	cr_assert_eq(get(SB, 50, 0), 50);
	const uint8_t *pre[2] = {NULL, NULL};
	size_t pl[2] = {0, 0};
	back_exchange(SB, pre, pl);
	check_owed(SA, 50);
	check_owed(SB, 0);
	check_quiescent();
}

/* Two full windows, nothing read on either side: the returns need the
 * credits the other side's returns free, and the exchange still finishes. */
ParameterizedTestParameters(proto, back_full_windows)
{
	static uint32_t windows[] = {2, 3, 4, 8};
	return cr_make_param_array(uint32_t, windows, sizeof(windows) / sizeof(windows[0]));
}

ParameterizedTest(uint32_t *w, proto, back_full_windows)
{
	struct sv_proto_params prm = prm_default();
	prm.window = *w;
	prm.ack_delay = *w;
	conn_up(&prm);
	open_both();
	/* Fill both windows: nothing more can go until something is read. */
	for (int k = 0; k < 3; k++) {
		for (int s = 0; s < 2; s++)
			while (put(s, PAYLOAD_MAX(), 0) > 0)
				;
		pump();
	}
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(put(s, PAYLOAD_MAX(), 0), -EAGAIN, "%c: the window is full",
			     side_name(s));
		cr_assert_eq(P[1 - s].rxq_count, *w, "%c holds a window of unread data",
			     side_name(1 - s));
		/* A small write is collected: it never goes over the QP, but
		 * follows the returned bytes on TCP. */
		put_all(s, 3, 0);
		cr_assert_eq(P[s].pending_len, 3);
	}
	const uint8_t *pre[2] = {NULL, NULL};
	size_t pl[2] = {0, 0};
	back_exchange(SA, pre, pl);
	check_owed(SA, 0);
	check_owed(SB, 0);
	/* A's 3 bytes follow its returns on TCP; B's went over the QP with
	 * the credits A's BACK gave back. */
	cr_assert_eq(P[SA].back_seq, TXO[SA] - 3);
	cr_assert_eq(P[SB].back_seq, TXO[SB]);
	check_quiescent();
}

/* Both sides start at once: each BACK answers the other. */
Test(proto, back_simultaneous)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 300, 0);
	put_all(SB, 400, 0);
	pump();
	cr_assert_eq(get(SA, 100, 0), 100);
	cr_assert_eq(sv_proto_send_back(&P[SA], NULL, 0, NOW), 0);
	cr_assert_eq(sv_proto_send_back(&P[SB], NULL, 0, NOW), 0);
	pump();
	cr_assert_not(sv_proto_back_wanted(&P[SA]));
	cr_assert_not(sv_proto_back_wanted(&P[SB]));
	for (int i = 0; i < 100 && !(sv_proto_back_done(&P[SA]) && sv_proto_back_done(&P[SB])); i++) {
		for (int s = 0; s < 2; s++) {
			int r = sv_proto_send_returns(&P[s], NOW);
			cr_assert(r == 0 || r == -EAGAIN, "%c: returns: %d", side_name(s), r);
		}
		pump();
	}
	cr_assert(sv_proto_back_done(&P[SA]) && sv_proto_back_done(&P[SB]));
	check_owed(SA, 0);
	check_owed(SB, 100);
	check_quiescent();
}

/* BACK is refused where it cannot keep the stream whole. */
Test(proto, back_refused_off_the_qp)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	cr_assert_eq(sv_proto_send_back(&P[SA], NULL, 0, NOW), -EINVAL, "both on TCP");
	open_both();
	cr_assert_eq(sv_proto_send_to_tcp(&P[SA], NOW), 0);
	cr_assert_eq(sv_proto_send_back(&P[SA], NULL, 0, NOW), -EINVAL, "sending on TCP");
	uint8_t b[4] = {0};
	cr_assert_eq(sv_proto_send_back(&P[SB], b, 4, NOW), -EINVAL, "prefix beyond what arrived");
	check_clean();
}

/* Malformed BACK/RETURN messages reset the connection. */
enum bad_back { BB_RETURN_FIRST, BB_BACK_NO_PAYLOAD, BB_BACK_X_AHEAD, BB_DATA_AFTER_BACK,
		BB_RETURN_SEQ, BB_RETURN_BEYOND, BB_BACK_TWICE };

ParameterizedTestParameters(proto, back_malformed)
{
	static int cases[] = {BB_RETURN_FIRST, BB_BACK_NO_PAYLOAD, BB_BACK_X_AHEAD,
			      BB_DATA_AFTER_BACK, BB_RETURN_SEQ, BB_RETURN_BEYOND, BB_BACK_TWICE};
	return cr_make_param_array(int, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(int *kind, proto, back_malformed)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 10, 0);
	put_all(SB, 20, 0);
	pump();
	uint8_t pl[32]; /* the longest payload below is 21 bytes */
	memset(pl, 0, sizeof(pl));
	struct sv_hdr h = {.type = SV_MSG_BACK, .len = 8, .seq = P[SB].rcv_nxt, .ack = P[SB].snd_nxt};
	uint32_t plen = 8;
	bool valid_back_first = false;
	switch (*kind) {
	case BB_RETURN_FIRST:
		h.type = SV_MSG_RETURN;
		h.len = plen = 4;
		h.seq = 0;
		break;
	case BB_BACK_NO_PAYLOAD:
		h.len = plen = 0;
		break;
	case BB_BACK_X_AHEAD:
		pl[0] = 21; /* B only sent 20 */
		break;
	case BB_DATA_AFTER_BACK:
	case BB_BACK_TWICE:
		valid_back_first = true;
		break;
	case BB_RETURN_SEQ:
	case BB_RETURN_BEYOND:
		/* B sends its BACK, then A's (valid) BACK arrives, then a bad RETURN. */
		cr_assert_eq(sv_proto_send_back(&P[SB], NULL, 0, NOW), 0);
		valid_back_first = true;
		break;
	}
	if (valid_back_first) {
		struct sv_hdr b = h;
		cr_assert_eq(fake_inject_msg(&FP.ep[SB], &b, pl, 8, SV_HDR_SIZE + 8), 0);
		int r0 = fake_poll(&FP.ep[SB], &P[SB], NOW);
		cr_assert_geq(r0, 0, "a valid BACK was refused: %d", r0);
		cr_assert(P[SB].peer_back);
		h = (struct sv_hdr){.type = SV_MSG_DATA, .len = 4, .seq = P[SB].rcv_nxt,
				    .ack = P[SB].snd_nxt};
		plen = 4;
		if (*kind == BB_BACK_TWICE) {
			h.type = SV_MSG_BACK;
			h.len = plen = 8;
		} else if (*kind == BB_RETURN_SEQ) {
			h.type = SV_MSG_RETURN;
			h.seq = 1; /* A consumed 0: returns start at 0 */
		} else if (*kind == BB_RETURN_BEYOND) {
			h.type = SV_MSG_RETURN;
			h.seq = 0;
			h.len = plen = 21; /* B sent 20 */
		}
	}
	cr_assert_eq(fake_inject_msg(&FP.ep[SB], &h, pl, plen, SV_HDR_SIZE + plen), 0);
	int r = fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(r, -ECONNRESET, "case %d: got %d", *kind, r);
	cr_assert_eq(P[SB].error, -ECONNRESET);
}

/* ---- Buffers that grow -------------------------------------------------------- */

/* Buffers of 1 KiB payload at first, growing to 8 KiB. */
static struct sv_proto_params prm_grow(void)
{
	struct sv_proto_params p = prm_coalesce();
	p.buf_size = 8192 + SV_HDR_SIZE;
	p.start_size = 1024 + SV_HDR_SIZE;
	p.coalesce_size = 8192;
	return p;
}

/* Like conn_up, with buffers that start small and grow (the peers learn
 * the start size from the set-up); each side with its own parameters (the
 * window and buffer size must agree), so one may have buffers that never
 * grow. */
static void conn_up_grow2(const struct sv_proto_params *pa, const struct sv_proto_params *pb,
			  bool refuse)
{
	const struct sv_proto_params *pp[2] = {pa, pb};
	PRM = *pa;
	uint32_t nr = sv_proto_nrecv(pa), ns = sv_proto_nsend(pa);
	cr_assert_eq(fake_pair_init(&FP, nr, ns, pa->buf_size), 0);
	FP_UP = true;
	for (int s = 0; s < 2; s++) {
		if (sv_proto_start_size(pp[s]) < pp[s]->buf_size)
			fake_ep_grows(&FP.ep[s], sv_proto_start_size(pp[s]));
		FP.ep[s].refuse_grow = refuse;
		struct sv_xport x = fake_xport(&FP.ep[s]);
		cr_assert_eq(sv_proto_init(&P[s], pp[s], &x), 0);
		P_UP[s] = true;
	}
	for (int s = 0; s < 2; s++)
		cr_assert_eq(sv_proto_set_peer(&P[s], nr, sv_proto_start_size(pp[1 - s])), 0);
	open_both();
}

static void conn_up_grow(const struct sv_proto_params *prm, bool refuse)
{
	conn_up_grow2(prm, prm, refuse);
}

/* The largest DATA payload side s sent among its messages [from, to). */
static uint32_t max_data(int s, size_t from, size_t to)
{
	uint32_t m = 0;
	for (size_t i = from; i < to; i++) {
		const struct fake_msg *x = msg_of(s, i);
		if (x->h.type == SV_MSG_DATA && x->h.len > m)
			m = x->h.len;
	}
	return m;
}

/* A writes `n` times `len` bytes, B reading after each write; then both
 * settle. */
static void a_writes_b_reads(int n, size_t len)
{
	for (int i = 0; i < n; i++) {
		put_all(SA, len, 0);
		pump();
		drain(SB);
		pump();
	}
	settle(1000, 50);
}

/* Bulk: after a few full messages the receiver's buffers grow, the header
 * says so, the sender's buffers follow and its messages fill the new size;
 * every message fits the buffer it lands in (the fake checks each). */
Test(proto, bulk_grows_the_buffers)
{
	struct sv_proto_params prm = prm_grow();
	conn_up_grow(&prm, false);
	cr_assert_not(P[SB].st.rx_grown);
	cr_assert_not(P[SA].st.tx_grown);
	a_writes_b_reads(32, 4096);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert(P[SB].st.rx_grown, "B's receive buffers did not grow");
	cr_assert(P[SA].st.tx_grown, "A's send buffers did not follow");
	cr_assert_not(P[SA].st.rx_grown, "A received no data: its buffers stay small");
	cr_assert_eq(max_data(SA, 0, 6), 1024, "the first messages fill the small buffers");
	size_t n = fake_count(&FP.ep[SA], 0);
	cr_assert_eq(max_data(SA, n / 2, n), 8192, "later ones fill the grown buffers");
	bool coded = false;
	for (size_t i = 0; i < fake_count(&FP.ep[SB], 0); i++)
		coded |= msg_of(SB, i)->h.flags == 13;
	cr_assert(coded, "B's reports never named its 8 KiB buffers (size code 13)");
	check_clean();
}

/* Requests and answers that each end in a part-filled message never
 * grow anything. */
Test(proto, request_response_stays_small)
{
	struct sv_proto_params prm = prm_grow();
	conn_up_grow(&prm, false);
	for (int i = 0; i < 100; i++) {
		put_all(SA, 1500, 0); /* a full message and a tail */
		pump();
		drain(SB);
		put_all(SB, 700, 0);
		pump();
		drain(SA);
		pump();
	}
	settle(1000, 20);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(RXO[SA], TXO[SB]);
	for (int s = 0; s < 2; s++)
		cr_assert(!P[s].st.rx_grown && !P[s].st.tx_grown, "%c grew", side_name(s));
	cr_assert_eq(FP.ep[SA].grows + FP.ep[SB].grows, 0);
	check_clean();
}

/* No locked memory for growth: the buffers stay small, nothing is lost. */
Test(proto, refused_growth_stays_small)
{
	struct sv_proto_params prm = prm_grow();
	conn_up_grow(&prm, true);
	a_writes_b_reads(16, 8192);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_not(P[SB].st.rx_grown);
	cr_assert_gt(P[SB].st.grow_refused, 0);
	cr_assert_eq(max_data(SA, 0, fake_count(&FP.ep[SA], 0)), 1024);
	check_clean();
}

/* A reader that does not read: its small buffers' messages move to memory
 * of their own and their credits go back, so a writer puts out as much
 * ahead of it as the grown buffers would hold, then the window closes. */
Test(proto, lagging_reader_stashes_up_to_the_window)
{
	struct sv_proto_params prm = prm_grow();
	prm.coalesce = false;
	conn_up_grow(&prm, true); /* no growth: all of it through small buffers */
	size_t limit = (size_t)prm.window * 8192;
	long r;
	while ((r = put(SA, 1024, 0)) > 0)
		pump();
	cr_assert_eq(r, -EAGAIN);
	cr_assert_geq(TXO[SA], limit, "A could write only %llu bytes ahead of B",
		      (unsigned long long)TXO[SA]);
	cr_assert_leq(P[SB].stashed, limit);
	cr_assert_gt(P[SB].stashed, 0);
	settle(1000, 200);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(P[SB].stashed, 0);
	check_clean();
}

/* A report of buffers smaller than the last one, or with a size code out
 * of range, is malformed: the connection resets. */
static void inject_update(int s, uint8_t code, uint16_t credits)
{
	struct sv_hdr h = {.type = SV_MSG_UPDATE, .flags = code, .credits = credits,
			   .ack = P[s].snd_una};
	cr_assert_eq(fake_inject_msg(&FP.ep[s], &h, NULL, 0, SV_HDR_SIZE), 0);
	fake_poll(&FP.ep[s], &P[s], NOW);
}

Test(proto, buffer_size_codes_are_checked)
{
	struct sv_proto_params prm = prm_grow();
	conn_up_grow(&prm, false);
	put_all(SA, 100, 0); /* a credit spent, so B can report one */
	pump();
	inject_update(SA, 12, 0);
	cr_assert_eq(P[SA].error, 0, "a size with no credits is only checked for range");
	inject_update(SA, 9, 0);
	cr_assert_eq(P[SA].error, -ECONNRESET, "size code 9 is out of range");
}

Test(proto, smaller_buffers_after_larger_are_malformed)
{
	struct sv_proto_params prm = prm_grow();
	conn_up_grow(&prm, false);
	put_all(SA, 100, 0);
	put_all(SA, 100, MSG_MORE);
	pump();
	inject_update(SA, 13, 1);
	cr_assert_eq(P[SA].error, 0);
	cr_assert_eq(P[SA].runs[(P[SA].run_head + P[SA].run_count - 1) % SV_RUNS].cap, 8192);
	inject_update(SA, 0, 1); /* back to the set-up's 1 KiB */
	cr_assert_eq(P[SA].error, -ECONNRESET);
}

/* ---- Grown buffers given back (DRAIN) ------------------------------------------ */

#define IDLE_US 100000u

/* The clock moves on by `us` in steps of 1 ms; each step fires both
 * sides' timers and delivers what they sent. */
static void idle_for(uint64_t us)
{
	for (uint64_t t = 0; t < us; t += 1000) {
		NOW += 1000;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
	}
}

/* B's receive buffers at buf_size, posted or holding a message, as the
 * fake transport sees them. */
static uint32_t b_large_buffers(void)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < FP.ep[SB].nrecv; i++)
		n += FP.ep[SB].rsize[i] == FP.ep[SB].buf_size;
	return n;
}

static void grown_then_idle(struct sv_proto_params *prm)
{
	prm->idle_us = IDLE_US;
	conn_up_grow(prm, false);
	a_writes_b_reads(32, 4096);
	cr_assert(P[SB].st.rx_grown && P[SA].st.tx_grown, "the bulk did not grow the buffers");
	cr_assert_gt(b_large_buffers(), 0);
}

/* A direction that goes idle gives the receiver's grown buffers back:
 * the sender spends them with DRAINs, the receiver posts small ones and
 * frees the large ones once none is posted, the sender's send buffers
 * follow. Every message fits the buffer it lands in (the fake checks
 * each), and the next bulk grows them again. */
Test(proto, idle_gives_grown_buffers_back)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	idle_for(IDLE_US / 2);
	cr_assert_eq(P[SA].st.drains_sent, 0, "drained before the direction was idle");
	idle_for(2 * IDLE_US);
	cr_assert_gt(P[SA].st.drains_sent, 0);
	cr_assert_eq(b_large_buffers(), 0, "B still has %u large buffers", b_large_buffers());
	cr_assert_eq(P[SB].st.rx_shrinks, 1);
	cr_assert_eq(FP.ep[SB].shrinks, 1, "B's transport was not told to free them");
	cr_assert_not(P[SB].st.rx_grown);
	cr_assert_eq(P[SA].st.tx_shrinks, 1, "A's send buffers stayed large");
	cr_assert_eq(FP.ep[SA].shrinks, 1);
	cr_assert_eq(P[SA].drain, SV_DRAIN_NONE);
	cr_assert_leq(P[SA].st.drains_sent, 2 * nrecv_of(SB), "%llu DRAINs",
		      (unsigned long long)P[SA].st.drains_sent);
	check_quiescent();
	/* Quiet from now on: nothing more is sent. */
	size_t before = fake_count(&FP.ep[SA], 0) + fake_count(&FP.ep[SB], 0);
	idle_for(3 * IDLE_US);
	cr_assert_eq(fake_count(&FP.ep[SA], 0) + fake_count(&FP.ep[SB], 0), before);

	/* Bulk again: they grow again, and are given back again. */
	size_t from = fake_count(&FP.ep[SA], 0);
	a_writes_b_reads(32, 4096);
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert(P[SB].st.rx_grown);
	cr_assert_eq(P[SB].st.rx_grows, 2);
	cr_assert_eq(max_data(SA, from, fake_count(&FP.ep[SA], 0)), 8192);
	idle_for(3 * IDLE_US);
	cr_assert_eq(P[SB].st.rx_shrinks, 2);
	cr_assert_eq(P[SA].st.tx_shrinks, 2);
	check_quiescent();
}

/* A direction that keeps sending keeps its peer's large buffers. */
Test(proto, a_busy_direction_keeps_its_buffers)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	for (int i = 0; i < 20; i++) {
		put_all(SA, 8192, 0);
		pump();
		drain(SB);
		idle_for(IDLE_US / 4);
	}
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(P[SA].st.drains_sent, 0);
	cr_assert(P[SB].st.rx_grown);
	check_clean();
}

/* B's delayed reports arrive, then A's idle timer fires (its first look
 * only starts it) until A drains; with b_too, B's timers fire at each
 * step as well. What A sent is not delivered. */
static void a_starts_draining(bool b_too)
{
	idle_for(20000);
	for (int i = 0; i < 3 && P[SA].drain == SV_DRAIN_NONE; i++) {
		NOW += 2 * IDLE_US;
		sv_proto_timers(&P[SA], NOW);
		if (b_too)
			sv_proto_timers(&P[SB], NOW);
	}
	cr_assert_eq(P[SA].drain, SV_DRAIN_ASKED, "the drain did not start");
	cr_assert_gt(P[SA].st.drains_sent, 0);
}

/* Writes while the drain is under way, small (coalesced) and large: each
 * message fits whichever of the peer's buffers it lands in, and every byte
 * arrives in order. */
ParameterizedTestParameters(proto, writes_during_the_drain)
{
	static size_t sizes[] = {100, 900, 3000, 20000};
	return cr_make_param_array(size_t, sizes, sizeof(sizes) / sizeof(sizes[0]));
}

ParameterizedTest(size_t *len, proto, writes_during_the_drain)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	/* The drain starts, A spends what credits it has on DRAINs, and
	 * then writes. */
	a_starts_draining(false);
	/* Held back (MSG_MORE) while the DRAINs spend the large credits, the
	 * first write's bytes go when the next write comes. */
	for (int i = 0; i < 8; i++) {
		long r = put(SA, *len, i == 0 ? MSG_MORE : 0);
		cr_assert(r > 0 || r == -EAGAIN, "send: %ld", r);
		pump();
		drain(SB);
		pump();
	}
	settle(1000, 500);
	cr_assert_eq(RXO[SB], TXO[SA]);
	idle_for(3 * IDLE_US);
	cr_assert_eq(P[SA].drain, SV_DRAIN_NONE);
	check_quiescent();
}

/* A corked buffer waits: the direction is not idle while it holds bytes. */
Test(proto, held_bytes_put_the_drain_off)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	put_all(SA, 100, MSG_MORE);
	idle_for(3 * IDLE_US);
	cr_assert_eq(P[SA].st.drains_sent, 0, "drained with bytes held");
	cr_assert_eq(sv_proto_flush(&P[SA], SV_FLUSH_CLOSE, NOW), 0);
	pump();
	drain(SB);
	idle_for(3 * IDLE_US);
	cr_assert_gt(P[SA].st.drains_sent, 0);
	cr_assert_eq(b_large_buffers(), 0);
	cr_assert_eq(RXO[SB], TXO[SA]);
	check_quiescent();
}

/* idle_us 0: never given back. */
Test(proto, no_idle_time_keeps_grown_buffers)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	P[SA].prm.idle_us = P[SB].prm.idle_us = 0;
	P[SA].idle_deadline = P[SB].idle_deadline = 0;
	P[SA].idle_lazy = P[SB].idle_lazy = false;
	idle_for(3 * IDLE_US);
	cr_assert_eq(P[SA].st.drains_sent, 0);
	cr_assert(P[SB].st.rx_grown);
	check_clean();
}

/* A DRAIN to buffers that never grew is only a spent buffer. */
Test(proto, drain_to_small_buffers_changes_nothing)
{
	struct sv_proto_params prm = prm_grow();
	prm.idle_us = IDLE_US;
	conn_up_grow(&prm, false);
	struct sv_hdr h = {.type = SV_MSG_DRAIN, .ack = P[SB].snd_una, .seq = P[SB].rcv_nxt};
	cr_assert_eq(fake_inject_msg(&FP.ep[SB], &h, NULL, 0, SV_HDR_SIZE), 0);
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(P[SB].error, 0);
	cr_assert_not(P[SB].rx_shrink_wanted);
	cr_assert_eq(P[SB].st.rx_shrinks, 0);
}

/* ---- Growth and DRAIN at random, and their edges ------------------------------------ */

static void drain_conservation(void)
{
	for (int s = 0; s < 2; s++) {
		int o = 1 - s;
		uint32_t held = P[o].rx_held >= 0;
		uint32_t inbuf = P[o].rxq_count - P[o].stashed_msgs;
		cr_assert_eq(P[s].credits + P[o].unreported + inbuf + held, nrecv_of(o),
			     "%c credits %u + %c unreported %u + unread %u + held %u != %u", side_name(s),
			     P[s].credits, side_name(o), P[o].unreported, inbuf, held, nrecv_of(o));
		cr_assert_eq(P[o].peer_credits, P[s].credits);
	}
}

static uint32_t large_buffers(int s)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < FP.ep[s].nrecv; i++)
		n += FP.ep[s].rsize[i] == FP.ep[s].buf_size;
	return n;
}

ParameterizedTestParameters(proto, soak_with_growth_and_drains)
{
	static uint32_t seeds[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	return cr_make_param_array(uint32_t, seeds, sizeof(seeds) / sizeof(seeds[0]));
}

ParameterizedTest(uint32_t *seed, proto, soak_with_growth_and_drains)
{
	struct sv_proto_params prm = prm_grow();
	prm.idle_us = 3000;
	prm.ack_timeout_us = 300;
	prm.coalesce_timeout_us = 200;
	prm.coalesce = *seed % 3 != 0;
	prm.window = 2 + *seed % 7;
	if (*seed % 4 == 1)
		prm.zcopy_threshold = 5000;
	conn_up_grow(&prm, false);
	RNG = 0x243F6A8885A308D3ull ^ ((uint64_t)*seed * 0x9E3779B97F4A7C15ull);
	uint64_t tmax = 16 * prm.ack_timeout_us;
	for (uint32_t step = 0; step < 40000; step++) {
		uint32_t phase = (step / 700) % 4;
		int s = (int)rnd_below(2);
		if (phase == 2)
			s = SA;
		uint32_t op = rnd_below(100);
		if (op < 30) {
			if (phase == 0 || (phase == 2 && s == SA))
				soak_write(s);
			else if (phase == 3 && rnd_below(20) == 0)
				soak_write(s);
		} else if (op < 60) {
			if (!(phase == 1 && s == SB && rnd_below(3)))
				soak_read(s);
		} else {
			soak_io(s, op, 2 * prm.idle_us, step);
		}
		for (int k = 0; k < 2; k++)
			cr_assert_eq(FP.ep[k].violations, 0, "seed %u step %u: %c: %s", *seed, step,
				     side_name(k), FP.ep[k].why);
		check_clean();
		if (!fake_pending_recvs(&FP.ep[SA]) && !fake_pending_recvs(&FP.ep[SB]))
			drain_conservation();
	}
	for (int round = 0; round < 200; round++) {
		for (int k = 0; k < 2; k++) {
			FP.ep[k].hold_send_done = false;
			fake_release_sends(&FP.ep[k], SIZE_MAX);
		}
		pump();
		drain(SA);
		drain(SB);
		pump();
		NOW += round < 100 ? tmax + 1 : prm.idle_us;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
	}
	cr_assert_eq(RXO[SB], TXO[SA]);
	cr_assert_eq(RXO[SA], TXO[SB]);
	pump();
	drain_conservation();
	uint64_t drains = P[SA].st.drains_sent + P[SB].st.drains_sent;
	cr_assert_gt(drains, 0, "seed %u: no DRAIN: the soak never went idle", *seed);
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(P[s].drain, SV_DRAIN_NONE,
			     "seed %u: %c stuck in drain state %d (left %u, credits %u, runs %u); peer unreported %u held %d",
			     *seed, side_name(s), P[s].drain, P[s].drain_left, P[s].credits, P[s].run_count,
			     P[1 - s].unreported, P[1 - s].rx_held);
		cr_assert_eq(large_buffers(s), 0, "seed %u: %c still has %u large receive buffers (rx_big_count %u, grown %d, shrink_wanted %d)",
			     *seed, side_name(s), large_buffers(s), P[s].rx_big_count, P[s].st.rx_grown, P[s].rx_shrink_wanted);
		cr_assert_eq(P[s].rx_big_count, 0);
	}
}

/* A sender whose buffers never grow (fixed at buf_size) drains a
 * growable peer: its own send buffers were never grown, so shrink(send)
 * must not be called. */
Test(proto, a_fixed_sender_never_shrinks)
{
	struct sv_proto_params pa = prm_grow(), pb = prm_grow();
	pa.start_size = 0; /* fixed */
	pa.idle_us = pb.idle_us = IDLE_US;
	conn_up_grow2(&pa, &pb, false);
	a_writes_b_reads(32, 4096);
	cr_assert(P[SB].st.rx_grown);
	idle_for(3 * IDLE_US);
	cr_assert_eq(FP.ep[SA].shrinks, 0);
}

/* A broken core has no next deadline: its idle timer (armed while it
 * was busy) would have a waiter wake for nothing, over and over. */
Test(proto, no_deadline_after_an_error)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	(void)sv_proto_next_deadline(&P[SA], NOW);
	cr_assert(P[SA].idle_deadline || P[SA].idle_lazy);
	sv_proto_abort(&P[SA], -ECONNRESET);
	NOW += 2 * IDLE_US;
	sv_proto_timers(&P[SA], NOW);
	uint64_t d = sv_proto_next_deadline(&P[SA], NOW);
	cr_assert(d == 0 || d > NOW, "after an error the next deadline is %llu, now is %llu: a waiter spins",
		  (unsigned long long)d, (unsigned long long)NOW);
}

/* In ASKED, a smaller non-zero size code (not the set-up's) is a
 * report the protocol does not allow (docs: "the one smaller size ... flags 0"). */
Test(proto, only_the_setup_size_after_a_drain)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	a_starts_draining(false);
	/* B's buffers are 8 KiB (code 13); report 4 KiB (code 12). */
	struct sv_hdr h = {.type = SV_MSG_UPDATE, .flags = 12, .credits = 1, .ack = P[SA].snd_nxt, .seq = P[SA].rcv_nxt};
	cr_assert_eq(fake_inject_msg(&FP.ep[SA], &h, NULL, 0, SV_HDR_SIZE), 0);
	fake_poll(&FP.ep[SA], &P[SA], NOW);
	cr_assert_eq(P[SA].error, -ECONNRESET, "a 4 KiB report after 8 KiB ones was taken");
}

/* After the QP's normal end (peer's FIN, then the flush) our
 * sending moved to TCP (sv_proto_tx_lost_qp): no DRAIN should be posted on
 * the ended QP. */
Test(proto, no_drain_after_the_qp_ended)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	cr_assert_eq(sv_proto_send_fin(&P[SB], NOW), 0);
	pump();
	cr_assert(P[SA].rx_fin);
	cr_assert(sv_proto_peer_ended(&P[SA]));
	const void *b;
	size_t l;
	cr_assert_eq(sv_proto_tx_lost_qp(&P[SA], &b, &l), 0);
	cr_assert_eq(P[SA].tx_state, SV_TX_TCP);
	size_t before = fake_count(&FP.ep[SA], SV_MSG_DRAIN);
	NOW += 3 * IDLE_US;
	sv_proto_timers(&P[SA], NOW);
	NOW += 3 * IDLE_US;
	sv_proto_timers(&P[SA], NOW);
	size_t after = fake_count(&FP.ep[SA], SV_MSG_DRAIN);
	cr_assert_eq(after, before);
}

/* A growable sender facing a peer whose buffers are large from the
 * set-up (fixed at buf_size): its send buffers should follow the peer's
 * size (a report larger than our start size grows them). */
Test(proto, a_sender_follows_a_fixed_large_peer)
{
	struct sv_proto_params pa = prm_grow(), pb = prm_grow();
	pb.start_size = 0; /* B fixed at 8 KiB */
	conn_up_grow2(&pa, &pb, false);
	a_writes_b_reads(32, 4096);
	size_t n = fake_count(&FP.ep[SA], 0);
	cr_assert(P[SA].st.tx_grown, "A's send buffers stayed at 1 KiB facing 8 KiB receive buffers");
	cr_assert_eq(max_data(SA, n / 2, n), 8192);
}

/* BACK in the middle of a drain, either side first; data unread
 * in B's large buffers goes back. */
ParameterizedTestParameters(proto, back_during_a_drain)
{
	static int firsts[] = {0, 1};
	return cr_make_param_array(int, firsts, 2);
}
ParameterizedTest(int *first, proto, back_during_a_drain)
{
	struct sv_proto_params prm = prm_grow();
	grown_then_idle(&prm);
	idle_for(20000);
	put_all(SA, 8192, 0); /* one large message B leaves unread */
	pump();
	put_all(SB, 10, 0); /* its ack rides on B's data */
	pump();
	drain(SA);
	pump();
	a_starts_draining(true);
	/* Part of the DRAINs delivered only. */
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	const uint8_t *pre[2] = {NULL, NULL};
	size_t pl[2] = {0, 0};
	back_exchange(*first, pre, pl);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(FP.ep[k].violations, 0, "%c: %s", side_name(k), FP.ep[k].why);
}

/* A writer blocked on a closed window (its reader paused longer
 * than idle_us) is not idle: does the drain start anyway? */
Test(proto, a_blocked_writer_is_not_idle)
{
	struct sv_proto_params prm = prm_grow();
	prm.coalesce = false;
	grown_then_idle(&prm);
	/* A writes until the window closes; B does not read. */
	for (int i = 0; i < 64; i++) {
		long r = put(SA, 8192, 0);
		pump();
		if (r == -EAGAIN)
			break;
	}
	/* Until the stash is full and the window shut. */
	for (int quiet = 0, i = 0; quiet < 5 && i < 1000; i++) {
		NOW += 20000;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
		quiet = put(SA, 8192, 0) == -EAGAIN ? quiet + 1 : 0;
		pump();
	}
	cr_assert_eq(P[SA].st.drains_sent, 0);
	/* The reader pauses for 3 idle times; A's app keeps trying to write. */
	for (int i = 0; i < 30; i++) {
		NOW += IDLE_US / 10;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
		put_all(SB, 10, 0); /* B's application answers something meanwhile */
		pump();
		drain(SA);
		pump();
		long r = put(SA, 8192, 0);
		cr_assert_eq(r, -EAGAIN);
	}
	size_t from = fake_count(&FP.ep[SA], 0);
	/* The reader reads again; the writer goes on. */
	for (int i = 0; i < 40; i++) {
		drain(SB);
		pump();
		NOW += 1000;
		sv_proto_timers(&P[SA], NOW);
		sv_proto_timers(&P[SB], NOW);
		pump();
		(void)put(SA, 8192, 0);
		pump();
	}
	size_t to = fake_count(&FP.ep[SA], 0);
	unsigned small = 0, big = 0;
	for (size_t i = from; i < to; i++) {
		const struct fake_msg *m = msg_of(SA, i);
		if (m->h.type == SV_MSG_DATA)
			{ if (m->h.len <= 1024) small++; else big++; }
	}
	cr_assert_eq(P[SA].st.drains_sent, 0, "a writer blocked on credits was taken for idle");
}

/* ---- Resuming over TCP (proto_resume.c) ----------------------------------- */

/* A's DATA is in flight (posted, delivered or not, not completed) when the
 * QP is lost: the abort keeps a copy of it, the zero-copy part included,
 * so the application's memory may be reused at once; the peer's count
 * picks where TCP goes on, and nothing outside what was kept is taken. */
Test(proto, a_break_keeps_the_bytes_in_flight)
{
	struct sv_proto_params prm = prm_coalesce();
	prm.zcopy_threshold = 400;
	conn_up(&prm);
	open_both();
	put_all(SA, 100, 0);
	pump(); /* completed: not kept */
	uint64_t from = TXO[SA];
	FP.ep[SA].hold_send_done = true;
	put_all(SA, 150, 0);  /* copied */
	uint8_t *zc = STREAM[SA] + TXO[SA];
	uint8_t saved[700];
	memcpy(saved, zc, sizeof(saved));
	put_all(SA, 700, 0);  /* zero copy: three messages */
	put_all(SA, 20, MSG_MORE); /* coalesced, never sent */
	cr_assert(sv_proto_zcopy_busy(&P[SA]));
	sv_proto_abort(&P[SA], -ECONNRESET);
	cr_assert(P[SA].kept_ok);
	cr_assert_not(sv_proto_zcopy_busy(&P[SA]), "the memory is copied: the write may return");
	memset(zc, 0x5a, sizeof(saved)); /* the application reuses its buffer */
	uint64_t kfrom, kend;
	sv_proto_kept(&P[SA], &kfrom, &kend);
	cr_assert_eq(kfrom, from);
	cr_assert_eq(kend, TXO[SA]);
	memcpy(zc, saved, sizeof(saved));
	cr_assert(sv_proto_resumable(&P[SA]));
	bool fin = true;
	cr_assert_eq(sv_proto_resume_tx(&P[SA], from - 1, &fin), -EPROTO, "a byte not kept");
	cr_assert_eq(sv_proto_resume_tx(&P[SA], kend + 1, &fin), -EPROTO, "a byte never sent");
	/* B received 200 of the kept bytes: TCP carries the rest. */
	cr_assert_eq(sv_proto_resume_tx(&P[SA], from + 200, &fin), 0);
	cr_assert_not(fin);
	const void *buf;
	size_t len;
	sv_proto_owed(&P[SA], &buf, &len);
	cr_assert_eq(len, kend - from - 200);
	cr_assert_eq(memcmp(buf, STREAM[SA] + from + 200, len), 0, "the owed bytes are the stream's");
	cr_assert_eq(sv_proto_tx_state(&P[SA]), SV_TX_TCP);
	cr_assert_not(sv_proto_tx_pending(&P[SA]), "the coalesced bytes are in the owed ones");
	cr_assert_eq(sv_proto_stats(&P[SA])->resent, len);
}

/* Receives that completed before the QP went to the error state carry
 * stream bytes even after the abort: they count until the receive side's
 * QP part is fixed (sv_proto_rx_lost_qp), and none after. */
Test(proto, receives_completed_after_the_abort_still_count)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	put_all(SA, 100, 0);
	pump();
	put_all(SA, 150, 0); /* in B's completion queue, not polled */
	sv_proto_abort(&P[SB], -ECONNRESET);
	fake_poll(&FP.ep[SB], &P[SB], NOW); /* each returns the error, as after any abort */
	uint64_t snd, rcv, read;
	sv_proto_offsets(&P[SB], &snd, &rcv, &read);
	cr_assert_eq(rcv, 250, "a receive completed before the error counts");
	sv_proto_rx_lost_qp(&P[SB]);
	put_all(SA, 50, 0);
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	sv_proto_offsets(&P[SB], &snd, &rcv, &read);
	cr_assert_eq(rcv, 250, "none after the QP part was fixed");
	cr_assert_eq(get(SB, 1000, 0), 250, "what the QP delivered is read");
	cr_assert_not(sv_proto_rx_on_qp(&P[SB]), "then TCP");
}

/* A peer's RESET aborts the connection: it is not a lost QP, and does not
 * resume. */
Test(proto, a_reset_does_not_resume)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	cr_assert(sv_proto_resumable(&P[SB]));
	cr_assert_eq(sv_proto_send_reset(&P[SA]), 0);
	fake_poll(&FP.ep[SB], &P[SB], NOW);
	cr_assert_eq(P[SB].error, -ECONNRESET);
	cr_assert_not(sv_proto_resumable(&P[SB]));
}

/* Coalesced bytes (the write returned their count) whose post fails (the
 * device was removed: rxe's doorbell write gets EIO): the abort keeps them
 * for TCP. */
Test(proto, a_failed_post_keeps_the_coalesced_bytes)
{
	struct sv_proto_params prm = prm_coalesce();
	conn_up(&prm);
	open_both();
	put_all(SA, 100, 0);
	pump();
	put_all(SA, 20, MSG_MORE); /* coalesced: the application was told it is written */
	cr_assert(sv_proto_tx_pending(&P[SA]));
	FP.ep[SA].fail_sends = 1;
	int r = sv_proto_flush(&P[SA], SV_FLUSH_RECV, NOW);
	cr_assert_lt(r, 0);
	cr_assert(P[SA].kept_ok);
	uint64_t kfrom, kend;
	sv_proto_kept(&P[SA], &kfrom, &kend);
	cr_expect_eq(kend, TXO[SA], "kept [%llu, %llu): the application wrote %llu bytes",
		     (unsigned long long)kfrom, (unsigned long long)kend,
		     (unsigned long long)TXO[SA]);
	/* The peer holds 100: resuming from there sends nothing. */
	bool fin;
	cr_assert_eq(sv_proto_resume_tx(&P[SA], 100, &fin), 0);
	const void *buf;
	size_t len;
	sv_proto_owed(&P[SA], &buf, &len);
	cr_expect_eq(len, 20, "owed %zu bytes, 20 were written and never sent", len);
}

/* ---- A hostile peer on the way back ------------------------------------------ */

/* A BACK that claims the peer consumed less of our stream than it can
 * hold unread (here: all our TCP bytes, more than its reads ahead can
 * take) would have us write again, on TCP, bytes it long had: it resets.
 * One that claims a plausible amount is taken. */
/* A's BACK saying it consumed B's stream up to x, `unread` behind what B
 * sent: B takes it when that is at most `bound`, and resets otherwise. */
static void back_x_judged(uint64_t x, uint64_t unread, uint64_t bound)
{
	uint8_t pl[8];
	for (int i = 0; i < 8; i++)
		pl[i] = (uint8_t)(x >> (8 * i));
	struct sv_hdr h = {.type = SV_MSG_BACK, .len = 8, .seq = P[SB].rcv_nxt, .ack = P[SB].snd_nxt};
	cr_assert_eq(fake_inject_msg(&FP.ep[SB], &h, pl, 8, SV_HDR_SIZE + 8), 0);
	int r = fake_poll(&FP.ep[SB], &P[SB], NOW);
	if (unread <= bound) {
		cr_assert_geq(r, 0, "%llu unread: refused (%d)", (unsigned long long)unread, r);
		cr_assert(P[SB].peer_back);
	} else {
		cr_assert_eq(r, -ECONNRESET, "%llu unread: got %d", (unsigned long long)unread, r);
		cr_assert_not(P[SB].peer_back);
	}
}

ParameterizedTestParameters(proto, back_x_bounded)
{
	static uint64_t unread[] = {1000, SV_TCP_AHEAD_DEFAULT, SV_TCP_AHEAD_DEFAULT + 1,
				    SV_TCP_AHEAD_DEFAULT + 1000};
	return cr_make_param_array(uint64_t, unread, sizeof(unread) / sizeof(unread[0]));
}

ParameterizedTest(uint64_t *unread, proto, back_x_bounded)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	TXO[SB] = SV_TCP_AHEAD_DEFAULT + 1000; /* TCP carried that much of B's stream */
	open_both();
	uint64_t x = TXO[SB] - *unread; /* A claims it consumed x of B's bytes */
	back_x_judged(x, *unread, SV_TCP_AHEAD_DEFAULT);
}

/* The QP part of what a peer may give back is bounded by SV_BACK_UNREAD_MAX
 * whatever its buffers: with the most a libsovia peer posts (SV_WINDOW_MAX
 * data buffers), twice its buffers at 2^20 each would be 2 GiB, all of it
 * ours to hold until TCP takes it. B's stream is moved on as if the QP had
 * carried the bytes (the test's streams are 1 MiB). */
ParameterizedTestParameters(proto, back_x_bounded_whatever_the_buffers)
{
	static uint64_t unread[] = {1000, SV_BACK_UNREAD_MAX, SV_BACK_UNREAD_MAX + 1,
				    (uint64_t)SV_BACK_UNREAD_MAX * 4};
	return cr_make_param_array(uint64_t, unread, sizeof(unread) / sizeof(unread[0]));
}

ParameterizedTest(uint64_t *unread, proto, back_x_bounded_whatever_the_buffers)
{
	struct sv_proto_params pa = prm_default(), pb = prm_default();
	pa.window = SV_WINDOW_MAX;
	conn_up2(&pa, &pb);
	open_both();
	cr_assert_eq(P[SB].peer_nrecv, SV_WINDOW_MAX + pa.reserve);
	uint64_t qp_from = P[SB].tx_qp_from;
	uint64_t moved = (uint64_t)SV_BACK_UNREAD_MAX * 4 + 4096;
	P[SB].snd_nxt += moved;
	P[SB].snd_una = P[SB].snd_nxt;
	uint64_t x = qp_from + moved - *unread;
	back_x_judged(x, *unread, SV_BACK_UNREAD_MAX);
}

/* A peer that says it posted more receive buffers than a libsovia can is
 * refused at set-up: each one would widen what it may hold unread. */
Test(proto, a_peer_with_more_buffers_than_libsovia_has_is_refused)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	cr_assert_eq(sv_proto_set_peer(&P[SA], SV_WINDOW_MAX + SV_RESERVE, 4096), 0);
	cr_assert_eq(sv_proto_set_peer(&P[SA], SV_WINDOW_MAX + SV_RESERVE + 1, 4096), -EINVAL);
	cr_assert_eq(sv_proto_set_peer(&P[SA], 65535, 4096), -EINVAL);
}

/* After our BACK, DATA comes only on the credits the peer held when it
 * saw it: one receive buffer each. A peer that sends on regardless would
 * fill the give-back buffer without end: the message past them resets. */
Test(proto, data_after_our_back_bounded)
{
	struct sv_proto_params prm = prm_default();
	conn_up(&prm);
	open_both();
	cr_assert_eq(sv_proto_send_back(&P[SA], NULL, 0, NOW), 0);
	uint32_t n = sv_pr_nrecv(&P[SA]);
	uint8_t pl[16];
	memset(pl, 'x', sizeof(pl));
	for (uint32_t i = 0; i <= n; i++) {
		struct sv_hdr h = {.type = SV_MSG_DATA, .len = sizeof(pl), .seq = P[SA].rcv_nxt,
				   .ack = P[SA].snd_nxt};
		cr_assert_eq(fake_inject_msg(&FP.ep[SA], &h, pl, sizeof(pl),
					     SV_HDR_SIZE + sizeof(pl)), 0);
		int r = fake_poll(&FP.ep[SA], &P[SA], NOW);
		if (i < n) {
			cr_assert_geq(r, 0, "DATA #%u after our BACK refused: %d", i, r);
		} else {
			cr_assert_eq(r, -ECONNRESET, "DATA #%u after our BACK: %d", i, r);
			cr_assert_eq(P[SA].ret_len, (size_t)n * sizeof(pl), "bounded at %u messages", n);
		}
	}
}
