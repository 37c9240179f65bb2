/* A connection whose two ends change their effective uid while it runs,
 * as ftpd does around each data connection's bind: the kernel then refuses
 * the RDMA files' writes to both (rdma_cm's, and rxe's doorbell).
 *
 *   sovia-setuid -s PORT BYTES CONNS        receive BYTES, check, answer
 *   sovia-setuid -c HOST PORT BYTES CONNS   send BYTES, read the answer
 *
 * CONNS connections, one after the other. Each end switches its effective
 * uid to nobody's and back after every MiB it moves (run it as root). The
 * client connects, then waits for SIGUSR1 (the test sends it once the
 * first connection is on RDMA) before it sends; its later connections are
 * made after many changes and send at once. The server checks every byte,
 * then answers "OK <bytes>" and closes. A plain socket program: nothing in
 * it knows about libsovia. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MIB (1u << 20)
#define NOBODY 65534

static void die(const char *what)
{
	fprintf(stderr, "sovia-setuid: %s: %s\n", what, strerror(errno));
	exit(2);
}

static uint8_t pattern(uint64_t at)
{
	return (uint8_t)(at * 7 + (at >> 11));
}

static void flip_euid(void)
{
	if (seteuid(NOBODY) < 0 || seteuid(0) < 0)
		die("seteuid");
}

static int serve_one(int l, uint64_t bytes);

static int serve(int port, uint64_t bytes, int conns)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0)
		die("listen");
	for (int i = 0; i < conns; i++)
		if (serve_one(l, bytes))
			return 1;
	return 0;
}

static int serve_one(int l, uint64_t bytes)
{
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	static uint8_t buf[65536];
	uint64_t got = 0, next_flip = MIB;
	for (;;) {
		ssize_t n = read(c, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read");
		if (n == 0)
			break;
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(got + (uint64_t)i)) {
				fprintf(stderr, "sovia-setuid: byte %llu differs\n",
					(unsigned long long)(got + (uint64_t)i));
				return 1;
			}
		got += (uint64_t)n;
		if (got >= next_flip) {
			flip_euid();
			next_flip += MIB;
		}
	}
	if (got != bytes) {
		fprintf(stderr, "sovia-setuid: got %llu bytes, not %llu\n",
			(unsigned long long)got, (unsigned long long)bytes);
		return 1;
	}
	flip_euid(); /* the answer goes out after a change too */
	char ans[64];
	int len = snprintf(ans, sizeof(ans), "OK %llu\n", (unsigned long long)got);
	if (write(c, ans, (size_t)len) != len)
		die("write");
	close(c);
	printf("%s", ans);
	return 0;
}

static volatile sig_atomic_t go;
static void on_usr1(int sig)
{
	(void)sig;
	go = 1;
}

static int send_one(const char *host, const char *port, uint64_t bytes)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, port, &hints, &ai) != 0)
		die("getaddrinfo");
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || connect(c, ai->ai_addr, ai->ai_addrlen) < 0)
		die("connect");
	freeaddrinfo(ai);
	while (!go)
		pause();
	static uint8_t buf[65536];
	uint64_t sent = 0, next_flip = MIB;
	while (sent < bytes) {
		size_t n = sizeof(buf);
		if (bytes - sent < n)
			n = (size_t)(bytes - sent);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(sent + i);
		size_t off = 0;
		while (off < n) {
			ssize_t w = write(c, buf + off, n - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				die("write");
			off += (size_t)w;
		}
		sent += n;
		if (sent >= next_flip) {
			flip_euid();
			next_flip += MIB;
		}
	}
	if (shutdown(c, SHUT_WR) < 0)
		die("shutdown");
	char ans[64] = {0};
	size_t have = 0;
	for (;;) {
		ssize_t n = read(c, ans + have, sizeof(ans) - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read");
		if (n == 0 || (have += (size_t)n) == sizeof(ans) - 1)
			break;
	}
	close(c);
	printf("answer: %s", ans);
	return strncmp(ans, "OK ", 3) == 0 ? 0 : 1;
}

static int send_all(const char *host, const char *port, uint64_t bytes, int conns)
{
	signal(SIGUSR1, on_usr1);
	for (int i = 0; i < conns; i++) {
		if (i > 0)
			go = 1;
		if (send_one(host, port, bytes))
			return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "-s") == 0)
		return serve(atoi(argv[2]), strtoull(argv[3], NULL, 10), atoi(argv[4]));
	if (argc == 6 && strcmp(argv[1], "-c") == 0)
		return send_all(argv[2], argv[3], strtoull(argv[4], NULL, 10), atoi(argv[5]));
	fprintf(stderr, "usage: sovia-setuid -s PORT BYTES CONNS | -c HOST PORT BYTES CONNS\n");
	return 2;
}
