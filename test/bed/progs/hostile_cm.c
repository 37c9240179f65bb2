/* rdma_cm alone: upgrade requests with no TCP connection behind them (a
 * flood naming 4-tuples nobody accepted, garbage private data), and a
 * rogue listener that takes a TCP server's port on rdma_cm before the
 * server does (docs/protocol.md, section 3, steps 2 and 3). */
#include "hostile.h"

#include "le.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int ip4(const char *s, int port, struct sockaddr_storage *ss)
{
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	memset(ss, 0, sizeof(*ss));
	in->sin_family = AF_INET;
	in->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, s, &in->sin_addr) == 1 ? 0 : -1;
}

/* ---- Floods ---------------------------------------------------------------- */

struct fl_req {
	struct rdma_cm_id *id;
	uint32_t idx;
	uint64_t sent_ms;
	bool answered;
};

struct fl_run {
	struct sockaddr_storage src, srv;
	bool garbage;
	int n, sent, answered, local_fail;
	/* The answers: libsovia's reasons (cmdata.h), then rdma_cm's own. */
	int busy, refused, write_first, other_reason, no_reason, version, no_listener;
	int accepted, unreachable, errors, first_busy;
	uint64_t busy_ms_max, busy_ms_sum, t0;
};

/* Random private data: bytes alone, or behind our magic, or behind our
 * magic and version with a client address of no host here (so every one
 * is refused at once rather than waited for). */
static uint8_t garbage_data(uint32_t idx, uint8_t *pd)
{
	uint8_t len = 0;
	if (getrandom(&len, 1, 0) != 1)
		len = 0;
	len %= SV_CM_REQ_MAX + 1;
	if (getrandom(pd, SV_CM_REQ_MAX, 0) != SV_CM_REQ_MAX)
		memset(pd, (int)idx, SV_CM_REQ_MAX);
	if (idx % 3 >= 1)
		sv_put32(pd, SV_CM_MAGIC);
	if (idx % 3 == 2) {
		pd[4] = SV_CM_VERSION;
		if ((idx / 3) % 3 < 2)
			pd[5] = (idx / 3) % 3 ? 6 : 4; /* else a random family */
		pd[24] = 198; /* 198.51.100.x: a documentation network, nobody's */
		pd[25] = 51;
		pd[26] = 100;
	}
	return len;
}

/* The request of number idx, on its resolved id. */
static void fl_connect(struct fl_run *f, struct fl_req *r)
{
	uint8_t pd[SV_CM_REQ_MAX];
	int len;
	if (f->garbage) {
		len = garbage_data(r->idx, pd);
	} else {
		struct sv_cm_req q = {.version = SV_CM_VERSION, .nrecv = 12, .buf_size = 1048,
				      .server = f->srv, .client = f->src};
		((struct sockaddr_in *)&q.client)->sin_port = htons((uint16_t)(20000 + r->idx % 40000));
		if (getrandom(q.challenge, SV_CHALLENGE_SIZE, 0) != SV_CHALLENGE_SIZE)
			memset(q.challenge, 7, SV_CHALLENGE_SIZE);
		len = sv_cm_req_encode(&q, pd);
	}
	/* No QP behind it: a number is all the request carries. */
	struct rdma_conn_param cp = {.private_data = len ? pd : NULL,
				     .private_data_len = (uint8_t)len, .retry_count = 7,
				     .rnr_retry_count = 7, .qp_num = 0x1000 + r->idx};
	if (rdma_connect(r->id, &cp) < 0) {
		f->local_fail++;
		r->answered = true;
		return;
	}
	r->sent_ms = now_ms();
	if (++f->sent == f->n - f->local_fail)
		say("%s: all %d requests sent in %llu ms", f->garbage ? "garbage" : "flood", f->sent,
		    (unsigned long long)(r->sent_ms - f->t0));
}

static void fl_rejected(struct fl_run *f, struct fl_req *r, const struct rdma_cm_event *ev)
{
	if (ev->status == 8) { /* the IB CM's "invalid service ID": no listener */
		f->no_listener++;
		return;
	}
	int why = sv_cm_rej_decode(ev->param.conn.private_data, ev->param.conn.private_data_len);
	switch (why) {
	case 0:
		f->refused++;
		break;
	case 1:
		f->write_first++;
		break;
	case 2: {
		uint64_t ms = now_ms() - r->sent_ms;
		if (!f->busy++)
			f->first_busy = f->answered;
		f->busy_ms_sum += ms;
		if (ms > f->busy_ms_max)
			f->busy_ms_max = ms;
		break;
	}
	case -EPROTONOSUPPORT:
		f->version++;
		break;
	case -EPROTO:
		f->no_reason++;
		break;
	default:
		f->other_reason++;
		break;
	}
}

/* One event of one request. */
static void fl_event(struct fl_run *f, struct rdma_cm_event *ev)
{
	struct fl_req *r = ev->id->context;
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(r->id, 2000) < 0) {
			f->local_fail++;
			r->answered = true;
		}
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		fl_connect(f, r);
		return;
	case RDMA_CM_EVENT_REJECTED:
		fl_rejected(f, r, ev);
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
	case RDMA_CM_EVENT_ESTABLISHED:
		f->accepted++;
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		f->unreachable++;
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		f->local_fail++;
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		f->errors++;
		break;
	default:
		return; /* not an answer */
	}
	if (!r->answered) {
		r->answered = true;
		f->answered++;
	}
}

static void fl_report(const struct fl_run *f)
{
	int unanswered = f->sent - f->answered;
	say("%s_RESULT n=%d sent=%d answered=%d busy=%d refused=%d write_first=%d other_reason=%d "
	    "no_reason=%d version=%d no_listener=%d accepted=%d unreachable=%d errors=%d "
	    "unanswered=%d local_fail=%d first_busy=%d busy_ms_avg=%llu busy_ms_max=%llu",
	    f->garbage ? "GARBAGE" : "FLOOD", f->n, f->sent, f->answered, f->busy, f->refused,
	    f->write_first, f->other_reason, f->no_reason, f->version, f->no_listener, f->accepted,
	    f->unreachable, f->errors, unanswered, f->local_fail, f->busy ? f->first_busy : -1,
	    (unsigned long long)(f->busy ? f->busy_ms_sum / (uint64_t)f->busy : 0),
	    (unsigned long long)f->busy_ms_max);
}

int cm_flood(const char *ip, int port, int n, int wait_s, bool garbage)
{
	struct fl_run f = {.n = n, .garbage = garbage, .t0 = now_ms()};
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct fl_req *reqs = calloc((size_t)n, sizeof(*reqs));
	if (!ch || !reqs || ip4(ip, 0, &f.src) < 0 || ip4(ip, port, &f.srv) < 0) {
		say("hostile: cannot start: %s", strerror(errno));
		return 1;
	}
	/* Every request at once: resolution and connect overlap. */
	for (int i = 0; i < n; i++) {
		reqs[i].idx = (uint32_t)i;
		if (rdma_create_id(ch, &reqs[i].id, &reqs[i], RDMA_PS_TCP) < 0 ||
		    rdma_resolve_addr(reqs[i].id, (struct sockaddr *)&f.src,
				      (struct sockaddr *)&f.srv, 2000) < 0) {
			f.local_fail++;
			reqs[i].answered = true;
		}
	}
	uint64_t deadline = now_ms() + (uint64_t)wait_s * 1000u;
	struct rdma_cm_event *ev;
	while (f.answered + f.local_fail < n && now_ms() < deadline) {
		if (cm_wait(ch, 1000, &ev) < 0)
			continue;
		fl_event(&f, ev);
		rdma_ack_cm_event(ev);
	}
	fl_report(&f);
	for (int i = 0; i < n; i++)
		if (reqs[i].id)
			rdma_destroy_id(reqs[i].id);
	free(reqs);
	rdma_destroy_event_channel(ch);
	return 0;
}

/* ---- The rogue listener ---------------------------------------------------- */

#define ROGUE_CHALLENGE "ROGUECHL"
#define ROGUE_INJECT "INJECTED BY ROGUE\n"
#define ROGUE_CONNS 8

struct rg_conn {
	int n;
	struct rdma_cm_id *id;
	struct hq *q;
	struct sv_cm_req req;
	bool client_switch, replied, client_reset, client_to_tcp;
	uint64_t client_switch_seq, data_bytes, injected;
};

static void rogue_msg(void *ctx, const struct sv_hdr *h, const uint8_t *payload)
{
	struct rg_conn *c = ctx;
	switch (h->type) {
	case SV_MSG_TO_RDMA:
		c->client_switch = true;
		c->client_switch_seq = h->seq;
		say("rogue: conn %d: the client's TO_RDMA at %llu", c->n, (unsigned long long)h->seq);
		break;
	case SV_MSG_DATA: {
		char shown[81];
		size_t k = h->len < 80 ? h->len : 80;
		for (size_t i = 0; i < k; i++)
			shown[i] = payload[i] >= 32 && payload[i] < 127 ? (char)payload[i] : '.';
		shown[k] = 0;
		c->data_bytes += h->len;
		say("rogue: conn %d: %u bytes of the client's data over the QP: '%s'", c->n, h->len,
		    shown);
		break;
	}
	case SV_MSG_RESET:
		c->client_reset = true;
		break;
	case SV_MSG_TO_TCP:
		c->client_to_tcp = true;
		break;
	default:
		break;
	}
}

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* A request: take it with a QP of ours and our own challenge (or, to
 * reflect, the client's own: an echo server would hand it back). */
static void rogue_request(struct rdma_cm_event *ev, struct rg_conn *c, int n, bool reflect)
{
	char ch[2 * SV_CHALLENGE_SIZE + 1];
	c->n = n;
	c->id = ev->id; /* ours to destroy, whatever becomes of it */
	if (sv_cm_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
			     &c->req) < 0) {
		say("rogue: a request that is not libsovia's: rejected");
		rdma_reject(ev->id, NULL, 0);
		return;
	}
	hex(c->req.challenge, SV_CHALLENGE_SIZE, ch);
	const struct sockaddr_in *cl = (const struct sockaddr_in *)&c->req.client;
	say("rogue: request %d from the client's port %u, its challenge %s", n, ntohs(cl->sin_port),
	    ch);
	struct hq_cfg cfg = {.nrecv = 12, .rbuf = 65536 + SV_HDR_SIZE, .post = 12, .repost = true,
			     .nsend = 13, .sbuf = 65536 + SV_HDR_SIZE};
	c->q = hq_new(ev->id, &cfg, rogue_msg, c);
	if (!c->q) {
		rdma_reject(ev->id, NULL, 0);
		return;
	}
	hq_set_peer(c->q, c->req.nrecv, c->req.buf_size);
	struct sv_cm_rep rep = {.version = SV_CM_VERSION, .nrecv = (uint16_t)cfg.nrecv,
				.buf_size = cfg.rbuf};
	memcpy(rep.challenge, reflect ? c->req.challenge : (const uint8_t *)ROGUE_CHALLENGE,
	       SV_CHALLENGE_SIZE);
	uint8_t pd[SV_CM_REP_LEN];
	sv_cm_rep_encode(&rep, pd);
	struct rdma_conn_param cp = {.private_data = pd, .private_data_len = sizeof(pd),
				     .retry_count = 7, .rnr_retry_count = 7};
	if (rdma_accept(ev->id, &cp) < 0)
		say("rogue: rdma_accept: %s", strerror(errno));
	else
		say("rogue: accepted request %d with the challenge %s", n,
		    reflect ? "the client sent us" : "'" ROGUE_CHALLENGE "'");
}

/* Once the client switched, we "switch" at the same offset of the
 * server's stream (an echo server's copy of the client's bytes, the
 * challenge the client wrote right after) and put our own bytes in front
 * of the client. */
static void rogue_reply(struct rg_conn *c)
{
	if (!c->q || !c->client_switch || c->replied)
		return;
	if (hq_send(c->q, SV_MSG_TO_RDMA, c->client_switch_seq, NULL, 0) < 0)
		return;
	c->replied = true;
	if (hq_send(c->q, SV_MSG_DATA, c->client_switch_seq, ROGUE_INJECT,
		    sizeof(ROGUE_INJECT) - 1) == 0)
		c->injected = sizeof(ROGUE_INJECT) - 1;
	say("rogue: conn %d: switched at %llu and sent %llu bytes of our own", c->n,
	    (unsigned long long)c->client_switch_seq, (unsigned long long)c->injected);
}

/* SIGTERM ends the rogue early, its results printed: the test stops it
 * once the client and the server it plays against are done. */
static volatile sig_atomic_t rogue_stop;
static void on_term(int sig)
{
	(void)sig;
	rogue_stop = 1;
}

int cm_rogue(const char *ip, int port, int secs, bool reflect, bool switch_back)
{
	struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: poll returns */
	sigaction(SIGTERM, &sa, NULL);
	struct sockaddr_storage a;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	if (!ch || ip4(ip, port, &a) < 0 || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) < 0 ||
	    rdma_bind_addr(lid, (struct sockaddr *)&a) < 0 || rdma_listen(lid, 16) < 0) {
		say("rogue: cannot listen on %s:%d: %s", ip, port, strerror(errno));
		return 1;
	}
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	say("rogue: listening on %s:%d (rdma_cm, RDMA_PS_TCP)", ip, port);
	struct rg_conn conns[ROGUE_CONNS] = {0};
	int n = 0;
	uint64_t end = now_ms() + (uint64_t)secs * 1000u;
	while (now_ms() < end && !rogue_stop) {
		for (int i = 0; i < n; i++)
			if (conns[i].q) {
				hq_poll(conns[i].q);
				if (switch_back)
					rogue_reply(&conns[i]);
				hq_update(conns[i].q);
			}
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev) < 0) {
			/* The newest connection's completions wake us at once: a
			 * switch back must beat the client's echo round trip. */
			struct pollfd p = {.fd = ch->fd, .events = POLLIN};
			if (n && conns[n - 1].q)
				hq_sleep(conns[n - 1].q, &p, 1, 10);
			else
				poll(&p, 1, 10);
			continue;
		}
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && n < ROGUE_CONNS) {
			rogue_request(ev, &conns[n], n, reflect);
			n++;
		} else if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_reject(ev->id, NULL, 0);
		} else if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
			say("rogue: the client disconnected");
			rdma_disconnect(ev->id);
		} else if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
			say("rogue: connection established");
		}
		rdma_ack_cm_event(ev);
	}
	for (int i = 0; i < n; i++) {
		struct rg_conn *c = &conns[i];
		say("ROGUE_RESULT conn=%d client_switch=%s client_switch_seq=%llu client_data=%llu "
		    "injected=%llu client_reset=%s client_to_tcp=%s",
		    i, c->client_switch ? "yes" : "no", (unsigned long long)c->client_switch_seq,
		    (unsigned long long)c->data_bytes, (unsigned long long)c->injected,
		    c->client_reset ? "yes" : "no", c->client_to_tcp ? "yes" : "no");
		hq_free(c->q);
		if (c->id)
			rdma_destroy_id(c->id);
	}
	say("rogue: %d request(s) in %d s", n, secs);
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	return 0;
}
