/* An accept-then-fork server (inetd, PostgreSQL, ftpd): the parent
 * accepts, forks before the upgrade, and closes its copy; the child
 * serves. The parent hands the connection to the child at the fork
 * (holders.h); the port's owner redirects the client's request to the
 * child's RDMA listener only once the child holds the connection alone.
 * Here the "child" is a second stream on a copy of the socket in the same
 * process, made as the fork's child makes it (sv_share_adopt with the
 * parent's counts); the parent's release is its close's. */
#include "share.h"
#include "share_int.h"
#include "harness.h"

#include "config.h"
#include "holders.h"
#include "real.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(handed, .init = h_setup, .fini = h_teardown, .timeout = 60);

struct handed {
	struct pair p;
	struct sv_hand hand;
	int child_fd;
	struct sv_stream *child;
};

/* The child's first call on it (PostgreSQL's backend reads the startup
 * packet): its upgrade request waits for that. */
static void child_uses(struct handed *t)
{
	uint8_t b;
	struct iovec v = {.iov_base = &b, .iov_len = 1};
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
	cr_assert_eq(sv_stream_recvmsg(t->child, &m, MSG_DONTWAIT), -EAGAIN);
}

/* A connection the parent accepted and has not used yet; the client's
 * upgrade starts as configured. */
static void connect_pair(struct pair *p)
{
	h_listen(p, true);
	h_connect_sockets(p);
	p->c = sv_stream_new(p->cfd, true);
	p->s = sv_stream_new(p->sfd, false);
	cr_assert(p->c && p->s);
	sv_stream_start_server(p->s, p->l);
	sv_stream_start_client(p->c);
}

/* The fork: the parent's stream is handed, with TCP's counts so far; the
 * child adopts it (its upgrade not started). */
static void fork_and_hand(struct handed *t, uint64_t want_tx, uint64_t want_rx)
{
	struct pair *p = &t->p;
	uint64_t tx, rx;
	cr_assert_eq(sv_share_detach_for_fork(p->s, &t->hand, &tx, &rx), 0);
	cr_assert_not_null(t->hand.h, "not handed: fallback %s", sv_fallback_name(h_fallback(p->s)));
	if (h_state(p->s) != SV_CONN_DETACHED) /* else it was on RDMA */
		cr_assert_eq(h_fallback(p->s), SV_FB_HANDED);
	cr_assert_eq(tx, want_tx);
	cr_assert_eq(rx, want_rx);
	cr_assert(sv_holders_adopt(&t->hand), "the child could not adopt it");
	t->child_fd = dup(p->sfd);
	cr_assert_geq(t->child_fd, 0);
	t->child = sv_share_adopt(t->child_fd, &t->hand, tx, rx);
	cr_assert_not_null(t->child);
}

/* ... and the child uses it at once. */
static void fork_and_adopt(struct handed *t, uint64_t want_tx, uint64_t want_rx)
{
	fork_and_hand(t, want_tx, want_rx);
	sv_share_start_at_first_use(t->child);
	child_uses(t);
}

/* Bytes both ways on TCP, then the fork: the parent's stream is handed,
 * the child adopts it. The client's upgrade is late enough to come after. */
static void accept_and_talk(struct handed *t)
{
	sv_cfg.upgrade_delay_ms = 300;
	struct pair *p = &t->p;
	connect_pair(p);
	uint8_t b[1000];
	long end;
	h_pattern(b, sizeof(b), 5, 0);
	cr_assert_eq(h_write_all(p->c, b, 700), 700);
	cr_assert_eq(h_read_all(p->s, b, 700, &end), 700);
	cr_assert_eq(h_write_all(p->s, b, 300), 300);
	cr_assert_eq(h_read_all(p->c, b, 300, &end), 300);
}

static void accept_and_fork(struct handed *t)
{
	accept_and_talk(t);
	fork_and_adopt(t, 300, 700);
}

static void echo_over_rdma(struct handed *t)
{
	struct pair *p = &t->p;
	uint8_t out[20000], in[20000];
	long end;
	h_pattern(out, sizeof(out), 6, 0);
	cr_assert_eq(h_write_all(p->c, out, sizeof(out)), (long)sizeof(out));
	cr_assert_eq(h_read_all(t->child, in, sizeof(in), &end), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), 6, 0));
	cr_assert_eq(h_write_all(t->child, in, sizeof(in)), (long)sizeof(in));
	cr_assert_eq(h_read_all(p->c, out, sizeof(out), &end), sizeof(out));
	cr_assert(h_pattern_ok(out, sizeof(out), 6, 0));
}

/* The parent's close: the owner redirects the request to the child, and
 * the connection runs over RDMA both ways. */
static void released_to_rdma(struct handed *t)
{
	struct pair *p = &t->p;
	sv_holders_release_first(&t->hand); /* the parent's close */
	/* By the client's delayed start and retries, and the owner's looks. */
	cr_assert_eq(h_wait_state_warp(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p->c)), sv_fallback_name(h_fallback(p->c)));
	cr_assert_eq(h_wait_state_warp(t->child, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "child: %s (%s)",
		     sv_conn_state_name(h_state(t->child)), sv_fallback_name(h_fallback(t->child)));
	cr_assert_neq(p->c->up.redirect_port, 0, "the client was not redirected");
	echo_over_rdma(t);
	struct h_counts c = h_counts(p->c);
	cr_assert_eq(c.rdma_tx, 20000, "the client sent %llu over RDMA, %llu over TCP",
		     (unsigned long long)c.rdma_tx, (unsigned long long)c.tcp_tx);
	cr_assert_eq(c.rdma_rx, 20000);
	sv_stream_close(t->child, t->child_fd);
	h_pair_free(p);
}

Test(handed, the_child_takes_it_to_rdma_once_the_parent_released_it)
{
	struct handed t;
	accept_and_fork(&t);
	struct pair *p = &t.p;
	/* Both hold it: the request (after the upgrade's delay) waits at the
	 * owner. */
	for (int i = 0; i < 100 && h_state(p->c) == SV_CONN_TCP; i++)
		h_warp_ms(H_WARP_STEP_MS);
	h_warp_steps_ms(100);
	cr_assert_neq(h_state(p->c), SV_CONN_RDMA, "upgraded while the parent still held it");
	cr_assert_neq(h_state(t.child), SV_CONN_RDMA);
	released_to_rdma(&t);
}

/* The parent's bytes (`sent`, after the fork) and then the parent's
 * release: the child's counts miss those bytes, so the client is never
 * redirected, stays on TCP, and reads every byte in order. */
static void stays_on_tcp_after(struct handed *t, const char *sent)
{
	struct pair *p = &t->p;
	size_t n = strlen(sent);
	sv_holders_release_first(&t->hand);
	/* At the upgrade's deadline. */
	cr_assert_eq(h_wait_state_warp(p->c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK,
		     "client: %s", sv_conn_state_name(h_state(p->c)));
	char b[16];
	long end;
	cr_assert_eq(h_read_all(p->c, b, n, &end), n);
	cr_assert(!memcmp(b, sent, n));
	cr_assert_eq(h_write_all(t->child, "child", 5), 5);
	cr_assert_eq(h_read_all(p->c, b, 5, &end), 5);
	cr_assert(!memcmp(b, "child", 5));
	cr_assert_neq(h_state(t->child), SV_CONN_RDMA);
	sv_stream_close(t->child, t->child_fd);
	h_pair_free(p);
}

/* The parent wrote after the fork: its held entry spoils the hand. */
Test(handed, a_spoiled_hand_stays_on_tcp)
{
	sv_cfg.upgrade_timeout_ms = 600;
	struct handed t;
	accept_and_fork(&t);
	sv_holders_spoil(&t.hand);
	cr_assert_eq(send(t.p.sfd, "parent", 6, 0), 6);
	stays_on_tcp_after(&t, "parent");
}

/* A call of the parent's that was under way at the fork moves bytes on
 * the stream it handed (another thread's write). */
Test(handed, bytes_the_parent_moves_after_the_hand_keep_it_on_tcp)
{
	sv_cfg.upgrade_timeout_ms = 600;
	struct handed t;
	accept_and_fork(&t);
	cr_assert_eq(h_write_all(t.p.s, "late", 4), 4); /* the parent's old stream */
	stays_on_tcp_after(&t, "late");
}

/* The client's request comes before the fork (a parent slow to fork, as a
 * busy postmaster is): the parent has not used the connection, so the
 * request waits, and the fork still hands it to the child. Matched at once,
 * it would have had a QP at the fork, and gone back to TCP for good. */
Test(handed, a_request_before_the_fork_waits_for_the_child)
{
	sv_cfg.upgrade_delay_ms = 0;
	struct handed t;
	struct pair *p = &t.p;
	connect_pair(p);
	/* The request reaches the owner and waits there. */
	cr_assert_eq(h_wait_state(p->c, SV_CONN_REQUESTED, 10000), SV_CONN_REQUESTED, "client: %s",
		     sv_conn_state_name(h_state(p->c)));
	h_warp_steps_ms(200);
	cr_assert_eq(h_state(p->s), SV_CONN_TCP, "matched before the application used it: %s",
		     sv_conn_state_name(h_state(p->s)));

	fork_and_adopt(&t, 0, 0);
	released_to_rdma(&t);
}

/* A connection its application leaves unused (a queue for a pool of
 * workers) still gets its upgrade: the request's wait for the first use
 * is bounded (a second, or half the upgrade's timeout). */
static void unused_upgrades(void)
{
	struct pair p = {0};
	connect_pair(&p);
	/* After the wait for the first use. */
	cr_assert_eq(h_wait_state_warp(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "server: %s (%s)",
		     sv_conn_state_name(h_state(p.s)), sv_fallback_name(h_fallback(p.s)));
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_not(sv_stream_app_used(p.s), "the test used it");
	h_pair_free(&p);
}

Test(handed, an_unused_connection_upgrades_after_the_wait)
{
	unused_upgrades();
}

Test(handed, an_unused_connection_upgrades_within_a_short_timeout)
{
	sv_cfg.upgrade_timeout_ms = 500;
	unused_upgrades();
}

/* inetd's child puts the connection on its stdin and stdout before its
 * exec: glibc's stdio may move bytes there past libsovia, so it never
 * upgrades in that image, and cannot be handed on once it tried. */
Test(handed, a_copy_on_stdio_never_upgrades_before_the_exec)
{
	sv_cfg.upgrade_timeout_ms = 600;
	struct handed t;
	struct sv_hand on;
	accept_and_talk(&t);
	fork_and_hand(&t, 300, 700);
	cr_assert(sv_share_exec_hand(t.child, &on), "untouched: an exec may hand it on");
	cr_assert(sv_share_expose_std(t.child));
	sv_share_start_at_first_use(t.child); /* its first use */
	cr_assert_eq(h_state(t.child), SV_CONN_FALLBACK);
	cr_assert_not(sv_share_exec_hand(t.child, &on), "used: an exec takes it back to TCP");
	sv_holders_release_first(&t.hand);
	cr_assert_eq(h_wait_state_warp(t.p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK,
		     "client: %s", sv_conn_state_name(h_state(t.p.c)));
	sv_stream_close(t.child, t.child_fd);
	h_pair_free(&t.p);
}

/* The exec: the image before put the connection on stdio and wrote there
 * past libsovia (glibc's FILE); the new image adopts it with the kernel's
 * counts (preload/exec_hand.c), which include those bytes, and takes it to
 * RDMA once the parent released it. The client reads every byte in order. */
Test(handed, the_exec_image_continues_from_the_kernels_counts)
{
	struct handed t;
	struct pair *p = &t.p;
	struct sv_hand on;
	accept_and_talk(&t);
	fork_and_hand(&t, 300, 700);
	cr_assert(sv_share_expose_std(t.child));
	cr_assert_eq(SV_REAL(write)(t.child_fd, "stdio", 5), 5);
	cr_assert(sv_share_exec_hand(t.child, &on));
	cr_assert_eq(on.slot, t.hand.slot);

	/* The exec: the image before leaves its stream behind, untouched. */
	int img_fd = dup(t.child_fd);
	cr_assert_geq(img_fd, 0);
	/* Its memory is gone, not its hand. */
	atomic_store(&sv_share_of(t.child)->role, SV_HAND_NONE);
	sv_stream_close(t.child, t.child_fd);
	uint64_t tx, rx;
	cr_assert_eq(sv_tcp_app_counts(img_fd, &tx, &rx), 0);
	cr_assert(tx == 305 && rx == 700, "kernel counts %llu out, %llu in",
		  (unsigned long long)tx, (unsigned long long)rx);
	t.child_fd = img_fd;
	t.child = sv_share_adopt(img_fd, &on, tx, rx);
	cr_assert_not_null(t.child);
	sv_share_start_at_first_use(t.child);
	child_uses(&t);

	char b[5];
	long end;
	cr_assert_eq(h_read_all(p->c, b, 5, &end), 5);
	cr_assert(!memcmp(b, "stdio", 5));
	released_to_rdma(&t);
}

/* A client's successor (stream_redo.c), made as the interposer's revive
 * makes it, kept for the test (one reference). */
static struct sv_stream *successor;

static bool revive_for_test(struct sv_stream *s, int fd, struct sv_listener *l)
{
	(void)fd;
	struct sv_stream *n = sv_share_successor(s, NULL, NULL, NULL);
	if (!n)
		return false;
	sv_share_successor_took(s, n);
	successor = n;
	sv_stream_start_revived(n, l);
	return true;
}

/* A connection on RDMA before the fork, whose server had not read all the
 * client sent: the fork takes it back to TCP, and it is handed to the
 * child from where each direction stands (our BACK's offsets plus what
 * TCP carried since, not the kernel's counts alone). The client, taken
 * back by the server, asks again; once the parent released its copy, the
 * owner redirects it to the child, and both move to RDMA again. The hand
 * carries what the QP carried (an exec'd image adds it to the kernel's
 * counts). */
Test(handed, a_connection_on_rdma_before_the_fork_is_handed_from_where_it_stands)
{
	sv_share_set_revive(revive_for_test);
	struct handed t;
	struct pair *p = &t.p;
	connect_pair(p);
	/* After the request's wait for the server's first use. */
	cr_assert_eq(h_wait_state_warp(p->s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	enum { SENT = 5000, READ = 1000, BACK = 3000 };
	static uint8_t b[SENT];
	long end;
	h_pattern(b, SENT, 7, 0);
	cr_assert_eq(h_write_all(p->c, b, SENT), SENT);
	cr_assert_eq(h_read_all(p->s, b, READ, &end), READ);
	h_pattern(b, BACK, 8, 0);
	cr_assert_eq(h_write_all(p->s, b, BACK), BACK);
	cr_assert_eq(h_read_all(p->c, b, BACK, &end), BACK);
	cr_assert(h_pattern_ok(b, BACK, 8, 0));
	cr_assert_gt(h_counts(p->c).rdma_tx, 0);

	fork_and_hand(&t, BACK, READ);
	uint64_t ktx, krx;
	cr_assert_eq(sv_tcp_app_counts(t.child_fd, &ktx, &krx), 0);
	cr_assert(ktx + t.hand.dtx == BACK && krx + t.hand.drx == READ,
		  "kernel %llu out, %llu in; differences %llu, %llu", (unsigned long long)ktx,
		  (unsigned long long)krx, (unsigned long long)t.hand.dtx,
		  (unsigned long long)t.hand.drx);
	cr_assert_neq(t.hand.dtx, 0, "the QP's bytes are not the kernel's");
	struct sv_hand on;
	cr_assert(sv_share_exec_hand(t.child, &on), "untouched: an exec may hand it on");
	cr_assert(on.dtx == t.hand.dtx && on.drx == t.hand.drx);
	sv_share_start_at_first_use(t.child);
	/* The child reads what the parent had not (given back at the fork). */
	cr_assert_eq(h_read_all(t.child, b, SENT - READ, &end), SENT - READ);
	cr_assert(h_pattern_ok(b, SENT - READ, 7, READ), "the child's first bytes");

	sv_holders_release_first(&t.hand); /* the parent's close */
	/* It asks again by its retry timer. */
	for (int i = 0; i < 1000 && !successor; i++)
		h_warp_ms(H_WARP_STEP_MS);
	cr_assert_not_null(successor, "the client did not ask again");
	cr_assert_eq(h_wait_state(successor, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(successor)), sv_fallback_name(h_fallback(successor)));
	cr_assert_eq(h_wait_state(t.child, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "child: %s (%s)",
		     sv_conn_state_name(h_state(t.child)), sv_fallback_name(h_fallback(t.child)));
	cr_assert_neq(successor->up.redirect_port, 0, "the client was not redirected");
	h_pattern(b, SENT, 9, 0);
	cr_assert_eq(h_write_all(t.child, b, SENT), SENT);
	cr_assert_eq(h_read_all(successor, b, SENT, &end), SENT);
	cr_assert(h_pattern_ok(b, SENT, 9, 0));
	cr_assert_eq(h_write_all(successor, "back", 4), 4);
	cr_assert_eq(h_read_all(t.child, b, 4, &end), 4);
	cr_assert(!memcmp(b, "back", 4));
	cr_assert_geq(h_counts(t.child).rdma_tx, SENT, "the child sent %llu over RDMA",
		      (unsigned long long)h_counts(t.child).rdma_tx);
	sv_stream_close(t.child, t.child_fd);
	sv_stream_close(successor, -1);
	sv_stream_put(successor);
	successor = NULL;
	h_pair_free(p);
	sv_share_set_revive(NULL);
}
