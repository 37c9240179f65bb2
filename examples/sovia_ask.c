/* sovia-ask: a program that asks libsovia about its own connection
 * (include/sovia.h), the example of the public API.
 *
 *   sovia-ask server PORT [ADDR]     accept one connection, read it to its end
 *   sovia-ask client ADDR PORT [MB]  connect, write until the sending is on
 *                                    RDMA or MB MiB went (default 256), then
 *                                    a last MiB, and wait for the server
 *
 * Each side prints one line about its connection, e.g.
 *   client: libsovia 0.1.0 managed=1 tx=rdma rx=rdma state=rdma fallback=none ...
 *   client: not accelerated (libsovia is not loaded)
 * It builds against the installed header alone:
 *   cc sovia_ask.c $(pkg-config --cflags --libs libsovia)
 * and runs the same with or without LD_PRELOAD. */
/* getaddrinfo and the sockets calls, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include <sovia.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *medium(uint32_t m)
{
	return m == SOVIA_MEDIUM_RDMA ? "rdma" : m == SOVIA_MEDIUM_TCP ? "tcp" : "none";
}

/* 1 once libsovia says our sending goes over RDMA. */
static int report(const char *who, int fd, int quiet)
{
	struct sovia_conn_info info = {.size = sizeof(info)};
	if (sovia_conn_info(fd, &info) < 0) {
		perror("sovia_conn_info");
		exit(1);
	}
	if (!quiet) {
		const char *v = sovia_version();
		if (!v)
			printf("%s: not accelerated (libsovia is not loaded)\n", who);
		else if (!info.managed)
			printf("%s: libsovia %s: not accelerated (not a connection it manages)\n", who, v);
		else
			printf("%s: libsovia %s managed=1 tx=%s rx=%s state=%s fallback=%s "
			       "rdma_tx_bytes=%llu rdma_rx_bytes=%llu tcp_tx_bytes=%llu "
			       "tcp_rx_bytes=%llu time_to_rdma_us=%llu\n",
			       who, v, medium(info.tx_medium), medium(info.rx_medium), info.state,
			       info.fallback, (unsigned long long)info.rdma_tx_bytes,
			       (unsigned long long)info.rdma_rx_bytes,
			       (unsigned long long)info.tcp_tx_bytes,
			       (unsigned long long)info.tcp_rx_bytes,
			       (unsigned long long)info.time_to_rdma_us);
		fflush(stdout);
	}
	return info.tx_medium == SOVIA_MEDIUM_RDMA;
}

static int server(const char *port, const char *addr)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
	if (inet_pton(AF_INET, addr ? addr : "0.0.0.0", &a.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", addr);
		return 2;
	}
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0) {
		perror("bind/listen");
		return 1;
	}
	int c = accept(l, NULL, NULL);
	if (c < 0) {
		perror("accept");
		return 1;
	}
	static char buf[1 << 16];
	ssize_t n;
	while ((n = read(c, buf, sizeof(buf))) > 0)
		;
	if (n < 0) {
		perror("read");
		return 1;
	}
	report("server", c, 0); /* before the close: the connection is still there */
	close(c);
	close(l);
	return 0;
}

static int client(const char *addr, const char *port, long mb)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(addr, port, &hints, &ai) != 0) {
		fprintf(stderr, "cannot resolve %s\n", addr);
		return 2;
	}
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, ai->ai_addr, ai->ai_addrlen) < 0) {
		perror("connect");
		return 1;
	}
	freeaddrinfo(ai);
	static char buf[1 << 16];
	memset(buf, 'a', sizeof(buf));
	/* The first connection between two hosts starts on TCP: write until
	 * the sending moved (or the bound), then a last MiB over whatever it
	 * moved to. */
	long chunks = mb * 16, last = 16;
	int on_rdma = 0;
	for (long i = 0; i < chunks + last; i++) {
		if (write(c, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			perror("write");
			return 1;
		}
		if (!on_rdma && i < chunks && (on_rdma = report("client", c, 1)))
			i = chunks - 1;
	}
	report("client", c, 0);
	shutdown(c, SHUT_WR);
	while (read(c, buf, sizeof(buf)) > 0)
		;
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "server") == 0)
		return server(argv[2], argc > 3 ? argv[3] : NULL);
	if (argc >= 4 && strcmp(argv[1], "client") == 0)
		return client(argv[2], argv[3], argc > 4 ? atol(argv[4]) : 256);
	fprintf(stderr, "usage: sovia-ask server PORT [ADDR] | client ADDR PORT [MB]\n");
	return 2;
}
