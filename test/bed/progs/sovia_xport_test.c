/*
 * sovia-xport-test: the protocol core over the verbs transport, end to end,
 * without the interposer or any TCP socket.
 *
 *   server: sovia-xport-test -s -a ADDR [-p PORT] [-t SEC]
 *   client: sovia-xport-test -a ADDR [-p PORT] [-b BYTES] [-w WINDOW] [-r RESERVE]
 *                            [-B BUF_SIZE] [-z ZCOPY_THRESHOLD] [-n NODELAY] [-D] [-t SEC]
 *   both:   [-T STALL_SEC] [-v]
 *
 * The other parameters come from the SOVIA_* environment as in the library.
 * The client sends all its parameters in the connect private data and the
 * server adopts them: both ends must agree on window, reserve and buffer
 * size, since each starts with credits for nrecv buffers of the peer.
 *
 * Both ends announce the QP with TO_RDMA at stream offset 0 and accept the
 * peer's. The client then streams BYTES of a pattern derived from the stream
 * offset, in writes of mixed sizes and shapes (bursts of small writes for
 * coalescing, copies, zero-copy writes, writev with ten pieces), and sends
 * FIN. The server reads with varying sizes (some after a MSG_PEEK), verifies
 * every byte, and at EOF answers with a 16-byte summary (byte count, FNV-1a
 * checksum) and FIN, which the client checks. With -D (duplex) the server
 * streams BYTES of its own pattern back at the same time, one thread per
 * end interleaving writes and reads, and both verify. The client
 * disconnects; the server waits for that.
 *
 * Every wait is bounded: STALL_SEC (default 60) without progress fails.
 * Exit status: 0 success, 2 data mismatch, 1 any other failure.
 */
#include "config.h"
#include "log.h"
#include "proto.h"
#include "hub.h"
#include "verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

#define PROG "sovia-xport-test"
#define EXIT_MISMATCH 2
#define WIRE_MAGIC 0x54585653u /* "SVXT" */
#define WIRE_VERSION 2 /* 2: the buffers' start size */
#define WIRE_WORDS 14
#define RESOLVE_MS 2000
#define SUMMARY_SIZE 16
#define MAX_READ (1u << 20)

struct opts {
	bool server;
	const char *addr, *port;
	uint64_t bytes;
	struct sv_proto_params prm;
	unsigned int stall_s;   /* no progress for this long fails */
	unsigned int connect_s; /* client: retry connecting; server: wait for a client */
	bool duplex;            /* both ends stream BYTES at once */
};

struct conn {
	struct rdma_event_channel *ech;
	struct rdma_cm_id *listen_id; /* server */
	struct rdma_cm_id *id;
	struct sv_verbs *v;
	struct sv_proto *p;
	bool p_live;
	bool disconnected;
	uint64_t disconnected_at; /* when the DISCONNECTED event came */
	uint64_t last_progress, stall_us;
};

/* ---- Small helpers ----------------------------------------------------- */

/* A clock with no reading yet, for one call into the core. */
#define NOW_CLK (&(struct sv_clock){.us = 0, .source = now_us})

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static _Noreturn __attribute__((format(printf, 2, 3))) void die(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(code);
}

static const char *err_str(int r)
{
	return strerror(r < 0 ? -r : r);
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* A stream's bytes: a function of the stream offset (and the direction). */
static void pattern_fill(uint8_t *dst, uint64_t off, size_t n, uint64_t seed)
{
	while (n > 0) {
		uint64_t x = mix64((off >> 3) ^ seed);
		for (unsigned int b = (unsigned int)(off & 7); b < 8 && n > 0; b++, n--, off++)
			*dst++ = (uint8_t)(x >> (8 * b));
	}
}

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * FNV_PRIME;
	return h;
}

static void put64le(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64le(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static void put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	uint64_t mult = 1;
	switch (*end) {
	case 'k': case 'K': mult = 1ull << 10; end++; break;
	case 'm': case 'M': mult = 1ull << 20; end++; break;
	case 'g': case 'G': mult = 1ull << 30; end++; break;
	default: break;
	}
	if (*end || v > UINT64_MAX / mult)
		return -EINVAL;
	*out = v * mult;
	return 0;
}

static uint32_t parse_u32(const char *s, const char *what)
{
	uint64_t v;
	if (parse_size(s, &v) < 0 || v > UINT32_MAX)
		die(1, "bad %s '%s'", what, s);
	return (uint32_t)v;
}

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		die(1, "fcntl O_NONBLOCK: %s", strerror(errno));
}

/* ---- Parameters on the wire (connect private data) ---------------------- */

enum { WIRE_COALESCE = 1, WIRE_DUPLEX = 2 };

static void params_encode(const struct opts *o, uint8_t out[WIRE_WORDS * 4])
{
	const struct sv_proto_params *prm = &o->prm;
	uint32_t w[WIRE_WORDS] = {
		WIRE_MAGIC,
		WIRE_VERSION,
		prm->window,
		prm->reserve,
		prm->buf_size,
		prm->ack_delay,
		(uint32_t)prm->ack_timeout_us,
		(prm->coalesce ? WIRE_COALESCE : 0) | (o->duplex ? WIRE_DUPLEX : 0),
		prm->coalesce_size,
		(uint32_t)prm->coalesce_timeout_us,
		prm->zcopy_threshold,
		(uint32_t)o->bytes,
		(uint32_t)(o->bytes >> 32),
		prm->start_size,
	};
	for (int i = 0; i < WIRE_WORDS; i++)
		put32le(out + 4 * i, w[i]);
}

/* The client's parameters, adopted by the server. */
static int params_decode(const void *data, size_t len, struct opts *o)
{
	const uint8_t *in = data;
	if (!in || len < WIRE_WORDS * 4 || get32le(in) != WIRE_MAGIC ||
	    get32le(in + 4) != WIRE_VERSION)
		return -EPROTO;
	uint32_t w[WIRE_WORDS];
	for (int i = 0; i < WIRE_WORDS; i++)
		w[i] = get32le(in + 4 * i);
	o->prm = (struct sv_proto_params){
		.window = w[2],
		.reserve = w[3],
		.buf_size = w[4],
		.ack_delay = w[5],
		.ack_timeout_us = w[6],
		.coalesce = (w[7] & WIRE_COALESCE) != 0,
		.coalesce_size = w[8],
		.coalesce_timeout_us = w[9],
		.zcopy_threshold = w[10],
		.start_size = w[13],
	};
	o->duplex = (w[7] & WIRE_DUPLEX) != 0;
	o->bytes = (uint64_t)w[12] << 32 | w[11];
	return 0;
}

static void params_print(const char *who, const struct sv_proto_params *p)
{
	printf(PROG ": %s params: window=%u reserve=%u buf_size=%u start_size=%u ack_delay=%u "
	       "ack_timeout_us=%" PRIu64 " coalesce=%d coalesce_size=%u "
	       "coalesce_timeout_us=%" PRIu64 " zcopy_threshold=%u\n",
	       who, p->window, p->reserve, p->buf_size, sv_proto_start_size(p), p->ack_delay,
	       p->ack_timeout_us,
	       p->coalesce, p->coalesce_size, p->coalesce_timeout_us, p->zcopy_threshold);
}

static void stats_print(const char *who, const struct sv_proto_stats *s)
{
	printf(PROG ": %s stats: tx_bytes=%" PRIu64 " tx_msgs=%" PRIu64 " tx_data_msgs=%" PRIu64
	       " rx_bytes=%" PRIu64 " rx_msgs=%" PRIu64 " rx_data_msgs=%" PRIu64
	       " tx_zcopy_bytes=%" PRIu64 " credit_stalls=%" PRIu64 " updates_sent=%" PRIu64
	       " acks_piggybacked=%" PRIu64 " coalesced_writes=%" PRIu64 "\n",
	       who, s->tx_bytes, s->tx_msgs, s->tx_data_msgs, s->rx_bytes, s->rx_msgs,
	       s->rx_data_msgs, s->tx_zcopy_bytes, s->credit_stalls, s->updates_sent,
	       s->acks_piggybacked, s->coalesced_writes);
	printf(PROG ": %s flushes: timer=%" PRIu64 " full=%" PRIu64 " large=%" PRIu64
	       " recv=%" PRIu64 " close=%" PRIu64 " idle=%" PRIu64 " nodelay=%" PRIu64 "\n",
	       who, s->flushes[SV_FLUSH_TIMER], s->flushes[SV_FLUSH_FULL],
	       s->flushes[SV_FLUSH_LARGE], s->flushes[SV_FLUSH_RECV], s->flushes[SV_FLUSH_CLOSE],
	       s->flushes[SV_FLUSH_IDLE], s->flushes[SV_FLUSH_NODELAY]);
}

/* ---- Connection manager ------------------------------------------------ */

/* The next CM event within timeout_ms, or -ETIMEDOUT. The caller acks it. */
static int cm_next(struct conn *c, struct rdma_cm_event **ev, int timeout_ms)
{
	uint64_t deadline = now_us() + (uint64_t)timeout_ms * 1000u;
	for (;;) {
		if (rdma_get_cm_event(c->ech, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		uint64_t now = now_us();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct pollfd pfd = {.fd = c->ech->fd, .events = POLLIN};
		int left = (int)((deadline - now + 999) / 1000);
		if (poll(&pfd, 1, left) < 0 && errno != EINTR)
			return -errno;
	}
}

/* Wait for event `want` on `id`; other events on other ids are dropped. */
static int cm_expect(struct conn *c, struct rdma_cm_id *id, enum rdma_cm_event_type want,
		     int timeout_ms, struct rdma_cm_event **keep)
{
	uint64_t deadline = now_us() + (uint64_t)timeout_ms * 1000u;
	for (;;) {
		uint64_t now = now_us();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct rdma_cm_event *ev;
		int r = cm_next(c, &ev, (int)((deadline - now + 999) / 1000));
		if (r < 0)
			return r;
		enum rdma_cm_event_type type = ev->event;
		int status = ev->status;
		if (id && ev->id != id && ev->listen_id != id) {
			rdma_ack_cm_event(ev);
			continue; /* a leftover of an earlier attempt */
		}
		if (type == want) {
			if (keep)
				*keep = ev;
			else
				rdma_ack_cm_event(ev);
			return 0;
		}
		rdma_ack_cm_event(ev);
		if (type == RDMA_CM_EVENT_DISCONNECTED) {
			c->disconnected = true;
			c->disconnected_at = now_us();
		}
		fprintf(stderr, PROG ": waiting for %s, got %s (status %d)\n", rdma_event_str(want),
			rdma_event_str(type), status);
		switch (type) {
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_UNREACHABLE:
			return -ECONNREFUSED;
		case RDMA_CM_EVENT_ADDR_ERROR:
		case RDMA_CM_EVENT_ROUTE_ERROR:
			return -EHOSTUNREACH;
		default:
			return -EPROTO;
		}
	}
}

/* Transfer phase: note a disconnect, drop anything else. */
static void cm_poll_events(struct conn *c)
{
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(c->ech, &ev) == 0) {
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == c->id) {
			c->disconnected = true;
			c->disconnected_at = now_us();
			/* On a disconnect from the peer the QP stays as it is;
			 * the error state makes everything posted complete
			 * (flushed). */
			if (rdma_disconnect(c->id))
				fprintf(stderr, PROG ": rdma_disconnect: %s\n", strerror(errno));
			sv_verbs_qp_error(c->v);
		}
		else
			fprintf(stderr, PROG ": unexpected CM event %s\n", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	}
}

/* The verbs resources and the core on c->id, receives posted. */
static int transport_setup(struct conn *c, const struct sv_proto_params *prm)
{
	int r = sv_verbs_create(&c->v, c->id, prm);
	if (r < 0) {
		fprintf(stderr, PROG ": sv_verbs_create: %s\n", err_str(r));
		return r;
	}
	struct sv_xport xp = sv_verbs_xport(c->v);
	r = sv_proto_new(&c->p, prm, &xp);
	if (r < 0) {
		fprintf(stderr, PROG ": sv_proto_new: %s\n", err_str(r));
		goto destroy_verbs;
	}
	c->p_live = true;
	return 0;

destroy_verbs:
	sv_verbs_destroy(c->v);
	c->v = NULL;
	return r;
}

static void transport_teardown(struct conn *c)
{
	if (c->p_live)
		sv_proto_free(c->p);
	c->p = NULL;
	c->p_live = false;
	sv_verbs_destroy(c->v); /* destroys the QP on c->id */
	c->v = NULL;
}

static void conn_param_init(struct rdma_conn_param *cp, const void *pdata, uint8_t plen)
{
	memset(cp, 0, sizeof(*cp));
	cp->private_data = pdata;
	cp->private_data_len = plen;
	cp->responder_resources = 0;
	cp->initiator_depth = 0;
	cp->retry_count = 7;
	/* The credits guarantee a posted receive for every message: a
	 * receiver-not-ready NAK is a protocol bug, so let it fail at once. */
	cp->rnr_retry_count = 0;
}

static struct addrinfo *resolve(const char *addr, const char *port, bool passive)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	if (passive)
		hints.ai_flags = AI_PASSIVE;
	struct addrinfo *ai;
	int r = getaddrinfo(addr, port, &hints, &ai);
	if (r)
		die(1, "getaddrinfo %s:%s: %s", addr ? addr : "*", port, gai_strerror(r));
	return ai;
}

static int client_try(struct conn *c, const struct opts *o, struct sockaddr *dst)
{
	int r;
	if (rdma_create_id(c->ech, &c->id, NULL, RDMA_PS_TCP)) {
		r = -errno;
		fprintf(stderr, PROG ": rdma_create_id: %s\n", err_str(r));
		return r;
	}
	if (rdma_resolve_addr(c->id, NULL, dst, RESOLVE_MS)) {
		r = -errno;
		goto destroy_id;
	}
	r = cm_expect(c, c->id, RDMA_CM_EVENT_ADDR_RESOLVED, RESOLVE_MS * 2, NULL);
	if (r < 0)
		goto destroy_id;
	if (rdma_resolve_route(c->id, RESOLVE_MS)) {
		r = -errno;
		goto destroy_id;
	}
	r = cm_expect(c, c->id, RDMA_CM_EVENT_ROUTE_RESOLVED, RESOLVE_MS * 2, NULL);
	if (r < 0)
		goto destroy_id;
	/* QP and pre-posted receives before the connection exists. A local
	 * failure here is no reason to retry. */
	r = transport_setup(c, &o->prm);
	if (r < 0)
		die(1, "transport setup failed: %s", err_str(r));
	uint8_t pdata[WIRE_WORDS * 4];
	params_encode(o, pdata);
	struct rdma_conn_param cp;
	conn_param_init(&cp, pdata, sizeof(pdata));
	cp.qp_num = sv_verbs_qp_num(c->v);
	if (rdma_connect(c->id, &cp)) {
		r = -errno;
		fprintf(stderr, PROG ": rdma_connect: %s\n", err_str(r));
		goto teardown_transport;
	}
	/* The QP is libsovia's own (src/verbs.h): ready it on the answer,
	 * then complete the connection. */
	r = cm_expect(c, c->id, RDMA_CM_EVENT_CONNECT_RESPONSE, 10000, NULL);
	if (r < 0)
		goto teardown_transport;
	r = sv_verbs_connected(c->v);
	if (r < 0 || rdma_establish(c->id)) {
		r = r < 0 ? r : -errno;
		fprintf(stderr, PROG ": completing the connection: %s\n", err_str(r));
		goto teardown_transport;
	}
	return 0;

teardown_transport:
	transport_teardown(c);
destroy_id:
	rdma_destroy_id(c->id);
	c->id = NULL;
	return r;
}

static void client_connect(struct conn *c, const struct opts *o)
{
	struct addrinfo *ai = resolve(o->addr, o->port, false);
	uint64_t deadline = now_us() + (uint64_t)o->connect_s * 1000000u;
	int tries = 0, r;
	for (;;) {
		tries++;
		r = client_try(c, o, ai->ai_addr);
		if (r == 0)
			break;
		if (now_us() >= deadline)
			die(1, "could not connect to %s:%s in %u s (%d attempts): %s", o->addr,
			    o->port, o->connect_s, tries, err_str(r));
		usleep(250000);
	}
	freeaddrinfo(ai);
	printf(PROG ": connected to %s:%s after %d attempt%s\n", o->addr, o->port, tries,
	       tries == 1 ? "" : "s");
}

/* Accept one client; *peer gets its parameters (o's with the client's
 * protocol parameters, stream size and mode). */
static void server_accept(struct conn *c, const struct opts *o, struct opts *peer)
{
	struct addrinfo *ai = resolve(o->addr, o->port, true);
	if (rdma_create_id(c->ech, &c->listen_id, NULL, RDMA_PS_TCP))
		die(1, "rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(c->listen_id, ai->ai_addr))
		die(1, "rdma_bind_addr %s:%s: %s", o->addr, o->port, strerror(errno));
	freeaddrinfo(ai);
	if (rdma_listen(c->listen_id, 4))
		die(1, "rdma_listen: %s", strerror(errno));
	printf(PROG ": server listening on %s:%s\n", o->addr, o->port);
	fflush(stdout);

	struct rdma_cm_event *ev;
	int r = cm_expect(c, NULL, RDMA_CM_EVENT_CONNECT_REQUEST, (int)o->connect_s * 1000, &ev);
	if (r < 0)
		die(1, "no connect request within %u s: %s", o->connect_s, err_str(r));
	c->id = ev->id;
	*peer = *o;
	r = params_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, peer);
	rdma_ack_cm_event(ev);
	if (r < 0) {
		rdma_reject(c->id, NULL, 0);
		die(1, "connect request without valid parameters");
	}
	params_print("server (adopted)", &peer->prm);
	r = transport_setup(c, &peer->prm);
	if (r < 0) {
		rdma_reject(c->id, NULL, 0);
		die(1, "transport setup failed: %s", err_str(r));
	}
	r = sv_verbs_connected(c->v);
	if (r < 0) {
		rdma_reject(c->id, NULL, 0);
		die(1, "QP not ready: %s", err_str(r));
	}
	struct rdma_conn_param cp;
	conn_param_init(&cp, NULL, 0);
	cp.qp_num = sv_verbs_qp_num(c->v);
	if (rdma_accept(c->id, &cp))
		die(1, "rdma_accept: %s", strerror(errno));
	r = cm_expect(c, c->id, RDMA_CM_EVENT_ESTABLISHED, 10000, NULL);
	if (r < 0)
		die(1, "connection not established: %s", err_str(r));
	printf(PROG ": server accepted a connection\n");
}

/* ---- Driving the core -------------------------------------------------- */

static void progress(struct conn *c)
{
	c->last_progress = now_us();
}

/* Completions and timers, without waiting. Returns the completions handled
 * or -errno. */
static int pump(struct conn *c)
{
	uint64_t now = now_us();
	struct sv_clock clk = {.us = now, .source = now_us};
	int n = sv_verbs_poll(c->v, c->p, &clk);
	if (n < 0)
		return n;
	if (n > 0)
		c->last_progress = now;
	sv_proto_timers(c->p, &clk);
	if (sv_proto_error(c->p))
		return sv_proto_error(c->p);
	return n;
}

/* Let time pass until something may have changed: completions handled, a
 * timer due, or at most 100 ms. -ETIMEDOUT after the stall limit. */
static int wait_more(struct conn *c)
{
	int n = pump(c);
	if (n != 0)
		return n < 0 ? n : 0;
	int r = sv_verbs_arm(c->v);
	if (r < 0)
		return r;
	/* A completion that came in before the arm raises no event. */
	n = pump(c);
	if (n != 0)
		return n < 0 ? n : 0;
	uint64_t now = now_us();
	/* The QP is in the error state now: its flushed completions report
	 * the break. Should they not come, give up after a grace period. */
	if (c->disconnected && now - c->disconnected_at > 5000000u)
		return -ENOTCONN;
	if (now - c->last_progress > c->stall_us)
		return -ETIMEDOUT;
	uint64_t wait = 100000;
	struct sv_clock clk = {.us = now, .source = now_us};
	uint64_t dl = sv_proto_next_deadline(c->p, &clk);
	if (dl)
		wait = dl <= now ? 0 : (dl - now < wait ? dl - now : wait);
	struct timespec ts = {.tv_sec = (time_t)(wait / 1000000u),
			      .tv_nsec = (long)(wait % 1000000u) * 1000};
	/* The device's completion channel is the hub's (src/hub.h): the
	 * only sleeper here, this thread leads and polls it. */
	struct sv_hub_sleeper sl;
	sv_hub_sleep_begin(&sl, -1);
	struct pollfd pfd[1 + SV_HUB_MAX_CHANS] = {{.fd = c->ech->fd, .events = POLLIN}};
	int nhub = sv_hub_sleep_fds(&sl, &pfd[1]);
	int pr = ppoll(pfd, (nfds_t)(1 + nhub), &ts, NULL);
	int err = errno;
	sv_hub_sleep_end(&sl, &pfd[1], nhub);
	if (pr < 0 && err != EINTR)
		return -err;
	if (pfd[0].revents)
		cm_poll_events(c);
	n = pump(c);
	return n < 0 ? n : 0;
}

/* After a failure: keep polling until every send slot is back (flushed
 * completions release them too), at most 5 s, and say how it went. */
static void drain_after_error(struct conn *c)
{
	uint64_t end = now_us() + 5000000u;
	while (!sv_proto_sends_done(c->p) && now_us() < end) {
		sv_verbs_poll(c->v, c->p, NOW_CLK);
		usleep(1000);
	}
	fprintf(stderr,
		PROG ": after the failure: every send completed %d, zero-copy busy %d, core "
		     "error %d\n",
		sv_proto_sends_done(c->p), sv_proto_zcopy_busy(c->p), sv_proto_error(c->p));
}

static void check(struct conn *c, int r, const char *what)
{
	if (r >= 0)
		return;
	fprintf(stderr, PROG ": %s: %s (core error %d, tx_state %d, every send completed %d)\n",
		what, err_str(r), sv_proto_error(c->p), (int)sv_proto_tx_state(c->p),
		sv_proto_sends_done(c->p));
	stats_print("failed", sv_proto_stats(c->p));
	drain_after_error(c);
	exit(1);
}

/* Both directions onto the QP: announce ours, accept the peer's. */
static void upgrade(struct conn *c)
{
	int r;
	progress(c);
	while ((r = sv_proto_send_to_rdma(c->p, 0, NOW_CLK)) == -EAGAIN)
		check(c, wait_more(c), "waiting to send TO_RDMA");
	check(c, r, "sv_proto_send_to_rdma");
	while (!sv_proto_peer_switch(c->p, NULL))
		check(c, wait_more(c), "waiting for the peer's TO_RDMA");
	check(c, sv_proto_rx_accept(c->p), "sv_proto_rx_accept");
}

/* ---- The streams ------------------------------------------------------- */

#define SEED_C2S 0                      /* client to server */
#define SEED_S2C 0x5eed5eed5eed5eedull  /* server to client (duplex) */

/* A stream of `total` pattern bytes in read-only memory: zero-copy sends
 * must work without write access. *csum gets its checksum. */
static uint8_t *stream_make(size_t total, uint64_t seed, size_t *maplen, uint64_t *csum)
{
	*maplen = total ? total : 1;
	uint8_t *pat = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			    -1, 0);
	if (pat == MAP_FAILED)
		die(1, "mmap of %zu bytes: %s", *maplen, strerror(errno));
	pattern_fill(pat, 0, total, seed);
	*csum = fnv1a(FNV_OFFSET, pat, total);
	if (mprotect(pat, *maplen, PROT_READ))
		die(1, "mprotect: %s", strerror(errno));
	return pat;
}

/* The writes, cycled: a burst of BURST small writes (coalescing), then
 * write_sizes. In every other cycle the writes of 4096 bytes and more are
 * writev calls of ten unequal pieces: more than the eight scatter/gather
 * entries of a zero-copy message. */
static const size_t write_sizes[] = {1, 100, 1500, 4096, 70000, 1u << 20};
#define NSIZES (sizeof(write_sizes) / sizeof(write_sizes[0]))
#define BURST 50
#define SPLIT 10

struct wgen {
	unsigned int cycle, j;
	uint64_t writes, split_writes;
};

/* The next write at stream offset off: its iovec (returns the count) and
 * its size in *n. */
static int next_write(struct wgen *g, uint8_t *pat, size_t off, size_t total,
		      struct iovec iov[SPLIT], size_t *n)
{
	bool burst = g->j < BURST;
	size_t len = burst ? (g->j * 37 + g->cycle) % 300 + 1 : write_sizes[g->j - BURST];
	bool split = !burst && len >= 4096 && g->cycle % 2 == 1;
	if (++g->j == BURST + NSIZES) {
		g->j = 0;
		g->cycle++;
	}
	if (len > total - off)
		len = total - off;
	*n = len;
	g->writes++;
	if (!split || len < 110) {
		iov[0] = (struct iovec){.iov_base = pat + off, .iov_len = len};
		return 1;
	}
	g->split_writes++;
	size_t prev = 0;
	for (int j = 1; j <= SPLIT; j++) {
		size_t b = len * (size_t)(j * (j + 1)) / 110;
		iov[j - 1] = (struct iovec){.iov_base = pat + off + prev, .iov_len = b - prev};
		prev = b;
	}
	return SPLIT;
}

/* Drop `took` bytes from the front of cur[*first..cnt). */
static void iov_advance(struct iovec *cur, int cnt, int *first, size_t took)
{
	while (*first < cnt && took >= cur[*first].iov_len)
		took -= cur[(*first)++].iov_len;
	if (*first < cnt) {
		cur[*first].iov_base = (uint8_t *)cur[*first].iov_base + took;
		cur[*first].iov_len -= took;
	}
}

/* A blocking write: all of it taken, and its zero-copy sends completed. */
static void blocking_send(struct conn *c, const struct iovec *iov, int iovcnt)
{
	struct iovec cur[SPLIT];
	if (iovcnt > SPLIT)
		die(1, "internal: iovcnt %d", iovcnt);
	memcpy(cur, iov, sizeof(*iov) * (size_t)iovcnt);
	int first = 0;
	while (first < iovcnt) {
		long r = sv_proto_send(c->p, cur + first, iovcnt - first, 0, NOW_CLK);
		if (r == -EAGAIN) {
			check(c, wait_more(c), "waiting for credits");
			continue;
		}
		check(c, (int)(r < 0 ? r : 0), "sv_proto_send");
		progress(c);
		iov_advance(cur, iovcnt, &first, (size_t)r);
	}
	while (sv_proto_zcopy_busy(c->p))
		check(c, wait_more(c), "waiting for zero-copy completions");
	/* No polling otherwise: back-to-back small writes find the previous
	 * message still in flight and coalesce, as they would on a busy link. */
}

static void send_fin(struct conn *c)
{
	int r;
	while ((r = sv_proto_send_fin(c->p, NOW_CLK)) == -EAGAIN)
		check(c, wait_more(c), "waiting to send FIN");
	check(c, r, "sv_proto_send_fin");
}

/* Every send slot back: what we sent has been delivered. */
static void wait_sends_done(struct conn *c)
{
	while (!sv_proto_sends_done(c->p) || sv_proto_tx_pending(c->p))
		check(c, wait_more(c), "waiting for the last send completions");
}

/* The reading side: varying read sizes, now and then a MSG_PEEK first,
 * every byte checked against the pattern. */
static const size_t read_sizes[] = {7, 1000, 4096, 65536, 1u << 20, 333, 32771, 1};
#define NREADS (sizeof(read_sizes) / sizeof(read_sizes[0]))

struct reader {
	uint64_t seed, off, csum, reads, peeks;
	unsigned int k;
	uint8_t *buf, *want, *peek;
};

static void reader_init(struct reader *rd, uint64_t seed)
{
	*rd = (struct reader){.seed = seed, .csum = FNV_OFFSET};
	rd->buf = malloc(MAX_READ);
	rd->want = malloc(MAX_READ);
	rd->peek = malloc(MAX_READ);
	if (!rd->buf || !rd->want || !rd->peek)
		die(1, "out of memory");
}

static void reader_free(struct reader *rd)
{
	free(rd->buf);
	free(rd->want);
	free(rd->peek);
}

static _Noreturn void mismatch(struct conn *c, const struct reader *rd, const uint8_t *got,
			       size_t n, const char *what)
{
	size_t i = 0;
	while (got[i] == rd->want[i])
		i++;
	fprintf(stderr,
		PROG ": DATA MISMATCH (%s) at stream offset %" PRIu64 " (read %" PRIu64
		     " of %zu bytes at %" PRIu64 ", byte %zu): expected 0x%02x, got 0x%02x\n",
		what, rd->off + i, rd->reads, n, rd->off, i, rd->want[i], got[i]);
	stats_print("mismatch", sv_proto_stats(c->p));
	exit(EXIT_MISMATCH);
}

/* One read attempt: the bytes read (checked), 0 at EOF, or -EAGAIN. */
static long reader_step(struct conn *c, struct reader *rd)
{
	struct iovec iov = {.iov_base = rd->buf, .iov_len = read_sizes[rd->k % NREADS]};
	long peeked = -1;
	if (rd->k % 16 == 5) {
		struct iovec piov = {.iov_base = rd->peek, .iov_len = iov.iov_len};
		peeked = sv_proto_recv(c->p, &piov, 1, MSG_PEEK, NOW_CLK);
		if (peeked == -EAGAIN)
			return peeked;
		check(c, (int)(peeked < 0 ? peeked : 0), "sv_proto_recv(MSG_PEEK)");
	}
	long r = sv_proto_recv(c->p, &iov, 1, 0, NOW_CLK);
	if (r == -EAGAIN) {
		if (peeked > 0)
			die(1, "MSG_PEEK returned %ld bytes, the read after it none", peeked);
		return r;
	}
	check(c, (int)(r < 0 ? r : 0), "sv_proto_recv");
	if (peeked >= 0 && (r != peeked || memcmp(rd->peek, rd->buf, (size_t)r) != 0))
		die(EXIT_MISMATCH, "MSG_PEEK returned %ld bytes, the read after it %ld or other bytes",
		    peeked, r);
	if (peeked > 0)
		rd->peeks++;
	if (r == 0)
		return 0;
	rd->k++;
	rd->reads++;
	size_t n = (size_t)r;
	pattern_fill(rd->want, rd->off, n, rd->seed);
	if (memcmp(rd->buf, rd->want, n) != 0)
		mismatch(c, rd, rd->buf, n, "read");
	rd->csum = fnv1a(rd->csum, rd->buf, n);
	rd->off += n;
	return r;
}

/* Read to EOF. */
static void reader_drain(struct conn *c, struct reader *rd)
{
	long r;
	while ((r = reader_step(c, rd)) != 0) {
		if (r == -EAGAIN)
			check(c, wait_more(c), "waiting for data");
		else
			progress(c);
	}
}

/* Both directions at once, in one thread: write our stream and FIN while
 * reading the peer's to EOF, never blocking on one side while the other
 * could move. A write counts as done when its zero-copy sends completed,
 * as a blocking write() would return.
 *
 * With `linger`, once both FINs are through, stop reading until the peer
 * has disconnected, then read the rest: a graceful close by the peer must
 * leave the bytes that arrived readable. Returns the bytes read after the
 * disconnect. */
static uint64_t duplex(struct conn *c, uint8_t *pat, size_t total, struct wgen *g,
		       struct reader *rd, bool linger)
{
	uint64_t read_at_disconnect = UINT64_MAX;
	struct iovec cur[SPLIT];
	int cnt = 0, first = 0;
	size_t off = 0, n = 0;
	bool writing = false, fin_sent = false, eof = false;
	while (!fin_sent || !eof) {
		bool moved = false;
		if (!fin_sent && !writing && off < total) {
			cnt = next_write(g, pat, off, total, cur, &n);
			first = 0;
			writing = true;
		}
		if (writing) {
			if (first < cnt) {
				long r = sv_proto_send(c->p, cur + first, cnt - first, 0, NOW_CLK);
				if (r > 0) {
					iov_advance(cur, cnt, &first, (size_t)r);
					moved = true;
				} else if (r != -EAGAIN) {
					check(c, (int)r, "sv_proto_send");
				}
			}
			if (first == cnt && !sv_proto_zcopy_busy(c->p)) {
				off += n;
				writing = false;
				moved = true;
			}
		} else if (!fin_sent) {
			int r = sv_proto_send_fin(c->p, NOW_CLK);
			if (r == 0)
				fin_sent = moved = true;
			else if (r != -EAGAIN)
				check(c, r, "sv_proto_send_fin");
		}
		if (linger && fin_sent && sv_proto_rx_fin(c->p) && !eof) {
			if (!c->disconnected) {
				check(c, wait_more(c), "duplex: waiting for the peer to disconnect");
				continue;
			}
			if (read_at_disconnect == UINT64_MAX)
				read_at_disconnect = rd->off;
		}
		if (!eof) {
			long r = reader_step(c, rd);
			if (r >= 0) {
				moved = true;
				eof = r == 0;
			}
		}
		if (moved) {
			progress(c);
			check(c, pump(c), "polling");
		} else {
			check(c, wait_more(c), "duplex: waiting for the peer");
		}
	}
	return read_at_disconnect == UINT64_MAX ? 0 : rd->off - read_at_disconnect;
}

/* ---- Client ------------------------------------------------------------ */

static int client(const struct opts *o)
{
	struct conn c = {.stall_us = (uint64_t)o->stall_s * 1000000u};
	c.ech = rdma_create_event_channel();
	if (!c.ech)
		die(1, "rdma_create_event_channel: %s", strerror(errno));
	set_nonblock(c.ech->fd);
	params_print("client", &o->prm);
	size_t total = (size_t)o->bytes, maplen;
	uint64_t csum;
	uint8_t *pat = stream_make(total, SEED_C2S, &maplen, &csum);
	struct wgen g = {0};
	struct reader rd;
	reader_init(&rd, SEED_S2C);

	client_connect(&c, o);
	upgrade(&c);

	uint64_t t0 = now_us(), t_sent, t_done;
	if (o->duplex) {
		duplex(&c, pat, total, &g, &rd, false);
		t_sent = t_done = now_us();
		if (rd.off != total)
			die(EXIT_MISMATCH, "the server's stream ended after %" PRIu64 " of %zu bytes",
			    rd.off, total);
	} else {
		struct iovec iov[SPLIT];
		for (size_t off = 0, n; off < total; off += n) {
			int cnt = next_write(&g, pat, off, total, iov, &n);
			blocking_send(&c, iov, cnt);
		}
		send_fin(&c);
		t_sent = now_us();

		/* The server's answer, then its FIN. */
		uint8_t sum[64];
		size_t got = 0;
		for (;;) {
			struct iovec iov1 = {.iov_base = sum + got, .iov_len = sizeof(sum) - got};
			long r = sv_proto_recv(c.p, &iov1, 1, 0, NOW_CLK);
			if (r == -EAGAIN) {
				check(&c, wait_more(&c), "waiting for the summary");
				continue;
			}
			check(&c, (int)(r < 0 ? r : 0), "sv_proto_recv");
			if (r == 0)
				break;
			progress(&c);
			got += (size_t)r;
			if (got > SUMMARY_SIZE)
				die(EXIT_MISMATCH, "server answered more than %d bytes", SUMMARY_SIZE);
		}
		t_done = now_us();
		if (got != SUMMARY_SIZE)
			die(EXIT_MISMATCH, "summary of %zu bytes, expected %d", got, SUMMARY_SIZE);
		uint64_t rcount = get64le(sum), rsum = get64le(sum + 8);
		if (rcount != total || rsum != csum)
			die(EXIT_MISMATCH,
			    "server saw %" PRIu64 " bytes, checksum %016" PRIx64 "; sent %zu, "
			    "checksum %016" PRIx64,
			    rcount, rsum, total, csum);
	}

	wait_sends_done(&c);
	struct sv_proto_stats st = *sv_proto_stats(c.p);
	bool disc = rdma_disconnect(c.id) == 0;
	if (!disc)
		fprintf(stderr, PROG ": rdma_disconnect: %s\n", strerror(errno));
	sv_verbs_qp_error(c.v);
	if (disc && !c.disconnected &&
	    cm_expect(&c, c.id, RDMA_CM_EVENT_DISCONNECTED, 5000, NULL) < 0)
		fprintf(stderr, PROG ": no DISCONNECTED event\n");
	transport_teardown(&c);
	rdma_destroy_id(c.id);
	rdma_destroy_event_channel(c.ech);
	munmap(pat, maplen);
	reader_free(&rd);

	double secs = (double)(t_sent - t0) / 1e6;
	printf(PROG ": client: %" PRIu64 " writes (%" PRIu64 " split in %d pieces), "
	       "%.3f s to send, %.3f s in all\n",
	       g.writes, g.split_writes, SPLIT, secs, (double)(t_done - t0) / 1e6);
	stats_print("client", &st);
	if (o->duplex)
		printf(PROG ": client: received %" PRIu64 " bytes in %" PRIu64 " reads (%" PRIu64
		       " peeked first), all verified\n",
		       rd.off, rd.reads, rd.peeks);
	printf(PROG ": OK client sent %zu bytes%s in %.3f s, %.1f MB/s (%.3f Gbit/s)%s, "
	       "checksum %016" PRIx64 " confirmed\n",
	       total, o->duplex ? " and received as many" : "", secs,
	       secs > 0 ? (double)total / secs / 1e6 : 0.0,
	       secs > 0 ? (double)total * 8 / secs / 1e9 : 0.0, o->duplex ? " each way" : "",
	       o->duplex ? rd.csum : csum);
	return 0;
}

/* ---- Server ------------------------------------------------------------ */

static int server(const struct opts *o)
{
	struct conn c = {.stall_us = (uint64_t)o->stall_s * 1000000u};
	c.ech = rdma_create_event_channel();
	if (!c.ech)
		die(1, "rdma_create_event_channel: %s", strerror(errno));
	set_nonblock(c.ech->fd);
	struct opts peer;
	server_accept(&c, o, &peer);
	struct reader rd;
	reader_init(&rd, SEED_C2S);
	struct wgen g = {0};
	size_t maplen = 0, total = (size_t)peer.bytes;
	uint64_t csum = 0;
	uint8_t *pat = peer.duplex ? stream_make(total, SEED_S2C, &maplen, &csum) : NULL;
	upgrade(&c);

	uint64_t t0 = now_us(), late = 0;
	if (peer.duplex) {
		late = duplex(&c, pat, total, &g, &rd, true);
	} else {
		reader_drain(&c, &rd);
		uint8_t sum[SUMMARY_SIZE];
		put64le(sum, rd.off);
		put64le(sum + 8, rd.csum);
		struct iovec iov = {.iov_base = sum, .iov_len = sizeof(sum)};
		blocking_send(&c, &iov, 1);
		send_fin(&c);
	}
	uint64_t t_eof = now_us();
	wait_sends_done(&c);
	struct sv_proto_stats st = *sv_proto_stats(c.p);
	if (rd.off != peer.bytes)
		die(EXIT_MISMATCH, "the client's stream ended after %" PRIu64 " of %" PRIu64 " bytes",
		    rd.off, peer.bytes);

	/* The client disconnects once it has checked the summary. */
	if (!c.disconnected) {
		int r = cm_expect(&c, c.id, RDMA_CM_EVENT_DISCONNECTED, (int)o->stall_s * 1000, NULL);
		if (r < 0)
			die(1, "waiting for the client to disconnect: %s", err_str(r));
	}
	transport_teardown(&c);
	rdma_destroy_id(c.id);
	rdma_destroy_id(c.listen_id);
	rdma_destroy_event_channel(c.ech);
	reader_free(&rd);
	if (pat)
		munmap(pat, maplen);

	double secs = (double)(t_eof - t0) / 1e6;
	stats_print("server", &st);
	if (peer.duplex)
		printf(PROG ": server: %" PRIu64 " bytes read after the client disconnected\n", late);
	printf(PROG ": OK server received %" PRIu64 " bytes in %" PRIu64 " reads (%" PRIu64
	       " peeked first)%s, %.3f s, %.1f MB/s, checksum %016" PRIx64 "\n",
	       rd.off, rd.reads, rd.peeks, peer.duplex ? " while sending as many" : "", secs,
	       secs > 0 ? (double)rd.off / secs / 1e6 : 0.0, rd.csum);
	return 0;
}

/* ---- main -------------------------------------------------------------- */

static _Noreturn void usage(void)
{
	fprintf(stderr,
		"usage: " PROG " -s -a ADDR [-p PORT] [-t SEC] [-T SEC] [-v]\n"
		"       " PROG " -a ADDR [-p PORT] [-b BYTES] [-w WINDOW] [-r RESERVE]\n"
		"              [-B BUF_SIZE] [-z ZCOPY_THRESHOLD] [-n NODELAY(0|1)] [-D] [-t SEC]\n"
		"              [-T SEC] [-v]\n"
		"  -D  duplex: the server streams BYTES back at the same time\n"
		"  -t  client: keep retrying the connection this long (default 20 s);\n"
		"      server: wait this long for a client (default 120 s)\n"
		"  -T  fail after this long without progress (default 60 s)\n");
	exit(1);
}

int main(int argc, char **argv)
{
	struct sv_config cfg;
	sv_config_load(&cfg, getenv);
	sv_log_threshold = cfg.log_level;
	struct opts o = {
		.port = "7480",
		.bytes = 64ull << 20,
		.stall_s = 60,
	};
	sv_config_proto_params(&cfg, &o.prm);
	int connect_s = -1, opt;
	while ((opt = getopt(argc, argv, "sa:p:b:w:r:B:z:n:Dt:T:vh")) != -1) {
		switch (opt) {
		case 's': o.server = true; break;
		case 'a': o.addr = optarg; break;
		case 'p': o.port = optarg; break;
		case 'b':
			if (parse_size(optarg, &o.bytes) < 0 || o.bytes > (1ull << 40))
				die(1, "bad byte count '%s'", optarg);
			break;
		case 'w': o.prm.window = parse_u32(optarg, "window"); break;
		case 'r': o.prm.reserve = parse_u32(optarg, "reserve"); break;
		case 'B': o.prm.buf_size = parse_u32(optarg, "buffer size"); break;
		case 'z': o.prm.zcopy_threshold = parse_u32(optarg, "zero-copy threshold"); break;
		case 'n': o.prm.coalesce = parse_u32(optarg, "nodelay flag") == 0; break;
		case 't': connect_s = (int)parse_u32(optarg, "seconds"); break;
		case 'T': o.stall_s = parse_u32(optarg, "seconds"); break;
		case 'D': o.duplex = true; break;
		case 'v': sv_log_threshold = SV_LOG_DEBUG; break;
		default: usage();
		}
	}
	if (optind != argc || !o.addr)
		usage();
	o.connect_s = connect_s >= 0 ? (unsigned int)connect_s : (o.server ? 120 : 20);
	if (o.stall_s == 0)
		o.stall_s = 1;
	/* The relations the settings loader keeps, after the options. */
	if (o.prm.window > 1 && o.prm.ack_delay >= o.prm.window)
		o.prm.ack_delay = o.prm.window / 2;
	if (o.prm.ack_delay == 0)
		o.prm.ack_delay = 1;
	if (o.prm.buf_size > SV_HDR_SIZE && o.prm.coalesce_size > o.prm.buf_size - SV_HDR_SIZE)
		o.prm.coalesce_size = o.prm.buf_size - SV_HDR_SIZE;
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	return o.server ? server(&o) : client(&o);
}
