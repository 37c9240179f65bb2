/* Connections that stay on TCP, with the reason, and keep every byte:
 * no RDMA listener at the peer, no route, and an RDMA peer that is not the
 * TCP peer (a failed challenge). */
#include "harness.h"

#include "config.h"
#include "helper.h"
#include "pinned.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

TestSuite(fallback, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* A server without libsovia (no RDMA listener): the client asks again a
 * few times, then stays on TCP, "rejected". */
Test(fallback, no_listener_at_the_peer)
{
	struct pair p;
	h_listen(&p, false);
	h_connect(&p);
	/* After its retries. */
	cr_assert_eq(h_wait_state_warp(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK,
		     "client: %s", sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(h_fallback(p.c), SV_FB_REJECTED);
	h_exchange(&p, 30, false);
	cr_assert(sv_stream_kernel_only(p.c));
	h_pair_free(&p);
}

/* No RDMA route to the peer: the client stays on TCP at once; the server,
 * whose request never comes, once its wait is over. */
Test(fallback, no_route)
{
	sv_cfg.upgrade_timeout_ms = 300;
	fake_net_no_route(true);
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.c), SV_FB_NO_ROUTE);
	h_exchange(&p, 30, false);
	/* At the upgrade's deadline. */
	cr_assert_eq(h_wait_state_warp(p.s, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.s), SV_FB_TIMEOUT);
	cr_assert_eq(fake_net_qps_created(), 0);
	h_pair_free(&p);
}

/* What follows the client's switch point on TCP is not the server's
 * challenge (here: bytes written on the client's socket past libsovia, as
 * when the RDMA peer is an impostor and the TCP peer knows nothing of the
 * switch): the server drops the QP and stays on TCP, gives those bytes to
 * its application as data, and its own sending, which never left TCP,
 * goes on there. */
Test(fallback, failed_challenge_keeps_tcp_working)
{
	/* The server's RESET of the QP is held: the client's stream keeps
	 * its side as it was, so its socket shows what the server's TCP
	 * carries. */
	fake_net_hold(FAKE_SERVER);
	struct pair p;
	h_listen(&p, true);
	h_connect_sockets(&p);
	/* Eight bytes the client's stream does not count: its switch point
	 * (TO_RDMA at 0) is before them. */
	const char junk[8] = "notecho!";
	cr_assert_eq(send(p.cfd, junk, sizeof(junk), 0), (long)sizeof(junk));
	p.c = sv_stream_new(p.cfd, true);
	p.s = sv_stream_new(p.sfd, false);
	h_start_server(p.s, p.l);
	sv_stream_start_client(p.c);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "server: %s",
		     sv_conn_state_name(h_state(p.s)));
	cr_assert_eq(h_fallback(p.s), SV_FB_CHALLENGE);
	/* The bytes taken for an echo are the application's, first. */
	char got[8];
	long end;
	cr_assert_eq(h_read_all(p.s, got, sizeof(got), &end), sizeof(got));
	cr_assert_eq(memcmp(got, junk, sizeof(junk)), 0);
	/* The server's writes still go: its sending never left TCP. */
	cr_assert_eq(h_write(p.s, "hello", 5, 0), 5);
	/* They arrive on the client's socket after whatever the server's
	 * stream had sent before (nothing). */
	char raw[5];
	size_t n = 0;
	while (n < sizeof(raw)) {
		ssize_t r = recv(p.cfd, raw + n, sizeof(raw) - n, 0);
		cr_assert_gt(r, 0, "the client's socket ended: %s", r < 0 ? strerror(errno) : "EOF");
		n += (size_t)r;
	}
	cr_assert_eq(memcmp(raw, "hello", 5), 0);
	h_pair_free(&p);
}

/* What a connection's buffers take of the locked-memory budget at first. */
static size_t start_pin(void)
{
	struct sv_proto_params prm;
	sv_config_proto_params(&sv_cfg, &prm);
	return sv_pinned_pages((size_t)(sv_proto_nrecv(&prm) + sv_proto_nsend(&prm)) *
			       sv_proto_start_size(&prm));
}

/* The locked-memory budget (pinned.h): a connection whose buffers do not
 * fit waits for room, on TCP meanwhile; when a connection on RDMA is gone,
 * its share serves the waiting one. The budget leaves room for two, three
 * or none of the second pair's ends: the client waits (with its route
 * resolved), the server waits (with the request unanswered), or both. */
ParameterizedTestParameters(fallback, past_the_budget_a_connection_waits_for_room)
{
	static unsigned budget_pins[] = {2, 3};
	return cr_make_param_array(unsigned, budget_pins, 2);
}

ParameterizedTest(unsigned *pins, fallback, past_the_budget_a_connection_waits_for_room)
{
	size_t pin = start_pin();
	sv_pinned_set_budget(*pins * pin); /* both ends of each pair are this process */
	struct pair a, b;
	h_pair_rdma(&a);
	cr_assert_eq(sv_pinned_taken(), 2 * pin);
	h_listen(&b, true);
	h_connect(&b);
	usleep(300 * 1000); /* its upgrade gets as far as the budget lets it */
	uint64_t looks = h_helper_looks(b.c) + h_helper_looks(b.s);
	usleep(300 * 1000);
	looks = h_helper_looks(b.c) + h_helper_looks(b.s) - looks;
	/* It asks again when room is given back, not in a loop. */
	cr_assert_leq(looks, 30, "the helper looked at the waiting pair %lu times in 300 ms",
		      (unsigned long)looks);
	cr_assert_neq(h_state(b.c), SV_CONN_RDMA);
	cr_assert_neq(h_state(b.c), SV_CONN_FALLBACK, "it waits, it does not give up");
	cr_assert_eq(h_state(b.s), SV_CONN_TCP, "the server's end waits");
	h_exchange(&b, 31, false);
	cr_assert_leq(sv_pinned_taken(), *pins * pin);
	cr_assert_eq(sv_stream_close(a.c, a.cfd), 0);
	cr_assert_eq(sv_stream_close(a.s, a.sfd), 0);
	h_pair_free(&a);
	cr_assert_eq(h_wait_state(b.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(b.c)));
	cr_assert_eq(h_wait_state(b.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "server: %s",
		     sv_conn_state_name(h_state(b.s)));
	h_exchange(&b, 32, true);
	cr_assert_eq(h_fallback(b.c), SV_FB_NONE);
	cr_assert_eq(sv_pinned_taken(), 2 * pin);
	h_pair_free(&b);
}

/* A connection that waited for room until its upgrade's deadline stays on
 * TCP, "memlock", and keeps its bytes. */
Test(fallback, past_the_budget_until_the_deadline)
{
	size_t pin = start_pin();
	sv_pinned_set_budget(2 * pin);
	struct pair a, b;
	h_pair_rdma(&a);
	sv_cfg.upgrade_timeout_ms = 400; /* b's */
	h_listen(&b, true);
	h_connect(&b);
	cr_assert_eq(h_wait_state_warp(b.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(b.c), SV_FB_MEMLOCK, "fallback=%s",
		     sv_fallback_name(h_fallback(b.c)));
	h_exchange(&b, 30, false);
	cr_assert_eq(sv_pinned_taken(), 2 * pin);
	h_pair_free(&b);
	h_pair_free(&a);
}

/* Buffers larger than the whole budget could never fit: no wait (the
 * upgrade's deadline is a minute away), TCP at once, "memlock". */
Test(fallback, buffers_that_never_fit)
{
	sv_cfg.upgrade_timeout_ms = 60000;
	sv_pinned_set_budget(start_pin() / 2);
	struct pair b;
	h_listen(&b, true);
	h_connect(&b);
	cr_assert_eq(h_wait_state(b.c, SV_CONN_FALLBACK, 30000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(b.c)));
	cr_assert_eq(h_fallback(b.c), SV_FB_MEMLOCK, "fallback=%s",
		     sv_fallback_name(h_fallback(b.c)));
	h_exchange(&b, 30, false);
	cr_assert_eq(sv_pinned_taken(), 0);
	h_pair_free(&b);
}

struct reader {
	struct sv_stream *s;
	uint8_t in[100];
	size_t got;
};

static void *read_100(void *arg)
{
	struct reader *r = arg;
	long end;
	r->got = h_read_all(r->s, r->in, sizeof(r->in), &end);
	return NULL;
}

/* A thread that sleeps on a stream is woken through an eventfd of its own
 * (src/hub.h), made at its first sleep and closed when it ends: a
 * connection keeps no descriptor of ours (a server under `ulimit -n`
 * accepts as many as without libsovia). Here a reader sleeps on the
 * server while it still waits for an upgrade request that never comes (no
 * RDMA route). */
Test(fallback, a_plain_connection_keeps_no_descriptor_of_ours)
{
	sv_cfg.upgrade_timeout_ms = 1500;
	fake_net_no_route(true);
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	int base = h_open_fds();
	struct reader r = {.s = p.s};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, read_100, &r), 0);
	uint64_t until = h_ms() + 10000;
	while (h_open_fds() == base && h_state(p.s) != SV_CONN_FALLBACK && h_ms() < until)
		usleep(1000);
	bool slept_with_one = h_open_fds() == base + 1;
	/* At the upgrade's deadline (the reader asleep meanwhile). */
	cr_assert_eq(h_wait_state_warp(p.s, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.s), SV_FB_TIMEOUT);
	uint8_t out[100];
	h_pattern(out, sizeof(out), 31, 0);
	cr_assert_eq(h_write_all(p.c, out, sizeof(out)), (long)sizeof(out));
	pthread_join(t, NULL);
	cr_assert_eq(r.got, sizeof(r.in));
	cr_assert(h_pattern_ok(r.in, sizeof(r.in), 31, 0));
	cr_assert(slept_with_one, "the sleeping reader had no eventfd of its own");
	cr_assert_eq(h_open_fds(), base, "%d fds of libsovia's stayed", h_open_fds() - base);
	h_pair_free(&p);
}

/* A seccomp filter, as a sandbox may have: getrandom fails with ENOSYS,
 * and, with no_files, so does opening any file (EPERM). For every thread
 * of the process, the helper's too. */
static void refuse_randomness(bool no_files)
{
#if defined(__x86_64__)
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getrandom, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 1),
		BPF_STMT(BPF_RET | BPF_K,
			 no_files ? SECCOMP_RET_ERRNO | EPERM : SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
	cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	cr_assert_eq(syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
			     &prog),
		     0, "seccomp: %s", strerror(errno));
	uint8_t b;
	cr_assert_eq(getrandom(&b, 1, 0), -1);
	cr_assert_eq(errno, ENOSYS);
#else
	(void)no_files;
	cr_skip_test("the seccomp filter is written for x86-64");
#endif
}

/* getrandom refused: the challenge comes from /dev/urandom, and the
 * connection reaches RDMA. */
Test(fallback, without_getrandom_the_challenge_comes_from_urandom)
{
	refuse_randomness(false);
	struct pair p;
	h_pair_rdma(&p);
	h_exchange(&p, 33, true);
	h_pair_free(&p);
}

/* No random bytes at all: the connection stays on TCP, at once, rather
 * than wait for them (the upgrade used to retry getrandom for ever, with
 * the stream's lock held). */
Test(fallback, without_random_bytes_it_stays_on_tcp)
{
	refuse_randomness(true);
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(h_fallback(p.c), SV_FB_RESOURCES);
	h_exchange(&p, 34, false);
	h_pair_free(&p);
}

/* A TO_RDMA whose switch point lies further ahead than TCP can hold (here
 * near 2^64, the client's count of its TCP bytes forged): the server does
 * not read TCP waiting for it, the challenge fails at once, and TCP
 * carries the connection both ways. */
Test(fallback, a_switch_point_beyond_tcp_fails_the_challenge)
{
	fake_net_hold(FAKE_SERVER); /* the server's RESET stays on the fake wire */
	struct pair p;
	h_listen(&p, true);
	h_connect_sockets(&p);
	p.c = sv_stream_new(p.cfd, true);
	p.s = sv_stream_new(p.sfd, false);
	sv_lock(&p.c->lock);
	p.c->tcp_tx = UINT64_MAX - 1000;
	sv_unlock(&p.c->lock);
	h_start_server(p.s, p.l);
	sv_stream_start_client(p.c);
	cr_assert_eq(h_wait_state(p.s, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "server: %s",
		     sv_conn_state_name(h_state(p.s)));
	cr_assert_eq(h_fallback(p.s), SV_FB_CHALLENGE);
	/* What the TCP peer writes is its data: the echo the client's
	 * libsovia wrote after its TO_RDMA (the server's challenge), then
	 * bytes written on the client's socket. */
	uint8_t chal[SV_CHALLENGE_SIZE];
	sv_lock(&p.s->lock);
	memcpy(chal, p.s->sw.my_challenge, sizeof(chal));
	sv_unlock(&p.s->lock);
	const char msg[] = "still TCP";
	cr_assert_eq(send(p.cfd, msg, sizeof(msg), 0), (long)sizeof(msg));
	uint8_t got[SV_CHALLENGE_SIZE + sizeof(msg)];
	long end;
	cr_assert_eq(h_read_all(p.s, got, sizeof(got), &end), sizeof(got));
	cr_assert_eq(memcmp(got, chal, sizeof(chal)), 0);
	cr_assert_eq(memcmp(got + sizeof(chal), msg, sizeof(msg)), 0);
	h_pair_free(&p);
}

/* A reply that hands the client its own challenge: the client would write
 * it on TCP at its switch point, and a server application that echoes its
 * input would hand it back as the proof, from an RDMA peer that is not the
 * TCP peer. The client refuses the reply before it writes anything: the
 * server's application reads exactly the client's bytes, and TCP carries
 * the connection. */
Test(fallback, a_reply_with_our_own_challenge_is_refused)
{
	fake_net_reflect_challenge(true);
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(h_fallback(p.c), SV_FB_CHALLENGE);
	const char msg[] = "only this";
	cr_assert_eq(h_write_all(p.c, msg, sizeof(msg)), (long)sizeof(msg));
	char got[sizeof(msg)];
	long end;
	cr_assert_eq(h_read_all(p.s, got, sizeof(got), &end), sizeof(got));
	cr_assert_eq(memcmp(got, msg, sizeof(msg)), 0, "the server read other bytes first");
	h_pair_free(&p);
}

/* SOVIA_PRIVILEGED_PORTS: a server port of 1024 or above, where any local
 * user may listen with rdma_cm first, stays on TCP; the client never
 * writes an echo there. */
Test(fallback, privileged_ports_keep_an_unprivileged_port_on_tcp)
{
	sv_cfg.privileged_ports = true;
	sv_cfg.upgrade_timeout_ms = 300;
	struct pair p;
	h_listen(&p, true);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	cr_assert_eq(h_fallback(p.c), SV_FB_UNPRIVILEGED, "fallback=%s",
		     sv_fallback_name(h_fallback(p.c)));
	h_exchange(&p, 31, false);
	cr_assert_eq(fake_net_qps_created(), 0, "the client asked for RDMA");
	/* The server's wait for a request ends at the upgrade's deadline. */
	cr_assert_eq(h_wait_state_warp(p.s, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	h_pair_free(&p);
}

/* ... and a port below 1024 is upgraded as ever. */
Test(fallback, privileged_ports_upgrade_a_port_below_1024)
{
	sv_cfg.privileged_ports = true;
	struct pair p;
	int r = -EADDRINUSE;
	for (uint16_t port = 900; port < 1000 && r == -EADDRINUSE; port++)
		r = h_listen_at(&p, true, port);
	if (r == -EACCES)
		cr_skip_test("binding a port below 1024 needs CAP_NET_BIND_SERVICE");
	cr_assert_eq(r, 0, "no free port below 1024: %s", strerror(-r));
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p.c)));
	h_exchange(&p, 32, true);
	h_pair_free(&p);
}

/* CPU time this process used, in milliseconds. */
static long cpu_ms(void)
{
	struct rusage ru;
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000L +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000L;
}

/* After a credential change the kernel refuses our rdma_cm channel's
 * events (preload/creds.c) but still reports it readable while they are
 * queued. When the helper cannot move its ids to a new channel, it must
 * stop watching the old one, not wake for it at once, for ever (an old
 * connection's disconnect waits there). Idle, the process uses next to no
 * CPU; spinning, a whole core. */
Test(fallback, a_stale_channel_does_not_spin_the_helper)
{
	struct pair p;
	h_pair_rdma(&p);
	fake_net_refuse_moves(true);
	fake_net_creds_change();
	fake_net_break_all(); /* disconnect events wait on the channel */
	usleep(200000);       /* the connections' own failover settles */
	long t0 = cpu_ms();
	uint64_t until = h_ms() + 1000;
	while (h_ms() < until)
		usleep(10000);
	long used = cpu_ms() - t0;
	cr_assert_lt(used, 300, "the process used %ld ms of CPU in an idle second", used);
	cr_assert(sv_helper_creds_stale(), "the helper did not give up on rdma_cm");
	h_pair_free(&p);
}
