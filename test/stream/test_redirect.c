/* A prefork server: the process that listens owns the port's RDMA
 * listener, and a child that inherited the listening socket accepts. The
 * child opens an RDMA listener of its own and enters its connections in
 * the holders' table; the owner redirects their requests there
 * (holders.h). Here the "child" is a second listener object in the same
 * process, made as a fork's child makes it: the owner matches only the
 * connections accepted on its own socket, as a real owner, which has none
 * of the child's. */
#include "harness.h"

#include "config.h"
#include "holders.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(redirect, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* The owner's listener, the "child's" inherited one, and a connection the
 * child accepted; the client starts its upgrade. */
static struct sv_listener *child_accepts(struct pair *p)
{
	h_listen(p, true);
	struct sv_listener *w = sv_upgrade_listen_inherited(p->l, p->lfd);
	cr_assert_not_null(w, "no inherited listener");
	h_connect_sockets(p);
	p->c = sv_stream_new(p->cfd, true);
	p->s = sv_stream_new(p->sfd, false);
	cr_assert(p->c && p->s);
	h_start_server(p->s, w);
	sv_stream_start_client(p->c);
	return w;
}

/* The client asks at the TCP port, the owner sends it to the child's port,
 * and the child takes the connection to RDMA: the bytes each way go over
 * the QP. */
Test(redirect, a_prefork_childs_connection_goes_to_rdma)
{
	struct pair p;
	struct sv_listener *w = child_accepts(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p.c)), sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "server: %s",
		     sv_conn_state_name(h_state(p.s)));
	cr_assert_neq(p.c->up.redirect_port, 0, "the client was not redirected");
	uint8_t out[20000], in[20000];
	h_pattern(out, sizeof(out), 9, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	long end;
	cr_assert_eq(h_read_all(p.s, in, sizeof(in), &end), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), 9, 0));
	cr_assert_eq(h_write_all(p.s, in, sizeof(in)), (long)sizeof(in));
	cr_assert_eq(h_read_all(p.c, out, sizeof(out), &end), sizeof(out));
	cr_assert(h_pattern_ok(out, sizeof(out), 9, 0));
	struct h_counts c = h_counts(p.c);
	cr_assert_eq(c.rdma_tx, sizeof(out), "the client sent %llu over RDMA, %llu over TCP",
		     (unsigned long long)c.rdma_tx, (unsigned long long)c.tcp_tx);
	cr_assert_eq(c.rdma_rx, sizeof(in));
	sv_stream_close(p.s, p.sfd);
	sv_stream_close(p.c, p.cfd);
	sv_upgrade_unlisten(w);
	h_pair_free(&p);
}

/* Once the child's connection was matched, its entry is gone: a table
 * that only grew would fill up and redirect to ports nobody serves. */
Test(redirect, the_childs_entry_goes_once_matched)
{
	struct pair p;
	struct sv_listener *w = child_accepts(&p);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	struct sv_holders *h = sv_holders_get();
	cr_assert_not_null(h);
	cr_assert_eq(sv_holders_find(h, &p.s->tuple.local, &p.s->tuple.peer), 0,
		     "the matched connection is still entered");
	sv_upgrade_unlisten(w);
	h_pair_free(&p);
}

/* A connection nobody accepted on the owner's socket and no child
 * entered: the owner keeps its request until the upgrade times out, and
 * the client stays on TCP, as before there were children. */
Test(redirect, nobody_holds_it_the_client_stays_on_tcp)
{
	sv_cfg.upgrade_timeout_ms = 300;
	struct pair p;
	h_listen(&p, true);
	struct sv_listener *w = sv_upgrade_listen_inherited(p.l, p.lfd);
	cr_assert_not_null(w);
	h_connect_sockets(&p);
	p.c = sv_stream_new(p.cfd, true);
	cr_assert_not_null(p.c);
	sv_stream_start_client(p.c);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 5000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(p.c->up.redirect_port, 0);
	uint8_t b[5] = "hello", r[5];
	cr_assert_eq(h_write_all(p.c, b, sizeof(b)), 5);
	cr_assert_eq(read(p.sfd, r, sizeof(r)), 5);
	cr_assert(!memcmp(b, r, 5));
	sv_upgrade_unlisten(w);
	p.s = NULL;
	sv_stream_put(p.c);
	p.c = NULL;
	h_pair_free(&p);
}
