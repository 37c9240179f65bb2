/* Listeners of every address family the kernel accepts on: an IPv6
 * wildcard with IPV6_V6ONLY off (what Node, Java, Go and Debian's ftpd -D
 * listen on) serves IPv4 clients through IPv4-mapped addresses, a socket
 * bound to a mapped address (ftpd's passive listener on such a session)
 * as well, and an IPv6-only listener leaves IPv4 to another socket on the
 * same port. The fake network binds and routes as rdma_cm does: never an
 * IPv4-mapped address, and an IPv6 wildcard takes IPv4 requests unless
 * afonly. */
#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(family, .init = h_setup, .fini = h_teardown, .timeout = 60);

static void to_addr(const char *text, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		*len = sizeof(*in);
		return;
	}
	cr_assert_eq(inet_pton(AF_INET6, text, &in6->sin6_addr), 1, "%s", text);
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(port);
	*len = sizeof(*in6);
}

/* A listening socket on `addr` (port `port`, 0: any), IPV6_V6ONLY as
 * `v6only` for an IPv6 one, with its RDMA listener; its port. */
static uint16_t listen_on(struct pair *p, const char *addr, uint16_t port, int v6only)
{
	struct sockaddr_storage ss;
	socklen_t len;
	to_addr(addr, port, &ss, &len);
	p->cfd = p->sfd = -1;
	p->lfd = socket(ss.ss_family, SOCK_STREAM, 0);
	cr_assert_geq(p->lfd, 0);
	int one = 1;
	setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss.ss_family == AF_INET6)
		cr_assert_eq(setsockopt(p->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only)), 0);
	cr_assert_eq(bind(p->lfd, (struct sockaddr *)&ss, len), 0, "bind %s: %m", addr);
	cr_assert_eq(listen(p->lfd, 16), 0);
	p->l = sv_upgrade_listen(p->lfd);
	cr_assert_not_null(p->l, "no RDMA listener on %s", addr);
	len = sizeof(ss);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)&ss, &len), 0);
	return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					: ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* A client of family `fam` connects to `to`:port; both sides become
 * streams and start their upgrade. */
static void connect_to(struct pair *p, int fam, const char *to, uint16_t port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	to_addr(to, port, &ss, &len);
	if (fam == AF_INET6 && ss.ss_family == AF_INET) {
		/* An IPv6 socket reaches an IPv4 server by its mapped form. */
		char mapped[64];
		snprintf(mapped, sizeof(mapped), "::ffff:%s", to);
		to_addr(mapped, port, &ss, &len);
	}
	p->cfd = socket(fam, SOCK_STREAM, 0);
	cr_assert_geq(p->cfd, 0);
	cr_assert_eq(connect(p->cfd, (struct sockaddr *)&ss, len), 0, "connect %s: %m", to);
	p->sfd = accept(p->lfd, NULL, NULL);
	cr_assert_geq(p->sfd, 0);
	p->c = sv_stream_new(p->cfd, true);
	p->s = sv_stream_new(p->sfd, false);
	cr_assert(p->c && p->s);
	h_start_server(p->s, p->l);
	sv_stream_start_client(p->c);
}

static void both_on_rdma(struct pair *p, const char *what)
{
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "%s: client %s (%s)",
		     what, sv_conn_state_name(h_state(p->c)), sv_fallback_name(h_fallback(p->c)));
	cr_assert_eq(h_wait_state(p->s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "%s: server %s",
		     what, sv_conn_state_name(h_state(p->s)));
	h_exchange(p, 7, true);
}

/* Arrays, not pointers: Criterion's workers are new processes. */
struct shape {
	char listen[40]; /* the server's address */
	int v6only;
	int client_fam;
	char to[40]; /* the address the client connects to */
};

ParameterizedTestParameters(family, every_listener_the_kernel_accepts_on_serves_over_rdma)
{
	static struct shape shapes[] = {
		/* dual-stack wildcard: an IPv4 client, and an IPv6 socket's
		 * IPv4 connection (both ends see mapped addresses) */
		{"::", 0, AF_INET, "127.0.0.1"},
		{"::", 0, AF_INET6, "127.0.0.1"},
		/* a listener on an IPv4 address in its mapped form */
		{"::ffff:127.0.0.1", 0, AF_INET, "127.0.0.1"},
		{"::ffff:127.0.0.1", 0, AF_INET6, "127.0.0.1"},
		/* IPv6 proper, wildcard and specific, V6ONLY either way */
		{"::", 1, AF_INET6, "::1"},
		{"::", 0, AF_INET6, "::1"},
		{"::1", 1, AF_INET6, "::1"},
		/* plain IPv4, an IPv6 client through its mapped form */
		{"127.0.0.1", 0, AF_INET6, "127.0.0.1"},
	};
	return cr_make_param_array(struct shape, shapes, sizeof(shapes) / sizeof(shapes[0]));
}

ParameterizedTest(struct shape *sh, family, every_listener_the_kernel_accepts_on_serves_over_rdma)
{
	struct pair p;
	memset(&p, 0, sizeof(p));
	uint16_t port = listen_on(&p, sh->listen, 0, sh->v6only);
	connect_to(&p, sh->client_fam, sh->to, port);
	char what[128];
	snprintf(what, sizeof(what), "[%s] v6only=%d, %s client to %s", sh->listen, sh->v6only,
		 sh->client_fam == AF_INET6 ? "IPv6" : "IPv4", sh->to);
	both_on_rdma(&p, what);
	h_pair_free(&p);
}

/* nginx's "listen 80; listen [::]:80" (ipv6only=on): two sockets on one
 * port, one per family. Both get their RDMA listener, and each family's
 * clients reach the socket they connected to. */
Test(family, an_ipv6_only_listener_leaves_ipv4_to_its_neighbour)
{
	struct pair v6, v4;
	memset(&v6, 0, sizeof(v6));
	memset(&v4, 0, sizeof(v4));
	uint16_t port = listen_on(&v6, "::", 0, 1);
	listen_on(&v4, "0.0.0.0", port, 0);
	connect_to(&v4, AF_INET, "127.0.0.1", port);
	both_on_rdma(&v4, "IPv4 client of the IPv4 socket");
	connect_to(&v6, AF_INET6, "::1", port);
	both_on_rdma(&v6, "IPv6 client of the IPv6-only socket");
	h_pair_free(&v4);
	h_pair_free(&v6);
}
