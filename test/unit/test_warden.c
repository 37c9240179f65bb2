/* sovia-warden's pieces (src/warden.h): the registration's wire format,
 * what the warden accepts as proof that a registrant holds a listening
 * TCP socket, the table it answers clients from, and the library's side
 * of a registration (held while the listener lives, not by a fork's
 * child). */
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(warden, .timeout = 30);

Test(warden, a_registration_decodes_as_encoded_and_nothing_else_does)
{
	uint8_t m[SV_WARDEN_MSG_LEN];
	uint16_t port = 0;
	sv_warden_msg_encode(51234, m);
	cr_assert_eq(memcmp(m, "SOVW\x01\x00", 6), 0, "magic, version and a zero byte");
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

static int tcp_socket(int family, const char *ip, bool listening)
{
	int fd = socket(family, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	struct sockaddr_storage ss = family == AF_INET ? v4(ip, 0) : v6(ip, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&ss, sizeof(ss)), 0, "bind: %s", strerror(errno));
	if (listening)
		cr_assert_eq(listen(fd, 4), 0);
	return fd;
}

Test(warden, only_a_listening_tcp_socket_is_proof)
{
	struct sockaddr_storage a;
	bool only = true;
	int l = tcp_socket(AF_INET, "127.0.0.1", true);
	cr_assert_eq(sv_warden_check_listener(l, &a, &only), 0);
	cr_assert_eq(a.ss_family, AF_INET);
	cr_assert_neq(sv_addr_port((struct sockaddr *)&a), 0, "its address and port");
	cr_assert_not(only);

	int bound = tcp_socket(AF_INET, "127.0.0.1", false);
	cr_assert_eq(sv_warden_check_listener(bound, &a, &only), -EINVAL, "bound, not listening");
	int udp = socket(AF_INET, SOCK_DGRAM, 0);
	cr_assert_eq(sv_warden_check_listener(udp, &a, &only), -EPROTOTYPE);
	int un = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_eq(sv_warden_check_listener(un, &a, &only), -EPROTOTYPE);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(sv_warden_check_listener(p[0], &a, &only), -ENOTSOCK);

	int l6 = socket(AF_INET6, SOCK_STREAM, 0);
	int one = 1;
	cr_assert_eq(setsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)), 0);
	struct sockaddr_storage any6 = v6("::", 0);
	cr_assert_eq(bind(l6, (struct sockaddr *)&any6, sizeof(any6)), 0);
	cr_assert_eq(listen(l6, 4), 0);
	cr_assert_eq(sv_warden_check_listener(l6, &a, &only), 0);
	cr_assert(only, "IPV6_V6ONLY is read");
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
Test(warden, a_listener_of_another_network_namespace_is_refused)
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
	struct sockaddr_storage a;
	bool only;
	cr_assert_eq(sv_warden_check_listener(fd, &a, &only), -EXDEV);
	close(fd);
}

Test(warden, the_table_answers_with_the_best_and_newest_listener)
{
	struct sv_warden_table *t = sv_warden_table_new();
	cr_assert_not_null(t);
	struct sockaddr_storage any4 = v4("0.0.0.0", 5432), one = v4("10.1.0.1", 5432);
	struct sockaddr_storage any6 = v6("::", 6379);
	cr_assert_eq(sv_warden_table_lookup(t, &one), 0, "empty");
	cr_assert_eq(sv_warden_table_add(t, 10, &any4, false, 40001), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &one), 40001, "a wildcard takes the address");
	struct sockaddr_storage other_port = v4("10.1.0.1", 5433);
	cr_assert_eq(sv_warden_table_lookup(t, &other_port), 0, "not another port");
	struct sockaddr_storage v6srv = v6("fd00::1", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &v6srv), 0, "0.0.0.0 takes no IPv6");
	cr_assert_eq(sv_warden_table_add(t, 11, &one, false, 40002), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &one), 40002, "its very address beats a wildcard");
	struct sockaddr_storage two = v4("10.1.0.2", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &two), 40001);
	cr_assert_eq(sv_warden_table_add(t, 12, &any4, false, 40003), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &two), 40003, "the newer of two alike");
	cr_assert_eq(sv_warden_table_add(t, 12, &one, false, 1), -EEXIST, "one per connection");
	sv_warden_table_drop(t, 12);
	cr_assert_eq(sv_warden_table_lookup(t, &two), 40001, "gone with its connection");
	sv_warden_table_drop(t, 11);
	cr_assert_eq(sv_warden_table_lookup(t, &one), 40001);

	struct sockaddr_storage r4 = v4("10.1.0.1", 6379), r6 = v6("fd00::2", 6379);
	struct sockaddr_storage mapped = v6("::ffff:10.1.0.1", 5432);
	cr_assert_eq(sv_warden_table_lookup(t, &mapped), 40001, "IPv4-mapped is IPv4");
	cr_assert_eq(sv_warden_table_add(t, 20, &any6, true, 40020), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &r6), 40020);
	cr_assert_eq(sv_warden_table_lookup(t, &r4), 0, ":: with IPV6_V6ONLY takes no IPv4");
	sv_warden_table_drop(t, 20);
	cr_assert_eq(sv_warden_table_add(t, 21, &any6, false, 40021), 0);
	cr_assert_eq(sv_warden_table_lookup(t, &r4), 40021, ":: takes IPv4 too");
	cr_assert_eq(sv_warden_table_count(t), 2);
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
}

static void fake_down(void)
{
	close(fake);
	unlink(path);
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

/* Has the registrant let go of connection c (end of file)? */
static bool let_go(int c)
{
	struct pollfd p = {.fd = c, .events = POLLIN};
	char b;
	return poll(&p, 1, 200) == 1 && recv(c, &b, 1, MSG_DONTWAIT) == 0;
}

Test(warden, a_registration_lasts_until_unregistered_and_a_forks_child_ends_none,
     .init = fake_up, .fini = fake_down)
{
	int l = tcp_socket(AF_INET, "127.0.0.1", true);
	/* The answer comes from a child, while the library waits for it. */
	pid_t answerer = fork();
	cr_assert_geq(answerer, 0);
	if (answerer == 0) {
		int c = accept(fake, NULL, NULL);
		char b[16];
		_exit(c >= 0 && recv(c, b, sizeof(b), 0) == SV_WARDEN_MSG_LEN &&
				      send(c, "y", 1, 0) == 1
			      ? 0
			      : 1);
	}
	int h = sv_warden_register(path, l, 40100, 2000);
	int st;
	waitpid(answerer, &st, 0);
	cr_assert_geq(h, 0, "registered: %s", strerror(-h));
	sv_warden_unregister(h);

	/* Without waiting for the answer (0 ms): the warden's side. */
	h = sv_warden_register(path, l, 40101, 0);
	cr_assert_geq(h, 0);
	uint16_t port;
	int passed;
	int c = fake_take(&port, &passed);
	cr_assert_eq(port, 40101);
	struct sockaddr_storage a;
	bool only;
	cr_assert_eq(sv_warden_check_listener(passed, &a, &only), 0, "the listener itself");
	close(passed);
	cr_assert_not(let_go(c), "held while registered");

	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		sv_warden_atfork_child();
		sv_warden_unregister(h); /* the parent's: nothing to do */
		_exit(0);
	}
	waitpid(child, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_not(let_go(c), "a fork's child does not end the parent's registration");
	sv_warden_unregister(h);
	cr_assert(let_go(c), "unregistered: the warden sees the end");
	close(c);
	close(l);
}

Test(warden, no_warden_and_a_refusal_are_errors)
{
	int l = tcp_socket(AF_INET, "127.0.0.1", true);
	cr_assert_eq(sv_warden_register("/nonexistent/sovia-warden.sock", l, 40200, 100), -ENOENT);
	fake_up();
	pid_t answerer = fork();
	cr_assert_geq(answerer, 0);
	if (answerer == 0) {
		int c = accept(fake, NULL, NULL);
		char b[16];
		_exit(c >= 0 && recv(c, b, sizeof(b), 0) > 0 && send(c, "n", 1, 0) == 1 ? 0 : 1);
	}
	cr_assert_eq(sv_warden_register(path, l, 40201, 2000), -EACCES);
	int st;
	waitpid(answerer, &st, 0);
	fake_down();
	close(l);
}
