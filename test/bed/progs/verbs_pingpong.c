/*
 * sovia-verbs-pingpong: the smallest end-to-end proof that the RDMA stack
 * works — librdmacm connection setup, an RC queue pair, a CQ with a
 * completion channel, registered memory and SEND/RECV with pre-posted
 * receives.
 *
 *   server: sovia-verbs-pingpong -s [-a ADDR] [-p PORT] [-n ITERS] [-S SIZE] [-t SEC]
 *   client: sovia-verbs-pingpong -a ADDR [-p PORT] [-n ITERS] [-S SIZE] [-t SEC]
 *
 * Each iteration the client sends SIZE bytes of a pattern derived from
 * (iteration, offset); the server verifies them and replies with every byte
 * XORed with 0x5a; the client verifies the reply and records the round trip.
 *
 * Exit status: 0 success, 1 any failure (message names the step), 2 data
 * mismatch. Helpers return 0 or -errno; VERIFY_FAILED marks a mismatch.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define XOR_BYTE 0x5a
#define EVENT_TIMEOUT_MS 30000 /* bound on any single CM event or completion */
#define RESOLVE_TIMEOUT_MS 2000
#define MAX_SIZE (1 << 20)
#define VERIFY_FAILED 1

struct ctx {
	/* options */
	int server, iters, size, timeout_s;
	const char *addr, *port;
	/* resources, created in this order and destroyed in reverse */
	struct rdma_event_channel *ec;
	struct rdma_cm_id *listen_id; /* server only */
	struct rdma_cm_id *id;        /* the connected id */
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	uint8_t *buf; /* [0, size) receive buffer, [size, 2 * size) send buffer */
	struct ibv_mr *mr;
	/* completion bookkeeping (cumulative) */
	long sends_done, recvs_done;
	/* client retries: suppress retryable CM errors, keep the last one */
	int quiet;
	int peer_gone; /* DISCONNECTED already consumed by wait_completions() */
	char last_err[192];
};

static int report_errno(const char *step)
{
	int err = errno ? errno : EIO;
	fprintf(stderr, "verbs-pingpong: %s failed: %s\n", step, strerror(err));
	return -err;
}

static uint8_t pattern(long iter, long off)
{
	uint32_t x = (uint32_t)iter * 2654435761u ^ (uint32_t)off * 40503u;
	x ^= x >> 15;
	return (uint8_t)(x ^ (x >> 8));
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* poll() fds for input; -ETIMEDOUT if nothing within timeout_ms. */
static int wait_readable(struct pollfd *pfd, int nfds, int timeout_ms)
{
	int n;

	do
		n = poll(pfd, (nfds_t)nfds, timeout_ms);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == 0 ? -ETIMEDOUT : 0;
}

/*
 * Wait for a CM event of type `want`. With `out` the event is handed to the
 * caller (who acks it), otherwise it is acked here. An unexpected event maps
 * to -ECONNREFUSED (REJECTED), -EHOSTUNREACH (address/route/unreachable) or
 * -EPROTO, which lets the client decide whether to retry.
 */
static int expect_event(struct ctx *c, enum rdma_cm_event_type want, int timeout_ms,
			const char *step, struct rdma_cm_event **out)
{
	struct pollfd pfd = { .fd = c->ec->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int ret = wait_readable(&pfd, 1, timeout_ms);

	if (ret) {
		fprintf(stderr, "verbs-pingpong: %s: no %s event within %d ms: %s\n", step,
			rdma_event_str(want), timeout_ms, strerror(-ret));
		return ret;
	}
	if (rdma_get_cm_event(c->ec, &ev))
		return report_errno("rdma_get_cm_event");
	if (ev->event == want) {
		if (out)
			*out = ev;
		else
			rdma_ack_cm_event(ev);
		return 0;
	}
	/* REJECTED carries a CM reject reason (8: no listener), the rest -errno. */
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		snprintf(c->last_err, sizeof(c->last_err), "%s: got %s (reject reason %d), wanted %s",
			 step, rdma_event_str(ev->event), ev->status, rdma_event_str(want));
	else
		snprintf(c->last_err, sizeof(c->last_err), "%s: got %s (status %d: %s), wanted %s",
			 step, rdma_event_str(ev->event), ev->status,
			 strerror(ev->status < 0 ? -ev->status : ev->status), rdma_event_str(want));
	switch (ev->event) {
	case RDMA_CM_EVENT_REJECTED:
		ret = -ECONNREFUSED;
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		ret = -EHOSTUNREACH;
		break;
	default:
		ret = -EPROTO;
	}
	if (!c->quiet || ret == -EPROTO)
		fprintf(stderr, "verbs-pingpong: %s\n", c->last_err);
	rdma_ack_cm_event(ev);
	return ret;
}

static int post_recv(struct ctx *c)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf, .length = c->size, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(c->id->qp, &wr, &bad);

	if (ret)
		fprintf(stderr, "verbs-pingpong: ibv_post_recv failed: %s\n", strerror(ret));
	return -ret;
}

static int post_send(struct ctx *c)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(c->buf + c->size), .length = c->size,
			       .lkey = c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	int ret = ibv_post_send(c->id->qp, &wr, &bad);

	if (ret)
		fprintf(stderr, "verbs-pingpong: ibv_post_send failed: %s\n", strerror(ret));
	return -ret;
}

/*
 * Reap completions until at least `sends` sends and `recvs` receives have
 * completed in total. The CQ stays armed: every consumed channel event is
 * acked and re-armed before polling again, so a completion can't slip by.
 * The CM channel is watched too, so a peer that disconnects mid-run (e.g.
 * after a failed check) is noticed at once instead of after the timeout.
 */
static int wait_completions(struct ctx *c, long sends, long recvs)
{
	while (c->sends_done < sends || c->recvs_done < recvs) {
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(c->cq, 4, wc);

		if (n < 0) {
			fprintf(stderr, "verbs-pingpong: ibv_poll_cq failed: %d\n", n);
			return -EIO;
		}
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "verbs-pingpong: %s completion failed: %s (vendor_err 0x%x)\n",
					wc[i].wr_id == 1 ? "receive" : "send",
					ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
				return -EIO;
			}
			if (wc[i].opcode == IBV_WC_SEND && wc[i].wr_id == 2) {
				c->sends_done++;
			} else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 1) {
				if (wc[i].byte_len != (uint32_t)c->size) {
					fprintf(stderr, "verbs-pingpong: received %u bytes, expected %d\n",
						wc[i].byte_len, c->size);
					return -EPROTO;
				}
				c->recvs_done++;
			} else {
				fprintf(stderr, "verbs-pingpong: unexpected completion opcode %d wr_id %llu\n",
					wc[i].opcode, (unsigned long long)wc[i].wr_id);
				return -EPROTO;
			}
		}
		if (n > 0)
			continue;

		/* CQ drained: sleep on the completion channel (and the CM one). */
		struct pollfd pfd[2] = { { .fd = c->cc->fd, .events = POLLIN },
					 { .fd = c->ec->fd, .events = POLLIN } };
		struct rdma_cm_event *ev;
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		int ret = wait_readable(pfd, 2, EVENT_TIMEOUT_MS);

		if (ret) {
			fprintf(stderr, "verbs-pingpong: waiting for completion: %s after %d ms "
				"(sends %ld/%ld, receives %ld/%ld)\n", strerror(-ret),
				EVENT_TIMEOUT_MS, c->sends_done, sends, c->recvs_done, recvs);
			return ret;
		}
		if (!pfd[0].revents) { /* only a CM event: the connection went away */
			if (rdma_get_cm_event(c->ec, &ev))
				return report_errno("rdma_get_cm_event");
			fprintf(stderr, "verbs-pingpong: waiting for completion: got %s "
				"(sends %ld/%ld, receives %ld/%ld)\n", rdma_event_str(ev->event),
				c->sends_done, sends, c->recvs_done, recvs);
			c->peer_gone = ev->event == RDMA_CM_EVENT_DISCONNECTED;
			rdma_ack_cm_event(ev);
			return -ECONNRESET;
		}
		if (ibv_get_cq_event(c->cc, &ev_cq, &ev_ctx))
			return report_errno("ibv_get_cq_event");
		ibv_ack_cq_events(ev_cq, 1);
		if ((ret = ibv_req_notify_cq(c->cq, 0))) {
			fprintf(stderr, "verbs-pingpong: ibv_req_notify_cq failed: %s\n", strerror(ret));
			return -ret;
		}
	}
	return 0;
}

/* PD, completion channel, CQ, buffer + MR and the RC QP on c->id; then the
 * first receive is pre-posted so it is in place before the connection is. */
static int setup_verbs(struct ctx *c)
{
	struct ibv_context *verbs = c->id->verbs;
	struct ibv_qp_init_attr qpa = { 0 };
	int ret;

	if (!verbs) {
		fprintf(stderr, "verbs-pingpong: cm id is not bound to an RDMA device\n");
		return -ENODEV;
	}
	if (!(c->pd = ibv_alloc_pd(verbs)))
		return report_errno("ibv_alloc_pd");
	if (!(c->cc = ibv_create_comp_channel(verbs))) {
		ret = report_errno("ibv_create_comp_channel");
		goto dealloc_pd;
	}
	if (!(c->cq = ibv_create_cq(verbs, 8, c, c->cc, 0))) {
		ret = report_errno("ibv_create_cq");
		goto destroy_comp_channel;
	}
	if ((ret = -ibv_req_notify_cq(c->cq, 0))) {
		fprintf(stderr, "verbs-pingpong: ibv_req_notify_cq failed: %s\n", strerror(-ret));
		goto destroy_cq;
	}
	if (!(c->buf = calloc(2, (size_t)c->size))) {
		ret = report_errno("allocating buffers");
		goto destroy_cq;
	}
	if (!(c->mr = ibv_reg_mr(c->pd, c->buf, 2 * (size_t)c->size, IBV_ACCESS_LOCAL_WRITE))) {
		ret = report_errno("ibv_reg_mr");
		goto free_buf;
	}
	qpa.send_cq = qpa.recv_cq = c->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.cap.max_send_wr = qpa.cap.max_recv_wr = 2;
	qpa.cap.max_send_sge = qpa.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &qpa)) {
		ret = report_errno("rdma_create_qp");
		goto dereg_mr;
	}
	c->sends_done = c->recvs_done = 0;
	if ((ret = post_recv(c)))
		goto destroy_qp;
	return 0;

destroy_qp:
	rdma_destroy_qp(c->id);
dereg_mr:
	ibv_dereg_mr(c->mr);
	c->mr = NULL;
free_buf:
	free(c->buf);
	c->buf = NULL;
destroy_cq:
	ibv_destroy_cq(c->cq);
	c->cq = NULL;
destroy_comp_channel:
	ibv_destroy_comp_channel(c->cc);
	c->cc = NULL;
dealloc_pd:
	ibv_dealloc_pd(c->pd);
	c->pd = NULL;
	return ret;
}

static void teardown_verbs(struct ctx *c)
{
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->mr);
	free(c->buf);
	ibv_destroy_cq(c->cq);
	ibv_destroy_comp_channel(c->cc);
	ibv_dealloc_pd(c->pd);
	c->mr = NULL, c->buf = NULL, c->cq = NULL, c->cc = NULL, c->pd = NULL;
}

static void fill_conn_param(struct rdma_conn_param *p)
{
	memset(p, 0, sizeof(*p));
	p->retry_count = 7;
	p->rnr_retry_count = 7; /* receives are always reposted before sending */
}

/* One client connection attempt; on failure everything it made is undone. */
static int client_attempt(struct ctx *c, struct sockaddr *dst)
{
	struct rdma_conn_param param;
	int ret;

	if (rdma_create_id(c->ec, &c->id, NULL, RDMA_PS_TCP))
		return report_errno("rdma_create_id");
	if (rdma_resolve_addr(c->id, NULL, dst, RESOLVE_TIMEOUT_MS)) {
		ret = report_errno("rdma_resolve_addr");
		goto destroy_id;
	}
	if ((ret = expect_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, EVENT_TIMEOUT_MS, "resolve address", NULL)))
		goto destroy_id;
	if (rdma_resolve_route(c->id, RESOLVE_TIMEOUT_MS)) {
		ret = report_errno("rdma_resolve_route");
		goto destroy_id;
	}
	if ((ret = expect_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, EVENT_TIMEOUT_MS, "resolve route", NULL)))
		goto destroy_id;
	if ((ret = setup_verbs(c)))
		goto destroy_id;
	fill_conn_param(&param);
	if (rdma_connect(c->id, &param)) {
		ret = report_errno("rdma_connect");
		goto teardown_verbs;
	}
	if ((ret = expect_event(c, RDMA_CM_EVENT_ESTABLISHED, EVENT_TIMEOUT_MS, "connect", NULL)))
		goto teardown_verbs;
	return 0;

teardown_verbs:
	teardown_verbs(c);
destroy_id:
	rdma_destroy_id(c->id);
	c->id = NULL;
	return ret;
}

/* Retry while the server isn't up yet (refused/unreachable), up to -t s. */
static int client_connect(struct ctx *c, struct sockaddr *dst)
{
	double start = now_us(), deadline = start + c->timeout_s * 1e6;
	int attempts = 0, ret;

	c->quiet = 1;
	for (;;) {
		attempts++;
		ret = client_attempt(c, dst);
		if (ret != -ECONNREFUSED && ret != -EHOSTUNREACH) {
			if (!ret && attempts > 1)
				fprintf(stderr, "verbs-pingpong: connected after %d attempts (%.1f s)\n",
					attempts, (now_us() - start) / 1e6);
			break;
		}
		if (now_us() + 250e3 > deadline) {
			fprintf(stderr, "verbs-pingpong: connect: giving up after %d attempts in %d s; "
				"last error: %s\n", attempts, c->timeout_s, c->last_err);
			break;
		}
		usleep(250 * 1000);
	}
	c->quiet = 0;
	return ret;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int run_client(struct ctx *c)
{
	uint8_t *rx = c->buf, *tx = c->buf + c->size;
	double *rtt = calloc((size_t)c->iters, sizeof(*rtt));
	int ret = 0;

	if (!rtt)
		return report_errno("allocating RTT samples");
	for (long i = 0; i < c->iters && !ret; i++) {
		for (long off = 0; off < c->size; off++)
			tx[off] = pattern(i, off);
		double t0 = now_us();
		if ((ret = post_send(c)) || (ret = wait_completions(c, i + 1, i + 1)))
			break;
		rtt[i] = now_us() - t0;
		for (long off = 0; off < c->size; off++) {
			if (rx[off] != (uint8_t)(pattern(i, off) ^ XOR_BYTE)) {
				fprintf(stderr, "verbs-pingpong: reply mismatch at iteration %ld offset %ld: "
					"got 0x%02x, expected 0x%02x\n", i, off, rx[off],
					pattern(i, off) ^ XOR_BYTE);
				ret = VERIFY_FAILED;
				break;
			}
		}
		if (!ret)
			ret = post_recv(c); /* for the next reply, before the next send */
	}
	if (!ret) {
		qsort(rtt, (size_t)c->iters, sizeof(*rtt), cmp_double);
		printf("verbs-pingpong: OK %d iterations of %d bytes, median RTT %.1f us\n",
		       c->iters, c->size, rtt[c->iters / 2]);
	}
	free(rtt);
	return ret;
}

static int run_server(struct ctx *c)
{
	uint8_t *rx = c->buf, *tx = c->buf + c->size;
	int ret;

	for (long i = 0; i < c->iters; i++) {
		if ((ret = wait_completions(c, i, i + 1)))
			return ret;
		for (long off = 0; off < c->size; off++) {
			if (rx[off] != pattern(i, off)) {
				fprintf(stderr, "verbs-pingpong: request mismatch at iteration %ld offset %ld: "
					"got 0x%02x, expected 0x%02x\n", i, off, rx[off], pattern(i, off));
				return VERIFY_FAILED;
			}
			tx[off] = rx[off] ^ XOR_BYTE;
		}
		/* Repost the receive before replying: the next request may follow at once. */
		if ((ret = post_recv(c)) || (ret = post_send(c)) || (ret = wait_completions(c, i + 1, i + 1)))
			return ret;
	}
	printf("verbs-pingpong: server OK %d iterations of %d bytes\n", c->iters, c->size);
	return 0;
}

/* Orderly disconnect. On success the client initiates and the server waits
 * for it; after a failure either side disconnects first. */
static void disconnect(struct ctx *c, int wait_for_peer)
{
	if (c->peer_gone) {
		rdma_disconnect(c->id);
		return;
	}
	if (wait_for_peer) {
		expect_event(c, RDMA_CM_EVENT_DISCONNECTED, EVENT_TIMEOUT_MS, "wait for client disconnect", NULL);
		rdma_disconnect(c->id); /* acknowledges the peer's; may fail harmlessly */
		return;
	}
	if (rdma_disconnect(c->id)) {
		report_errno("rdma_disconnect");
		return;
	}
	expect_event(c, RDMA_CM_EVENT_DISCONNECTED, EVENT_TIMEOUT_MS, "disconnect", NULL);
}

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s -s [-a ADDR] [-p PORT] [-n ITERS] [-S SIZE] [-t SEC]   (server)\n"
		"       %s -a ADDR [-p PORT] [-n ITERS] [-S SIZE] [-t SEC]        (client)\n"
		"  -p PORT  rdma_cm port (default 7471)   -n ITERS  iterations (default 1000)\n"
		"  -S SIZE  message bytes (default 64, max %d)\n"
		"  -t SEC   client: connect retry window (default 10);\n"
		"           server: how long to wait for a client (default 60)\n",
		argv0, argv0, MAX_SIZE);
}

static int parse_int(const char *s, int min, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	struct ctx c = { .iters = 1000, .size = 64, .timeout_s = -1, .port = "7471" };
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV }, *ai;
	struct rdma_conn_param param;
	struct rdma_cm_event *ev;
	int opt, ret, gai;

	while ((opt = getopt(argc, argv, "sa:p:n:S:t:h")) != -1) {
		switch (opt) {
		case 's': c.server = 1; break;
		case 'a': c.addr = optarg; break;
		case 'p': c.port = optarg; break;
		case 'n': if (parse_int(optarg, 1, 100000000, &c.iters)) goto bad_usage; break;
		case 'S': if (parse_int(optarg, 1, MAX_SIZE, &c.size)) goto bad_usage; break;
		case 't': if (parse_int(optarg, 0, 86400, &c.timeout_s)) goto bad_usage; break;
		case 'h': usage(argv[0]); return 0;
		default: goto bad_usage;
		}
	}
	if (optind != argc || (!c.server && !c.addr))
		goto bad_usage;
	if (c.timeout_s < 0)
		c.timeout_s = c.server ? 60 : 10;

	if (c.server)
		hints.ai_flags |= AI_PASSIVE;
	if ((gai = getaddrinfo(c.addr, c.port, &hints, &ai))) {
		fprintf(stderr, "verbs-pingpong: getaddrinfo %s:%s failed: %s\n",
			c.addr ? c.addr : "*", c.port, gai_strerror(gai));
		return 1;
	}
	if (!(c.ec = rdma_create_event_channel())) {
		ret = report_errno("rdma_create_event_channel");
		goto free_addrinfo;
	}

	if (!c.server) {
		if ((ret = client_connect(&c, ai->ai_addr)))
			goto destroy_channel;
		ret = run_client(&c);
		disconnect(&c, 0);
		goto teardown_verbs;
	}

	if (rdma_create_id(c.ec, &c.listen_id, NULL, RDMA_PS_TCP)) {
		ret = report_errno("rdma_create_id");
		goto destroy_channel;
	}
	if (rdma_bind_addr(c.listen_id, ai->ai_addr)) {
		ret = report_errno("rdma_bind_addr");
		goto destroy_listen_id;
	}
	if (rdma_listen(c.listen_id, 1)) {
		ret = report_errno("rdma_listen");
		goto destroy_listen_id;
	}
	if ((ret = expect_event(&c, RDMA_CM_EVENT_CONNECT_REQUEST, c.timeout_s * 1000,
				"wait for client", &ev)))
		goto destroy_listen_id;
	c.id = ev->id; /* the new connection's id; the event can go now */
	rdma_ack_cm_event(ev);
	if ((ret = setup_verbs(&c))) {
		rdma_reject(c.id, NULL, 0);
		goto destroy_id;
	}
	fill_conn_param(&param);
	if (rdma_accept(c.id, &param)) {
		ret = report_errno("rdma_accept");
		goto teardown_verbs;
	}
	if ((ret = expect_event(&c, RDMA_CM_EVENT_ESTABLISHED, EVENT_TIMEOUT_MS, "accept", NULL)))
		goto teardown_verbs;
	ret = run_server(&c);
	disconnect(&c, ret == 0);

teardown_verbs:
	teardown_verbs(&c);
destroy_id:
	rdma_destroy_id(c.id);
destroy_listen_id:
	if (c.listen_id)
		rdma_destroy_id(c.listen_id);
destroy_channel:
	rdma_destroy_event_channel(c.ec);
free_addrinfo:
	freeaddrinfo(ai);
	return ret == 0 ? 0 : ret == VERIFY_FAILED ? 2 : 1;

bad_usage:
	usage(argv[0]);
	return 1;
}
