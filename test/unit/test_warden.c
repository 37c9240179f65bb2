/* sovia-warden's pieces (src/upgrade/warden.h, tools/warden_table.h): the
 * registration's wire format, what the warden accepts as proof that a
 * registrant holds a listening TCP socket, how it confirms that the
 * socket still listens, the table it answers clients from, and the
 * library's side of a registration (on a thread of its own, which nobody
 * waits for). */
#include "warden_table.h"
#include "addr.h"
#include "cmdata.h"
#include "fdpass.h"
#include "fdrecv.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(warden, .timeout = 30);

static uint64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

Test(warden, a_registration_decodes_as_encoded_and_nothing_else_does)
{
	uint8_t m[SV_WARDEN_MSG_LEN];
	uint16_t port = 0;
	sv_warden_msg_encode(51234, m);
	cr_assert_eq(memcmp(m, "SOVW\x02\x00", 6), 0, "magic, version 2 and a zero byte");
	cr_assert_eq(sv_warden_msg_decode(m, sizeof(m), &port), 0);
	cr_assert_eq(port, 51234);
	cr_assert_eq(sv_warden_msg_decode(m, sizeof(m) - 1, &port), -EPROTO, "short");
	uint8_t longer[SV_WARDEN_MSG_LEN + 1] = {0};
	memcpy(longer, m, sizeof(m));
	cr_assert_eq(sv_warden_msg_decode(longer, sizeof(longer), &port), -EPROTO, "long");
	for (int i = 0; i < 6; i++) {
		uint8_t bad[SV_WARDEN_MSG_LEN];
		memcpy(bad, m, sizeof(m));
		bad[i] ^= 0x40;
		cr_assert_eq(sv_warden_msg_decode(bad, sizeof(bad), &port), -EPROTO, "byte %d", i);
	}
	sv_warden_msg_encode(0, m);
	cr_assert_eq(sv_warden_msg_decode(m, sizeof(m), &port), -EPROTO, "port 0");
}

static int tcp_socket(int family, const char *ip, uint16_t port, bool listening)
{
	int fd = socket(family, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_storage ss = family == AF_INET ? v4(ip, port) : v6(ip, port);
	cr_assert_eq(bind(fd, (struct sockaddr *)&ss, sizeof(ss)), 0, "bind: %s", strerror(errno));
	if (listening)
		cr_assert_eq(listen(fd, 4), 0);
	return fd;
}

static uint16_t port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	return sv_addr_port((struct sockaddr *)&ss);
}

static int diag;
static void diag_up(void)
{
	diag = sv_warden_diag_open();
	cr_assert_geq(diag, 0, "NETLINK_SOCK_DIAG: %s", strerror(-diag));
}
static void diag_down(void)
{
	close(diag);
}

Test(warden, only_a_listening_tcp_socket_is_proof, .init = diag_up, .fini = diag_down)
{
	struct sv_warden_listener a;
	int l = tcp_socket(AF_INET, "127.0.0.1", 0, true);
	cr_assert_eq(sv_warden_check_listener(diag, l, &a), 0);
	cr_assert_eq(a.addr.ss_family, AF_INET);
	cr_assert_eq(sv_addr_port((struct sockaddr *)&a.addr), port_of(l), "its address and port");
	cr_assert_not(a.v6only);
	uint64_t cookie;
	socklen_t len = sizeof(cookie);
	cr_assert_eq(getsockopt(l, SOL_SOCKET, SO_COOKIE, &cookie, &len), 0);
	cr_assert_eq(a.cookie, cookie, "the socket's cookie");

	int bound = tcp_socket(AF_INET, "127.0.0.1", 0, false);
	cr_assert_eq(sv_warden_check_listener(diag, bound, &a), -EINVAL, "bound, not listening");
	int udp = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_eq(sv_warden_check_listener(diag, udp, &a), -EPROTOTYPE);
	int un = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_eq(sv_warden_check_listener(diag, un, &a), -EPROTOTYPE);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(sv_warden_check_listener(diag, p[0], &a), -ENOTSOCK);

	int l6 = socket(AF_INET6, SOCK_STREAM, 0);
	int one = 1;
	cr_assert_eq(setsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)), 0);
	struct sockaddr_storage any6 = v6("::", 0);
	cr_assert_eq(bind(l6, (struct sockaddr *)&any6, sizeof(any6)), 0);
	cr_assert_eq(listen(l6, 4), 0);
	cr_assert_eq(sv_warden_check_listener(diag, l6, &a), 0);
	cr_assert(a.v6only, "IPV6_V6ONLY is read");
	close(l);
	close(bound);
	close(udp);
	close(un);
	close(p[0]);
	close(p[1]);
	close(l6);
}

/* A listener in a network namespace of the registrant's own making holds
 * its port only there: refused. */
Test(warden, a_listener_of_another_network_namespace_is_refused, .init = diag_up,
     .fini = diag_down)
{
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char no = 'n';
		if (unshare(CLONE_NEWNET) < 0) {
			(void)!write(sp[1], &no, 1);
			_exit(0);
		}
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_storage any = v4("0.0.0.0", 5555);
		if (fd < 0 || bind(fd, (struct sockaddr *)&any, sizeof(any)) < 0 || listen(fd, 1) < 0)
			_exit(3);
		_exit(sv_fd_send(sp[1], "y", 1, fd, 0) == 1 ? 0 : 4);
	}
	char c = 0;
	int fd;
	cr_assert_eq(fdpass_recv(sp[0], &c, 1, &fd, 0), 1);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child: %d", st);
	if (c == 'n')
		cr_skip_test("no network namespaces here (unshare refused)");
	cr_assert_geq(fd, 0, "the listener came");
	struct sv_warden_listener a;
	cr_assert_eq(sv_warden_check_listener(diag, fd, &a), -EXDEV);
	close(fd);
}

/* The table's ranking on its own, with whether each registered socket
 * listens said by the test. */
struct gone {
	uint64_t cookie[4];
	int n;
};
static int said_alive(void *arg, const struct sockaddr_storage *addr, uint64_t cookie)
{
	(void)addr;
	const struct gone *g = arg;
	for (int i = 0; i < g->n; i++)
		if (g->cookie[i] == cookie)
			return 0;
	return 1;
}

static struct sv_warden_listener at(struct sockaddr_storage a, bool v6only, uint64_t cookie)
{
	return (struct sv_warden_listener){.addr = a, .v6only = v6only, .cookie = cookie};
}

Test(warden, the_table_answers_with_the_best_and_newest_live_listener)
{
	struct sv_warden_table *t = sv_warden_table_new();
	cr_assert_not_null(t);
	struct gone g = {0};
	struct sockaddr_storage any4 = v4("0.0.0.0", 5432), one = v4("10.1.0.1", 5432);
	struct sockaddr_storage any6 = v6("::", 6379);
	struct sv_warden_listener l;
	cr_assert_eq(sv_warden_table_lookup(t, &one, said_alive, &g), 0, "empty");
	l = at(any4, false, 1);
	cr_assert_eq(sv_warden_table_add(t, 10, &l, 40001), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &one, said_alive, &g), 40001,
		     "a wildcard takes the address");
	struct sockaddr_storage other_port = v4("10.1.0.1", 5433);
	cr_assert_eq(sv_warden_table_lookup(t, &other_port, said_alive, &g), 0, "not another port");
	struct sockaddr_storage v6srv = v6("fd00::1", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &v6srv, said_alive, &g), 0, "0.0.0.0 takes no IPv6");
	l = at(one, false, 2);
	cr_assert_eq(sv_warden_table_add(t, 11, &l, 40002), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &one, said_alive, &g), 40002,
		     "its very address beats a wildcard");
	struct sockaddr_storage two = v4("10.1.0.2", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &two, said_alive, &g), 40001);
	l = at(any4, false, 3);
	cr_assert_eq(sv_warden_table_add(t, 12, &l, 40003), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &two, said_alive, &g), 40003, "the newer of two alike");
	l = at(any4, false, 3);
	cr_assert_eq(sv_warden_table_add(t, 12, &l, 40033), 0);
	cr_assert_eq(sv_warden_table_count(t), 3, "the same socket again replaces its entry");
	cr_assert_eq(sv_warden_table_lookup(t, &two, said_alive, &g), 40033);

	/* Sockets that no longer listen: passed over and dropped. */
	g.cookie[g.n++] = 3;
	cr_assert_eq(sv_warden_table_lookup(t, &two, said_alive, &g), 40001, "gone with its socket");
	cr_assert_eq(sv_warden_table_count(t), 2);
	g.cookie[g.n++] = 2;
	cr_assert_eq(sv_warden_table_lookup(t, &one, said_alive, &g), 40001,
		     "a dead exact entry never shadows a live wildcard");
	cr_assert_eq(sv_warden_table_count(t), 1);

	struct sockaddr_storage r4 = v4("10.1.0.1", 6379), r6 = v6("fd00::2", 6379);
	struct sockaddr_storage mapped = v6("::ffff:10.1.0.1", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &mapped, said_alive, &g), 40001, "IPv4-mapped is IPv4");
	l = at(any6, true, 20);
	cr_assert_eq(sv_warden_table_add(t, 20, &l, 40020), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &r6, said_alive, &g), 40020);
	cr_assert_eq(sv_warden_table_lookup(t, &r4, said_alive, &g), 0,
		     ":: with IPV6_V6ONLY takes no IPv4");
	l = at(any6, false, 21);
	cr_assert_eq(sv_warden_table_add(t, 21, &l, 40021), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &r4, said_alive, &g), 40021, ":: takes IPv4 too");
	g.cookie[g.n++] = 20;
	g.cookie[g.n++] = 21;
	cr_assert_eq(sv_warden_table_sweep(t, said_alive, &g), 2, "a sweep drops the gone");
	cr_assert_eq(sv_warden_table_count(t), 1);
	sv_warden_table_free(t);
}

static int kernel_alive(void *arg, const struct sockaddr_storage *addr, uint64_t cookie)
{
	return sv_warden_alive(*(int *)arg, addr, cookie);
}

/* Finding 1 of issue 53 with real sockets, as the kernel says: user A
 * registers its listener on an address, closes it, and keeps nothing;
 * user B listens on the wildcard of that port and registers. Clients of
 * the address are B's, never sent to A's RDMA port. */
Test(warden, a_closed_listeners_registration_never_answers_for_another,
     .init = diag_up, .fini = diag_down)
{
	struct sv_warden_table *t = sv_warden_table_new();
	struct sv_warden_listener a, b;
	int la = tcp_socket(AF_INET, "127.0.0.1", 0, true);
	uint16_t p = port_of(la);
	cr_assert_eq(sv_warden_check_listener(diag, la, &a), 0);
	cr_assert_eq(sv_warden_table_add(t, 1001, &a, 41001), 0);
	struct sockaddr_storage server = v4("127.0.0.1", p);
	cr_assert_eq(sv_warden_table_lookup(t, &server, kernel_alive, &diag), 41001,
		     "A's while it listens");
	cr_assert_eq(sv_warden_alive(diag, &a.addr, a.cookie), 1);
	close(la);
	cr_assert_eq(sv_warden_alive(diag, &a.addr, a.cookie), 0, "closed: gone");
	int lb = tcp_socket(AF_INET, "0.0.0.0", p, true);
	cr_assert_eq(sv_warden_check_listener(diag, lb, &b), 0);
	cr_assert_eq(sv_warden_table_add(t, 1002, &b, 41002), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &server, kernel_alive, &diag), 41002,
		     "B's: A's closed listener sends nobody to A's RDMA port");
	cr_assert_eq(sv_warden_table_count(t), 1, "A's entry dropped");
	close(lb);
	cr_assert_eq(sv_warden_table_lookup(t, &server, kernel_alive, &diag), 0, "none listens");
	sv_warden_table_free(t);
}

/* Finding 3 of issue 53: one user's registrations cannot fill the
 * table for another's. */
Test(warden, one_users_registrations_leave_room_for_another)
{
	struct sv_warden_table *t = sv_warden_table_new();
	struct sockaddr_storage a = v4("10.2.0.1", 80);
	for (unsigned i = 0; i < SV_WARDEN_TABLE_PER_UID; i++) {
		struct sv_warden_listener l = at(a, false, 1000 + i);
		cr_assert_eq(sv_warden_table_add(t, 666, &l, 42000), 0);
	}
	struct sv_warden_listener more = at(a, false, 5000);
	cr_assert_eq(sv_warden_table_add(t, 666, &more, 42000), -ENOSPC, "its share is full");
	struct sv_warden_listener other = at(v4("10.2.0.2", 80), false, 6000);
	cr_assert_eq(sv_warden_table_add(t, 1000, &other, 42001), 0, "another user's still fits");
	cr_assert_eq(sv_warden_table_count_uid(t, 666), SV_WARDEN_TABLE_PER_UID);
	sv_warden_table_free(t);
}

/* ---- The library's side, against a fake warden ---- */

static char path[108];
static int fake = -1;

static void fake_up(void)
{
	snprintf(path, sizeof(path), "/tmp/sovia-warden-test.%d", (int)getpid());
	unlink(path);
	fake = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	strcpy(un.sun_path, path);
	cr_assert_eq(bind(fake, (struct sockaddr *)&un, sizeof(un)), 0);
	cr_assert_eq(listen(fake, 8), 0);
	sv_warden_path = path;
}

static void fake_down(void)
{
	close(fake);
	unlink(path);
	sv_warden_path = SV_WARDEN_SOCKET;
}

/* What a registration's done() heard, and when. */
static atomic_int heard = 1;
static _Atomic uint64_t heard_at;
static void done(void *arg, int r)
{
	(void)arg;
	heard_at = ms_now();
	atomic_store(&heard, r);
}
static int wait_heard(void)
{
	for (int i = 0; i < 4000 && atomic_load(&heard) == 1; i++)
		usleep(1000);
	return atomic_load(&heard);
}

/* The fake warden takes a registration: its connection, the port it
 * named and the fd it passed (checked as the warden checks it). */
static int fake_take(uint16_t *port, int *passed)
{
	int c = accept(fake, NULL, NULL);
	cr_assert_geq(c, 0);
	uint8_t m[16];
	ssize_t n = fdpass_recv(c, m, sizeof(m), passed, 0);
	cr_assert_eq(sv_warden_msg_decode(m, (size_t)n, port), 0);
	cr_assert_geq(*passed, 0, "a fd came");
	return c;
}

Test(warden, a_registration_passes_the_listener_and_lets_go, .init = fake_up, .fini = fake_down)
{
	diag_up();
	int l = tcp_socket(AF_INET, "127.0.0.1", 0, true);
	atomic_store(&heard, 1);
	cr_assert_eq(sv_warden_register(l, 40101, false, done, NULL), 0);
	uint16_t port;
	int passed;
	int c = fake_take(&port, &passed);
	cr_assert_eq(port, 40101);
	struct sv_warden_listener a;
	cr_assert_eq(sv_warden_check_listener(diag, passed, &a), 0, "the listener itself");
	close(passed);
	cr_assert_eq(wait_heard(), 0, "taken for made once sent");
	char b;
	struct pollfd p = {.fd = c, .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 2000), 1);
	cr_assert_eq(recv(c, &b, 1, MSG_DONTWAIT), 0, "the connection ends: the registration lasts "
						     "as long as the socket listens");
	close(c);
	close(l);
	diag_down();
}

/* Issue 53: libsovia never waits for the warden. One that takes the
 * connection and never answers costs a registration that must be
 * answered SV_WARDEN_WAIT_MS, on the registration's own thread; the
 * caller returns at once either way. */
Test(warden, a_warden_that_never_answers_stalls_nobody, .init = fake_up, .fini = fake_down)
{
	int l = tcp_socket(AF_INET, "127.0.0.1", 0, true);
	atomic_store(&heard, 1);
	uint64_t t0 = ms_now();
	cr_assert_eq(sv_warden_register(l, 40300, true, done, NULL), 0);
	uint64_t call = ms_now() - t0;
	cr_assert_lt(call, 100, "the call waited %llu ms", (unsigned long long)call);
	cr_assert_eq(wait_heard(), -ETIMEDOUT, "no answer in time");
	cr_assert_geq(heard_at - t0, SV_WARDEN_WAIT_MS - 50, "it waited for the answer");
	close(l);
}

Test(warden, no_warden_and_a_refusal_are_errors)
{
	int l = tcp_socket(AF_INET, "127.0.0.1", 0, true);
	sv_warden_path = "/nonexistent/sovia-warden.sock";
	atomic_store(&heard, 1);
	cr_assert_eq(sv_warden_register(l, 40200, true, done, NULL), 0);
	cr_assert_eq(wait_heard(), -ENOENT);
	fake_up();
	pid_t answerer = fork();
	cr_assert_geq(answerer, 0);
	if (answerer == 0) {
		int c = accept(fake, NULL, NULL);
		char b[16];
		_exit(c >= 0 && recv(c, b, sizeof(b), 0) > 0 && send(c, "n", 1, 0) == 1 ? 0 : 1);
	}
	atomic_store(&heard, 1);
	cr_assert_eq(sv_warden_register(l, 40201, true, done, NULL), 0);
	cr_assert_eq(wait_heard(), -EACCES);
	int st;
	waitpid(answerer, &st, 0);
	fake_down();
	close(l);
}
