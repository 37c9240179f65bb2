/* A genuine client connection, as libsovia's client makes it
 * (docs/protocol.md, section 3): a real TCP connection, the upgrade
 * request naming its 4-tuple, TO_RDMA at the bytes written on TCP and the
 * server's challenge echoed there. The server then accepts the QP as its
 * TCP peer's, and the attacks that need an accepted QP start from here. */
#include "hostile.h"

#include "le.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- The server's messages ------------------------------------------------- */

static void on_msg(void *ctx, const struct sv_hdr *h, const uint8_t *payload)
{
	struct hc *c = ctx;
	if (h->type <= SV_MSG_DRAIN)
		c->rx_types[h->type]++;
	switch (h->type) {
	case SV_MSG_DATA:
		if (bytes_add(&c->srv_qp, payload, h->len) < 0)
			say("hostile: out of memory for the server's bytes");
		break;
	case SV_MSG_TO_RDMA:
		c->srv_switch = true;
		c->srv_switch_seq = h->seq;
		break;
	case SV_MSG_FIN:
		c->srv_fin = true;
		break;
	case SV_MSG_RESET:
		c->srv_reset = true;
		break;
	case SV_MSG_BACK:
		c->srv_back = true;
		c->srv_back_seq = h->seq;
		c->srv_back_x = h->len >= SV_BACK_PAYLOAD ? sv_get64(payload) : 0;
		break;
	case SV_MSG_RETURN:
		c->returned_to_us += h->len;
		break;
	default:
		break;
	}
}

/* ---- TCP ---------------------------------------------------------------- */

/* Everything TCP has now; the number of bytes read. */
static size_t tcp_read(struct hc *c)
{
	uint8_t buf[65536];
	size_t got = 0;
	while (!c->tcp_eof) {
		ssize_t n = recv(c->tcp, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			if (bytes_add(&c->tcp_in, buf, (size_t)n) < 0)
				return got;
			got += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		c->tcp_err = n < 0 ? errno : 0;
		c->tcp_eof = true;
	}
	return got;
}

int hc_tcp_write(struct hc *c, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	uint64_t deadline = now_ms() + 120000;
	while (n) {
		ssize_t w = send(c->tcp, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno != EAGAIN && errno != EINTR) {
			say("hostile: TCP write: %s", strerror(errno));
			return -1;
		}
		if (now_ms() > deadline) {
			say("hostile: TCP write: no room for 120 s");
			return -1;
		}
		/* The server may be writing to us meanwhile: read, or both
		 * sides' buffers fill and nobody moves. */
		tcp_read(c);
		struct pollfd fds[2] = {{c->tcp, POLLOUT, 0}, {c->tcp, c->tcp_eof ? 0 : POLLIN, 0}};
		poll(fds, 2, 100);
	}
	return 0;
}

int hc_tcp_write_pattern(struct hc *c, size_t n)
{
	uint8_t buf[65536];
	while (n) {
		size_t k = n < sizeof(buf) ? n : sizeof(buf);
		pattern_fill(c->snd_nxt, buf, k);
		if (hc_tcp_write(c, buf, k) < 0)
			return -1;
		c->snd_nxt += k;
		n -= k;
	}
	return 0;
}

int hc_open(struct hc *c, const char *ip, int port, size_t pre)
{
	memset(c, 0, sizeof(*c));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	socklen_t len = sizeof(c->local);
	c->tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->tcp < 0 || inet_pton(AF_INET, ip, &a.sin_addr) != 1 ||
	    connect(c->tcp, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    getsockname(c->tcp, (struct sockaddr *)&c->local, &len) < 0) {
		say("hostile: TCP connect to %s:%d: %s", ip, port, strerror(errno));
		return -1;
	}
	memcpy(&c->peer, &a, sizeof(a));
	say("hostile: TCP connected from port %u", ntohs(((struct sockaddr_in *)&c->local)->sin_port));
	return hc_tcp_write_pattern(c, pre);
}

/* ---- The upgrade ------------------------------------------------------------ */

/* The next event must be `want`; 0, or -1 (said). */
static int expect(struct hc *c, enum rdma_cm_event_type want, int ms)
{
	struct rdma_cm_event *ev;
	if (cm_wait(c->ch, ms, &ev) < 0) {
		say("hostile: no %s in %d ms", rdma_event_str(want), ms);
		return -1;
	}
	enum rdma_cm_event_type got = ev->event;
	rdma_ack_cm_event(ev);
	if (got != want) {
		say("hostile: %s where %s was due", rdma_event_str(got), rdma_event_str(want));
		return -1;
	}
	return 0;
}

/* The answer to our request: 0 accepted (the server's buffers and
 * challenge kept), 1 refused (said), -1 none. */
static int answer(struct hc *c, int ms)
{
	struct rdma_cm_event *ev;
	if (cm_wait(c->ch, ms, &ev) < 0) {
		say("hostile: no answer to the upgrade request in %d ms", ms);
		return -1;
	}
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
		say("hostile: upgrade request refused: %s (status %d, reason %d)",
		    rdma_event_str(ev->event), ev->status,
		    sv_cm_rej_decode(ev->param.conn.private_data, ev->param.conn.private_data_len));
		rdma_ack_cm_event(ev);
		return 1;
	}
	int r = sv_cm_rep_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
				 &c->rep);
	rdma_ack_cm_event(ev);
	if (r < 0) {
		say("hostile: the server's answer is not libsovia's (%d)", r);
		return -1;
	}
	hq_set_peer(c->q, c->rep.nrecv, c->rep.buf_size);
	say("hostile: upgrade accepted: the server posted %u buffers of %u bytes", c->rep.nrecv,
	    c->rep.buf_size);
	return 0;
}

int hc_request(struct hc *c, const struct hc_opts *o)
{
	struct sockaddr_storage src = c->local;
	((struct sockaddr_in *)&src)->sin_port = 0;
	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP) < 0 ||
	    rdma_resolve_addr(c->id, (struct sockaddr *)&src, (struct sockaddr *)&c->peer, 2000) < 0 ||
	    expect(c, RDMA_CM_EVENT_ADDR_RESOLVED, 10000) < 0 ||
	    rdma_resolve_route(c->id, 2000) < 0 || expect(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000) < 0) {
		say("hostile: no RDMA route to the server");
		return -1;
	}
	c->q = hq_new(c->id, &o->qp, on_msg, c);
	if (!c->q)
		return -1;
	c->req = (struct sv_cm_req){.version = SV_CM_VERSION, .nrecv = (uint16_t)o->qp.nrecv,
				    .buf_size = o->qp.rbuf, .client = c->local, .server = c->peer};
	if (getrandom(c->req.challenge, SV_CHALLENGE_SIZE, 0) != SV_CHALLENGE_SIZE)
		return -1;
	uint8_t pd[SV_CM_REQ_MAX];
	int len = sv_cm_req_encode(&c->req, pd);
	struct rdma_conn_param cp = {.private_data = pd, .private_data_len = (uint8_t)len,
				     .retry_count = 7, .rnr_retry_count = (uint8_t)o->rnr_retry};
	if (len < 0 || rdma_connect(c->id, &cp) < 0) {
		say("hostile: rdma_connect: %s", strerror(errno));
		return -1;
	}
	int r = answer(c, o->timeout_ms);
	/* From now on the channel is looked at between other things. */
	fcntl(c->ch->fd, F_SETFL, fcntl(c->ch->fd, F_GETFL) | O_NONBLOCK);
	fcntl(c->tcp, F_SETFL, fcntl(c->tcp, F_GETFL) | O_NONBLOCK);
	return r;
}

/* ---- Running it ------------------------------------------------------------ */

static int cm_events(struct hc *c)
{
	struct rdma_cm_event *ev;
	int n = 0;
	while (rdma_get_cm_event(c->ch, &ev) == 0) {
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED && !c->disconnected) {
			c->disconnected = true;
			say("hostile: the server disconnected the QP");
		}
		rdma_ack_cm_event(ev);
		n++;
	}
	return n;
}

/* The server's echo of our challenge sits right after its switch point. */
static void check_echo(struct hc *c)
{
	if (!c->srv_switch || c->srv_proven ||
	    c->tcp_in.len < c->srv_switch_seq + SV_CHALLENGE_SIZE)
		return;
	bool ok = memcmp(c->tcp_in.p + c->srv_switch_seq, c->req.challenge, SV_CHALLENGE_SIZE) == 0;
	c->srv_proven = ok ? 1 : -1;
	say("hostile: the server switched at %llu of its stream and echoed our challenge %s",
	    (unsigned long long)c->srv_switch_seq, ok ? "right" : "WRONG");
}

void hc_pump(struct hc *c, int ms)
{
	size_t got = (size_t)hq_poll(c->q) + tcp_read(c) + (size_t)cm_events(c);
	check_echo(c);
	hq_update(c->q);
	if (got || !ms)
		return;
	struct pollfd fds[2] = {{c->tcp, c->tcp_eof ? 0 : POLLIN, 0}, {c->ch->fd, POLLIN, 0}};
	hq_sleep(c->q, fds, 2, ms);
}

int hc_switch(struct hc *c, uint64_t seq, bool echo)
{
	uint64_t deadline = now_ms() + 30000;
	int r;
	while ((r = hq_send(c->q, SV_MSG_TO_RDMA, seq, NULL, 0)) == -EAGAIN && now_ms() < deadline)
		hc_pump(c, 10);
	/* The echo goes only once the TO_RDMA is in the server's completion
	 * queue, as libsovia's client does (protocol.md, 3.5). */
	while (r == 0 && !hq_sends_done(c->q) && !hq_failed(c->q) && now_ms() < deadline)
		hc_pump(c, 10);
	if (r < 0 || !hq_sends_done(c->q) || hq_failed(c->q)) {
		say("hostile: our TO_RDMA did not complete (%d, status %d)", r, hq_failed(c->q));
		return -1;
	}
	if (echo && hc_tcp_write(c, c->rep.challenge, SV_CHALLENGE_SIZE) < 0)
		return -1;
	return 0;
}

int hc_wait_proven(struct hc *c, int ms)
{
	uint64_t deadline = now_ms() + (uint64_t)ms;
	while (!c->srv_proven && !c->tcp_eof && !c->srv_reset && !hq_failed(c->q) &&
	       now_ms() < deadline)
		hc_pump(c, 50);
	if (c->srv_proven == 1)
		return 0;
	say("hostile: the server never switched its sending (reset %s, TCP %s, QP status %d)",
	    c->srv_reset ? "yes" : "no", c->tcp_eof ? "ended" : "open", hq_failed(c->q));
	return -1;
}

static bool put(FILE *f, const uint8_t *p, size_t n)
{
	return !n || fwrite(p, 1, n, f) == n;
}

int hc_save_stream(const struct hc *c, const char *path, size_t skip)
{
	if (!path)
		return 0;
	FILE *f = fopen(path, "we");
	if (!f)
		return -1;
	size_t sw = c->srv_switch && c->srv_switch_seq < c->tcp_in.len ? (size_t)c->srv_switch_seq
								       : c->tcp_in.len;
	size_t after = skip < c->tcp_in.len - sw ? sw + skip : c->tcp_in.len;
	bool ok = put(f, c->tcp_in.p, sw) && put(f, c->srv_qp.p, c->srv_qp.len) &&
		  (after == c->tcp_in.len || put(f, c->tcp_in.p + after, c->tcp_in.len - after));
	return fclose(f) == 0 && ok ? 0 : -1;
}

void hc_close(struct hc *c)
{
	if (c->id && c->q)
		rdma_disconnect(c->id);
	hq_free(c->q);
	if (c->id)
		rdma_destroy_id(c->id);
	if (c->ch)
		rdma_destroy_event_channel(c->ch);
	if (c->tcp >= 0)
		close(c->tcp);
	bytes_free(&c->tcp_in);
	bytes_free(&c->srv_qp);
	c->q = NULL;
	c->id = NULL;
	c->ch = NULL;
	c->tcp = -1;
}
