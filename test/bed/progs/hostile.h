/* sovia-hostile: a peer that speaks libsovia's wire and upgrade, but bends
 * one rule at a time (docs/protocol.md: the upgrade in 3, the messages in
 * 2, BACK in 10, the resume record in 11). Shared by its files:
 *
 *   hostile_qp.c      the wire by hand on a queue pair of its own
 *   hostile_client.c  a genuine TCP connection and upgrade, as a libsovia
 *                     client makes them (the challenge echoed on TCP)
 *   hostile_cm.c      floods of requests, garbage private data, the rogue
 *                     listener: rdma_cm without a TCP connection
 *   sovia_hostile.c   the modes and the options
 *
 * It speaks the wire itself rather than through the protocol core: the
 * core keeps the rules an attack must break (it never withholds a buffer,
 * announces a switch it cannot reach or ignores a BACK), and its receive
 * buffers and credits cannot be shared with messages forged beside it. */
#ifndef SOVIA_HOSTILE_H
#define SOVIA_HOSTILE_H

#include "cmdata.h"
#include "proto.h"

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct rdma_cm_id;
struct rdma_cm_event;
struct rdma_event_channel;

/* ---- Output and helpers ---------------------------------------------------- */

/* One line on stdout, flushed (the test reads it while we run). */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t now_ms(void);
/* Byte `off` of the stream the hostile sends: the test makes the same
 * bytes with `sovia-hostile pattern`, to compare what the victim got. */
uint8_t pattern_byte(uint64_t off);
void pattern_fill(uint64_t off, uint8_t *buf, size_t n);

/* A growing byte buffer. */
struct bytes {
	uint8_t *p;
	size_t len, cap;
};
int bytes_add(struct bytes *b, const void *data, size_t n);
void bytes_free(struct bytes *b);

/* Wait (at most ms) for an rdma_cm event on ch: 0 and *out, or -1. */
int cm_wait(struct rdma_event_channel *ch, int ms, struct rdma_cm_event **out);

/* ---- The queue pair (hostile_qp.c) -------------------------------------- */

struct hq_cfg {
	uint32_t nrecv;   /* receive buffers advertised to the peer */
	uint32_t rbuf;    /* their size, header included */
	uint32_t post;    /* how many of them are really posted (withhold: fewer) */
	bool repost;      /* false: a buffer that took a message is never posted again */
	uint32_t nsend;   /* send buffers */
	uint32_t sbuf;    /* their size, header included */
};

/* A received message, with its payload. */
typedef void (*hq_msg_fn)(void *ctx, const struct sv_hdr *h, const uint8_t *payload);

struct hq;

/* Create the QP on `id` (a resolved active id, or a connect request's), its
 * buffers, and post cfg->post receive buffers. NULL on failure (said). */
struct hq *hq_new(struct rdma_cm_id *id, const struct hq_cfg *cfg, hq_msg_fn fn, void *ctx);
void hq_free(struct hq *q);
/* The peer's receive buffers from the private data: our credits. */
void hq_set_peer(struct hq *q, uint32_t nrecv, uint32_t buf_size);

/* Send one message. The header gets flags 0, our unreported buffers as
 * credits and our ack; seq as given. Keeps the credit rules the receiver
 * checks: DATA and RETURN need more than the reserve, TO_RDMA, TO_TCP,
 * FIN and BACK two, anything one, and len fits the peer's oldest buffer.
 * 0, or -EAGAIN (no credit or send buffer), or -errno. */
int hq_send(struct hq *q, uint8_t type, uint64_t seq, const void *payload, uint32_t len);
/* DATA (or RETURN) with as much of buf as the next credit takes: the
 * bytes sent, or -EAGAIN, or -errno. */
long hq_send_bytes(struct hq *q, uint8_t type, uint64_t seq, const void *buf, size_t len);
/* An UPDATE if two or more reposted buffers are unreported. */
void hq_update(struct hq *q);

/* Take every completion: messages go to the callback. The number taken. */
int hq_poll(struct hq *q);
/* Sleep until a completion, one of fds is ready, or ms pass (fds' revents
 * say which). */
void hq_sleep(struct hq *q, struct pollfd *fds, int nfds, int ms);

/* What it saw. */
bool hq_sends_done(const struct hq *q);
int hq_failed(const struct hq *q);      /* a work request's error status, or 0 */
uint64_t hq_ack(const struct hq *q);    /* the peer's stream over the QP: next offset */
uint32_t hq_credits(const struct hq *q);
uint64_t hq_rx_msgs(const struct hq *q);
uint32_t hq_qp_num(const struct hq *q);

/* ---- A genuine client connection (hostile_client.c) ---------------------- */

struct hc {
	int tcp;
	struct sockaddr_storage local, peer;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct hq *q;
	struct sv_cm_req req;
	struct sv_cm_rep rep;
	uint64_t snd_nxt;          /* our stream: bytes sent on TCP and over the QP */
	struct bytes tcp_in;       /* every byte TCP brought */
	bool tcp_eof;
	int tcp_err;               /* errno of a failed read (ECONNRESET: a reset) */
	/* The server's messages. */
	bool srv_switch;           /* its TO_RDMA came */
	uint64_t srv_switch_seq;
	int srv_proven;            /* 1 its echo was right, -1 wrong, 0 not yet */
	struct bytes srv_qp;       /* its DATA over the QP */
	uint64_t srv_back_seq, srv_back_x, returned_to_us;
	bool srv_back, srv_fin, srv_reset, disconnected;
	uint64_t rx_types[SV_MSG_DRAIN + 1];
};

struct hc_opts {
	struct hq_cfg qp;
	int rnr_retry;             /* what our request asks of the server's QP */
	int timeout_ms;            /* for the answer to the request */
};

/* TCP connect to ip:port, then `pre` bytes of our pattern on it. 0 or -1. */
int hc_open(struct hc *c, const char *ip, int port, size_t pre);
/* The upgrade request; 0 accepted, 1 refused (said), -1 failed. */
int hc_request(struct hc *c, const struct hc_opts *o);
/* Our TO_RDMA at seq, and once it completed, the server's challenge on TCP
 * if echo. 0 or -1. */
int hc_switch(struct hc *c, uint64_t seq, bool echo);
/* Wait (at most ms) until the server switched and its echo came. 0 proven,
 * -1 not. */
int hc_wait_proven(struct hc *c, int ms);
/* One round: completions, TCP's bytes, rdma_cm's events, our UPDATE;
 * sleeps up to ms when nothing came. */
void hc_pump(struct hc *c, int ms);
/* Write our pattern bytes [c->snd_nxt, +n) on TCP (blocking). 0 or -1. */
int hc_tcp_write_pattern(struct hc *c, size_t n);
/* Write raw bytes on TCP (blocking). 0 or -1. */
int hc_tcp_write(struct hc *c, const void *buf, size_t n);
/* The server's stream as it reached us: TCP before its switch point, the
 * QP's DATA, then TCP after `skip` more bytes (its echo, a resume record;
 * SIZE_MAX: nothing of TCP after the switch). To a file; -1 on failure. */
int hc_save_stream(const struct hc *c, const char *path, size_t skip);
void hc_close(struct hc *c);

/* ---- rdma_cm alone (hostile_cm.c) ------------------------------------------ */

/* n requests naming 4-tuples nobody accepted (flood), or with random
 * private data (garbage); answers counted for up to wait_s seconds. */
int cm_flood(const char *ip, int port, int n, int wait_s, bool garbage);
/* A listener on ip:port before the real server's: accepts every request
 * with its own challenge (or, with reflect, the client's own) and tells
 * what the client did, for secs seconds. With switch_back it answers the
 * client's TO_RDMA with its own at the same offset, then DATA of its own. */
int cm_rogue(const char *ip, int port, int secs, bool reflect, bool switch_back);

#endif
