/* Upgrade requests from anyone who reaches the port over RDMA: the server
 * keeps a bounded number waiting for their accept(), tells the rest to ask
 * again, and its accepted connections go on regardless. */
#include "cm.h"
#include "cmdata.h"
#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

TestSuite(flood, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* The bounds of upgrade_server.c (SV_PENDING_PER_HOST): all from one host. */
#define PER_HOST 1024
#define EXTRA 7

static void loopback(struct sockaddr_storage *ss, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	in->sin_port = htons(port);
}

/* A request for a TCP connection nobody accepted (client port cport). */
static void request(struct rdma_event_channel *ch, uint16_t port, uint16_t cport)
{
	struct rdma_cm_id *id;
	cr_assert_eq(sv_cm->create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
	struct sv_cm_req req = {.version = SV_CM_VERSION, .nrecv = 64, .buf_size = 4096};
	loopback(&req.client, cport);
	loopback(&req.server, port);
	memset(req.challenge, 0x5a, sizeof(req.challenge));
	struct sockaddr_storage src, dst;
	loopback(&src, 0);
	loopback(&dst, port);
	cr_assert_eq(sv_cm->resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst,
					 2000), 0);
	uint8_t pd[SV_CM_REQ_MAX];
	int len = sv_cm_req_encode(&req, pd);
	cr_assert_gt(len, 0);
	struct rdma_conn_param cp = {.private_data = pd, .private_data_len = (uint8_t)len};
	cr_assert_eq(sv_cm->connect_id(id, &cp), 0);
}

/* Rejections that said "busy" within ms milliseconds, until `want`. */
static int busy_answers(struct rdma_event_channel *ch, int want, int ms)
{
	int busy = 0;
	uint64_t end = h_ms() + (uint64_t)ms;
	while (busy < want && h_ms() < end) {
		struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
		poll(&pfd, 1, 50);
		struct rdma_cm_event *ev;
		while (sv_cm->get_event(ch, &ev) == 0) {
			if (ev->event == RDMA_CM_EVENT_REJECTED &&
			    sv_cm_rej_decode(ev->param.conn.private_data,
					     ev->param.conn.private_data_len) == SV_CM_REJ_BUSY)
				busy++;
			sv_cm->ack_event(ev);
		}
	}
	return busy;
}

Test(flood, requests_past_the_bound_are_told_to_ask_again)
{
	struct pair p;
	h_pair_rdma(&p); /* the server's RDMA listener is up */
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p.lfd, (struct sockaddr *)&a, &al), 0);
	uint16_t port = ntohs(a.sin_port);
	struct rdma_event_channel *ch = sv_cm->create_event_channel();
	cr_assert_not_null(ch);
	for (int i = 0; i < PER_HOST + EXTRA; i++)
		request(ch, port, (uint16_t)(20000 + i));
	/* The first PER_HOST wait for an accept() that never comes (until
	 * SOVIA_UPGRADE_TIMEOUT_MS); each one past them is told at once. */
	int busy = busy_answers(ch, EXTRA, 20000);
	cr_assert_eq(busy, EXTRA, "%d requests were told to ask again, want %d", busy, EXTRA);
	busy = busy_answers(ch, 1, 300);
	cr_assert_eq(busy, 0, "a request within the bound was told to ask again");
	/* The accepted connection is unharmed. */
	const char msg[] = "still here";
	char got[sizeof(msg)];
	long end;
	cr_assert_eq(h_write_all(p.c, msg, sizeof(msg)), (long)sizeof(msg));
	cr_assert_eq(h_read_all(p.s, got, sizeof(got), &end), sizeof(got));
	cr_assert_eq(memcmp(got, msg, sizeof(msg)), 0);
	cr_assert_eq(h_state(p.s), SV_CONN_RDMA);
	h_pair_free(&p);
}
