/* dup, dup2, dup3 and fcntl(F_DUPFD*) on connected sockets: every copy is
 * the same connection, and it lives until the last copy is closed. A plain
 * socket program that checks every byte.
 *
 *   sovia-dup -s PORT           echo server: serves each connection through
 *                               a dup of the accepted fd (the original is
 *                               closed at once), one at a time, COUNT times
 *   sovia-dup -c HOST PORT N [GATE]
 *                               client: sends N bytes, switching fds midway
 *                               (dup, close the original, dup3, F_DUPFD),
 *                               and reads the echo through a dup2 copy.
 *                               With GATE (a path), the sender waits at the
 *                               midpoint until GATE exists (at most 120 s):
 *                               the test's way to switch fds after a known
 *                               event, such as the upgrade. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "sovia-dup: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint8_t pattern(uint64_t off)
{
	return (uint8_t)(off * 131 + (off >> 12));
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			die("write");
		}
		p += w;
		n -= (size_t)w;
	}
}

static int serve(const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE}, *ai;
	if (getaddrinfo(NULL, port, &hints, &ai))
		die("getaddrinfo");
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, ai->ai_addr, ai->ai_addrlen) || listen(l, 4))
		die("listen");
	freeaddrinfo(ai);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	int e = dup(c);
	if (e < 0)
		die("dup");
	close(c); /* the copy alone carries the connection from here */
	static uint8_t buf[1 << 16];
	uint64_t total = 0;
	for (;;) {
		ssize_t r = read(e, buf, sizeof(buf));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (r == 0)
			break;
		write_all(e, buf, (size_t)r);
		total += (uint64_t)r;
	}
	shutdown(e, SHUT_WR);
	close(e);
	close(l);
	printf("server: echoed %llu bytes through a dup\n", (unsigned long long)total);
	return 0;
}

struct sender {
	int fd;
	uint64_t n;
	const char *gate;
};

static void wait_gate(const char *gate)
{
	for (int i = 0; gate && i < 12000 && access(gate, F_OK) != 0; i++)
		usleep(10000);
}

static void *send_all(void *arg)
{
	struct sender *s = arg;
	static uint8_t buf[1 << 16];
	uint64_t off = 0;
	int fd = s->fd;
	bool switched = false;
	while (off < s->n) {
		if (!switched && off >= s->n / 2) {
			/* Midway: go on through copies, the original closed. */
			wait_gate(s->gate);
			int d = dup(fd);
			if (d < 0)
				die("dup");
			if (close(fd))
				die("close original");
			int d3 = dup3(d, d + 7, O_CLOEXEC);
			if (d3 < 0)
				die("dup3");
			int hi = fcntl(d3, F_DUPFD, 200);
			if (hi < 200)
				die("F_DUPFD");
			close(d);
			close(d3);
			fd = hi;
			switched = true;
		}
		size_t n = sizeof(buf);
		if (n > s->n - off)
			n = (size_t)(s->n - off);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(off + i);
		write_all(fd, buf, n);
		off += n;
	}
	if (shutdown(fd, SHUT_WR))
		die("shutdown");
	s->fd = fd;
	return NULL;
}

static int client(const char *host, const char *port, uint64_t n, const char *gate)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, port, &hints, &ai))
		die("getaddrinfo");
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen))
		die("connect");
	freeaddrinfo(ai);
	/* The reader's copy, made before the sender starts switching. */
	int rd = dup2(fd, 100);
	if (rd != 100)
		die("dup2");
	struct sender s = {.fd = fd, .n = n, .gate = gate};
	pthread_t t;
	if (pthread_create(&t, NULL, send_all, &s))
		die("pthread_create");
	static uint8_t buf[1 << 16];
	uint64_t got = 0;
	for (;;) {
		ssize_t r = read(rd, buf, sizeof(buf));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (r == 0)
			break;
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pattern(got + (uint64_t)i)) {
				fprintf(stderr, "sovia-dup: byte %llu differs\n",
					(unsigned long long)(got + (uint64_t)i));
				return 1;
			}
		got += (uint64_t)r;
	}
	pthread_join(t, NULL);
	close(s.fd);
	close(rd);
	if (got != n) {
		fprintf(stderr, "sovia-dup: got %llu of %llu bytes\n", (unsigned long long)got,
			(unsigned long long)n);
		return 1;
	}
	printf("client: %llu bytes echoed identical through copies\n", (unsigned long long)got);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "-s") == 0)
		return serve(argv[2]);
	if ((argc == 5 || argc == 6) && strcmp(argv[1], "-c") == 0)
		return client(argv[2], argv[3], strtoull(argv[4], NULL, 10),
			      argc == 6 ? argv[5] : NULL);
	fprintf(stderr, "usage: sovia-dup -s PORT | -c HOST PORT BYTES [GATE]\n");
	return 2;
}
