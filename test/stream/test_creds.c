/* Credential changes (seteuid, setgroups...: preload/creds.c). The kernel
 * then refuses every rdma_cm call on a channel opened before, and a
 * channel opened after serves only the thread that opened it (the fake
 * network models both). libsovia moves its ids to a new channel on the
 * helper and makes every later rdma_cm call there: connections on RDMA
 * go on, listeners keep answering, new connections are upgraded, and no
 * other thread makes an rdma_cm call after a change. */
#include "harness.h"

#include "helper.h"

#include <criterion/criterion.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(creds, .init = h_setup, .fini = h_teardown, .timeout = 60);

static void wait_rdma(struct pair *p)
{
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA,
		     "client: %s (fallback=%s)", sv_conn_state_name(h_state(p->c)),
		     sv_fallback_name(h_fallback(p->c)));
	cr_assert_eq(h_wait_state(p->s, SV_CONN_RDMA, 10000), SV_CONN_RDMA,
		     "server: %s (fallback=%s)", sv_conn_state_name(h_state(p->s)),
		     sv_fallback_name(h_fallback(p->s)));
}

/* Close both ends and the listener. */
static void close_pair(struct pair *p)
{
	cr_assert_eq(sv_stream_close(p->c, p->cfd), 0);
	long end;
	uint8_t b;
	cr_assert_eq(h_read_all(p->s, &b, 1, &end), 0);
	cr_assert_eq(end, 0, "the server did not read the client's end");
	cr_assert_eq(sv_stream_close(p->s, p->sfd), 0);
	h_pair_free(p);
}

/* Once every id is destroyed (the helper's deferred calls included), no
 * thread but the helper made an rdma_cm call after a change. */
static void all_gone(void)
{
	uint64_t until = h_ms() + 10000;
	while (fake_net_live_ids() > 0 && h_ms() < until)
		usleep(5000);
	cr_assert_eq(fake_net_live_ids(), 0, "%u rdma_cm ids were never destroyed",
		     fake_net_live_ids());
	cr_assert_eq(fake_net_cm_refused(), 0, "%u rdma_cm calls came from another thread than the helper",
		     fake_net_cm_refused());
}

/* A connection on RDMA before the change keeps going over RDMA after it,
 * and its close (a disconnect and a destroy, from the application's
 * thread) is made on the helper. */
Test(creds, a_connection_on_rdma_goes_on)
{
	struct pair p;
	h_pair_rdma(&p);
	h_exchange(&p, 1, true);
	fake_net_creds_change();
	h_exchange(&p, 2, true);
	cr_assert_eq(h_state(p.c), SV_CONN_RDMA);
	close_pair(&p);
	all_gone();
}

/* A listener made before the change answers a request that comes after it,
 * and the new connection goes over RDMA. */
Test(creds, a_listener_made_before_upgrades_after)
{
	struct pair a, b;
	h_pair_rdma(&a);
	h_listen(&b, true);
	fake_net_creds_change();
	h_connect(&b);
	wait_rdma(&b);
	h_exchange(&b, 3, true);
	close_pair(&b);
	close_pair(&a);
	all_gone();
}

/* ftpd changes its euid around every data connection's bind: each of
 * several connections, listened for and connected after a change of its
 * own, goes over RDMA. */
Test(creds, every_connection_after_a_change_goes_over_rdma)
{
	struct pair first;
	h_pair_rdma(&first); /* rdma_cm is up before the first change */
	for (int i = 0; i < 5; i++) {
		fake_net_creds_change();
		fake_net_creds_change(); /* seteuid(0), bind, seteuid(user) */
		struct pair p;
		h_listen(&p, true);
		h_connect(&p);
		wait_rdma(&p);
		h_exchange(&p, 10 + (uint64_t)i, true);
		cr_assert_eq(h_fallback(p.c), SV_FB_NONE);
		close_pair(&p);
	}
	close_pair(&first);
	all_gone();
}

/* A change whose kernel part comes while the helper moves its ids, before
 * the library hears of it (creds.c tells it once the call returned): the
 * move is refused for a change the helper has not counted. It must try
 * again, not give up, and the next connection goes over RDMA. */
Test(creds, a_change_heard_of_late_does_not_stop_rdma)
{
	struct pair first;
	h_pair_rdma(&first);
	fake_net_creds_change_in_next_move();
	fake_net_creds_change();
	usleep(100000); /* the helper follows, and is refused once */
	sv_helper_creds_changed("the late one");
	cr_assert(!sv_helper_creds_stale(), "the helper gave up on rdma_cm");
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	wait_rdma(&p);
	h_exchange(&p, 40, true);
	close_pair(&p);
	close_pair(&first);
	all_gone();
}
