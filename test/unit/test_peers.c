/* The peer table (src/peers.c): what it says of hosts and ports, and its
 * sharing between the user's processes through its file. Each test runs in
 * its own process (Criterion's default), so each opens its table afresh. */
#include "peers.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64], path[96];

static void make_dir(void)
{
	strcpy(dir, "/tmp/sv-peers.XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/table", dir);
}

static void remove_dir(void)
{
	unlink(path);
	rmdir(dir);
}

TestSuite(peers, .init = make_dir, .fini = remove_dir, .timeout = 10);

static struct sockaddr_storage v4(const char *ip, unsigned port)
{
	struct sockaddr_storage ss = {0};
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	in->sin_family = AF_INET;
	in->sin_port = htons((uint16_t)port);
	cr_assert_eq(inet_pton(AF_INET, ip, &in->sin_addr), 1);
	return ss;
}

static struct sockaddr_storage v6(const char *ip, unsigned port)
{
	struct sockaddr_storage ss = {0};
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons((uint16_t)port);
	cr_assert_eq(inet_pton(AF_INET6, ip, &in6->sin6_addr), 1);
	return ss;
}

static bool expect(struct sockaddr_storage ss, bool client)
{
	uint32_t setup = 0;
	return sv_peers_expect(&ss, client, &setup);
}

Test(peers, a_host_is_known_on_every_port_in_both_roles)
{
	sv_peers_use(NULL);
	cr_assert(!expect(v4("10.0.0.1", 80), true));
	sv_peers_learn(&(struct sockaddr_storage){0}, true, 5); /* no address: ignored */
	struct sockaddr_storage a = v4("10.0.0.1", 80);
	sv_peers_learn(&a, true, 1234);
	uint32_t setup = 0;
	cr_assert(sv_peers_expect(&a, true, &setup));
	cr_assert_eq(setup, 1234);
	cr_assert(expect(v4("10.0.0.1", 21), true));
	cr_assert(expect(v4("10.0.0.1", 40000), false));
	cr_assert(!expect(v4("10.0.0.2", 80), true));
	/* The same address as IPv4-mapped IPv6 is the same host. */
	cr_assert(expect(v6("::ffff:10.0.0.1", 80), true));
	cr_assert(!expect(v6("fe80::1", 80), true));
}

Test(peers, a_plain_port_holds_its_clients_back_only)
{
	sv_peers_use(NULL);
	struct sockaddr_storage web = v4("10.0.0.1", 80), ssh = v4("10.0.0.1", 22);
	sv_peers_learn(&web, true, 100);
	sv_peers_plain_port(&ssh);
	cr_assert(!expect(ssh, true), "a client of the plain port would wait");
	cr_assert(sv_peers_plain(&ssh), "a client of the plain port would try");
	cr_assert(!sv_peers_plain(&web));
	cr_assert(expect(web, true));
	cr_assert(expect(ssh, false), "the host's clients are still known to a server");
	/* libsovia answered there after all (the server was restarted
	 * preloaded): the port is no longer plain. */
	sv_peers_learn(&ssh, true, 100);
	cr_assert(expect(ssh, true));
	cr_assert(!sv_peers_plain(&ssh));
}

Test(peers, a_host_without_a_route_is_plain_for_its_clients)
{
	sv_peers_use(NULL);
	struct sockaddr_storage a = v4("10.0.0.1", 80);
	cr_assert(!sv_peers_plain(&a));
	sv_peers_learn(&a, false, 100);
	cr_assert(!sv_peers_plain(&a));
	sv_peers_no_route(&a);
	cr_assert(!expect(a, true));
	cr_assert(!expect(a, false));
	cr_assert(sv_peers_plain(&a));
	struct sockaddr_storage other = v4("10.0.0.1", 81);
	cr_assert(sv_peers_plain(&other));
	/* The route came back: a connection reached RDMA. */
	sv_peers_learn(&a, true, 100);
	cr_assert(!sv_peers_plain(&a));
	cr_assert(expect(a, true));
}

/* A server's first contact: a host nothing is known of, until a
 * connection with it reaches RDMA or its client turns out plain. */
Test(peers, a_first_contact_is_a_host_nothing_is_known_of)
{
	sv_peers_use(NULL);
	struct sockaddr_storage a = v4("10.0.0.1", 40000), b = v4("10.0.0.2", 40001);
	cr_assert(sv_peers_first_contact(&a));
	sv_peers_plain_client(&a);
	cr_assert(!sv_peers_first_contact(&a), "a plain client's host would hold again");
	struct sockaddr_storage a2 = v4("10.0.0.1", 40002);
	cr_assert(!sv_peers_first_contact(&a2), "the mark is the host's");
	cr_assert(!expect(a, false), "a plain client's host is no libsovia host");
	cr_assert(!sv_peers_plain(&a), "a plain client's host kept its clients from trying");
	cr_assert(sv_peers_first_contact(&b));
	/* A connection with it reached RDMA after all: a libsovia host. */
	sv_peers_learn(&a, false, 100);
	cr_assert(expect(a, false));
	cr_assert(!sv_peers_first_contact(&a));
	sv_peers_no_route(&b);
	cr_assert(!sv_peers_first_contact(&b), "a host without a route is no first contact");
	cr_assert(!sv_peers_first_contact(&(struct sockaddr_storage){0}), "no address");
}

/* The longest rdma_cm start-up noted is kept. */
Test(peers, the_longest_startup_is_kept)
{
	sv_peers_use(NULL);
	cr_assert_eq(sv_peers_startup(), 0);
	sv_peers_note_startup(300);
	sv_peers_note_startup(100);
	cr_assert_eq(sv_peers_startup(), 300);
	sv_peers_note_startup(450000);
	cr_assert_eq(sv_peers_startup(), 450000);
	struct sockaddr_storage any = v4("0.0.0.0", 0);
	cr_assert(sv_peers_first_contact(&any), "the start-up is no host");
}

/* More hosts than one run of slots holds, all hashing apart or together:
 * the newest are kept, and nothing else is mistaken for them. */
Test(peers, many_hosts)
{
	sv_peers_use(NULL);
	char ip[32];
	for (unsigned i = 0; i < 3000; i++) {
		snprintf(ip, sizeof(ip), "10.1.%u.%u", i / 250, i % 250);
		struct sockaddr_storage a = v4(ip, 1);
		sv_peers_learn(&a, false, i + 1);
		uint32_t setup = 0;
		cr_assert(sv_peers_expect(&a, false, &setup), "%s", ip);
		cr_assert_eq(setup, i + 1);
	}
	cr_assert(!expect(v4("10.2.0.1", 1), false));
}

/* What one process learns, another of the user's processes knows. */
Test(peers, processes_share_the_file)
{
	sv_peers_use(path);
	cr_assert(!expect(v4("10.0.0.9", 5000), true)); /* opens (creates) it */
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600);
	pid_t c = fork();
	if (c == 0) {
		struct sockaddr_storage a = v4("10.0.0.9", 5000);
		sv_peers_learn(&a, true, 77);
		_exit(0);
	}
	int status;
	cr_assert_eq(waitpid(c, &status, 0), c);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	uint32_t setup = 0;
	struct sockaddr_storage a = v4("10.0.0.9", 1);
	cr_assert(sv_peers_expect(&a, true, &setup), "the child's entry is not seen");
	cr_assert_eq(setup, 77);
}

/* A file others may write is not trusted: the process keeps its own table. */
Test(peers, a_file_others_may_write_is_left_alone)
{
	int fd = open(path, O_CREAT | O_RDWR, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(fchmod(fd, 0666), 0);
	close(fd);
	sv_peers_use(path);
	struct sockaddr_storage a = v4("10.0.0.9", 5000);
	sv_peers_learn(&a, true, 77);
	cr_assert(expect(a, true), "the process's own table works");
	cr_assert_eq(stat(path, &(struct stat){0}), 0);
	struct stat st;
	stat(path, &st);
	cr_assert_eq(st.st_size, 0, "the untrusted file was written");
}

/* A file of another size (another layout) is left alone as well. */
Test(peers, a_file_of_another_layout_is_left_alone)
{
	int fd = open(path, O_CREAT | O_RDWR, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "not a table", 11), 11);
	close(fd);
	sv_peers_use(path);
	struct sockaddr_storage a = v4("10.0.0.9", 5000);
	sv_peers_learn(&a, true, 77);
	cr_assert(expect(a, true));
	struct stat st;
	stat(path, &st);
	cr_assert_eq(st.st_size, 11);
}
