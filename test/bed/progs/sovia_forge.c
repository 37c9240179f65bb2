/* An attacker for the hijack test: it knows the 4-tuple of a TCP connection
 * between two other processes and asks the server's libsovia to attach an
 * RDMA queue pair to it, then announces a switch and sends data over the
 * QP. libsovia must never deliver that data to the application nor send the
 * connection's data to the attacker.
 *
 *   sovia-forge -a SERVER_IP -p PORT -C CLIENT_IP -P CLIENT_PORT -N TCP_BYTES [-t SECONDS]
 *
 * Prints what happened; exit 0 if the test could be carried out (accepted
 * or rejected), 1 on a local failure. */
#include "cmdata.h"
#include "config.h"
#include "proto.h"
#include "clock.h"
#include "verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct rdma_event_channel *ch;

static int wait_event(enum rdma_cm_event_type want, struct rdma_cm_event **out)
{
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	if (poll(&pfd, 1, 10000) <= 0) {
		fprintf(stderr, "forge: no rdma_cm event\n");
		return -1;
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev) < 0)
		return -1;
	if (ev->event != want) {
		*out = ev;
		return 1;
	}
	*out = ev;
	return 0;
}

static int ip4(const char *s, uint16_t port, struct sockaddr_storage *ss)
{
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	memset(ss, 0, sizeof(*ss));
	in->sin_family = AF_INET;
	in->sin_port = htons(port);
	return inet_pton(AF_INET, s, &in->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	const char *srv = NULL, *cli = NULL;
	int port = 0, cport = 0, secs = 5;
	long long nbytes = 0;
	int o;
	while ((o = getopt(argc, argv, "a:p:C:P:N:t:")) != -1) {
		switch (o) {
		case 'a': srv = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'C': cli = optarg; break;
		case 'P': cport = atoi(optarg); break;
		case 'N': nbytes = atoll(optarg); break;
		case 't': secs = atoi(optarg); break;
		default: return 1;
		}
	}
	struct sv_cm_req req = {.version = SV_CM_VERSION};
	if (!srv || !cli || ip4(cli, (uint16_t)cport, &req.client) < 0 ||
	    ip4(srv, (uint16_t)port, &req.server) < 0) {
		fprintf(stderr, "usage: sovia-forge -a SERVER_IP -p PORT -C CLIENT_IP -P CLIENT_PORT "
				"-N TCP_BYTES [-t SECONDS]\n");
		return 1;
	}
	sv_config_defaults(&sv_cfg);
	ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) < 0 ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&req.server, 2000) < 0 ||
	    wait_event(RDMA_CM_EVENT_ADDR_RESOLVED, &ev) != 0) {
		fprintf(stderr, "forge: cannot resolve the server\n");
		return 1;
	}
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000) < 0 || wait_event(RDMA_CM_EVENT_ROUTE_RESOLVED, &ev) != 0)
		return 1;
	rdma_ack_cm_event(ev);

	struct sv_proto_params prm;
	sv_config_proto_params(&sv_cfg, &prm);
	prm.coalesce = false;
	struct sv_verbs *v;
	struct sv_proto *p;
	if (sv_verbs_create(&v, id, &prm) < 0)
		return 1;
	struct sv_xport xp = sv_verbs_xport(v);
	if (sv_proto_new(&p, &prm, &xp) < 0)
		return 1;
	req.nrecv = (uint16_t)sv_proto_nrecv(&prm);
	req.buf_size = prm.buf_size;
	for (int i = 0; i < SV_CHALLENGE_SIZE; i++)
		req.challenge[i] = (uint8_t)rand();
	uint8_t pd[SV_CM_REQ_MAX];
	int len = sv_cm_req_encode(&req, pd);
	struct rdma_conn_param cp = {.private_data = pd, .private_data_len = (uint8_t)len,
				     .retry_count = 7, .rnr_retry_count = 7,
				     .qp_num = sv_verbs_qp_num(v)};
	if (rdma_connect(id, &cp) < 0)
		return 1;
	/* The QP is libsovia's own (src/verbs.h): made ready on the answer. */
	int r = wait_event(RDMA_CM_EVENT_CONNECT_RESPONSE, &ev);
	if (r == 0 && (sv_verbs_connected(v) < 0 || rdma_establish(id) < 0))
		return 1;
	if (r != 0) {
		printf("forge: request refused (%s)\n", r > 0 ? rdma_event_str(ev->event) : "none");
		return 0;
	}
	struct sv_cm_rep rep;
	if (sv_cm_rep_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, &rep) < 0)
		return 1;
	rdma_ack_cm_event(ev);
	sv_proto_set_peer(p, rep.nrecv, rep.buf_size);
	printf("forge: the request was accepted at the rdma_cm level\n");

	/* Announce a switch at the guessed offset and inject data. */
	struct sv_clock clk = SV_CLOCK_INIT;
	if (sv_proto_send_to_rdma(p, (uint64_t)nbytes, &clk) < 0)
		return 1;
	const char inject[] = "INJECTED BY FORGE\n";
	struct iovec iov = {(void *)inject, sizeof(inject) - 1};
	long sent = sv_proto_send(p, &iov, 1, 0, &clk);
	printf("forge: announced a switch at %lld and sent %ld bytes\n", nbytes, sent);

	/* Watch what comes back for a while. */
	uint64_t end = sv_now_us() + (uint64_t)secs * 1000000u;
	bool disconnected = false;
	while (sv_now_us() < end && !disconnected) {
		if (sv_verbs_poll(v, p, &(struct sv_clock)SV_CLOCK_INIT) < 0)
			break;
		struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
		if (poll(&pfd, 1, 50) > 0 && rdma_get_cm_event(ch, &ev) == 0) {
			disconnected = ev->event == RDMA_CM_EVENT_DISCONNECTED;
			rdma_ack_cm_event(ev);
		}
	}
	printf("forge: server sent %llu data bytes; server reset=%s; disconnected=%s\n",
	       (unsigned long long)sv_proto_stats(p)->rx_bytes, sv_proto_error(p) ? "yes" : "no",
	       disconnected ? "yes" : "no");
	return 0;
}
