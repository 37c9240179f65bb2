/* A server that closes while the connection switches to RDMA must still end
 * it the way TCP would: the client reads the server's bytes and then EOF,
 * never a reset. (A plain socket program.)
 *
 *   sovia-closerace -s PORT N STEP_US   server: N connections, one at a time
 *   sovia-closerace -c HOST PORT N      client
 *
 * For connection i the client sends one byte; the server reads it, answers
 * with one byte, waits i * STEP_US and closes. The growing wait sweeps the
 * server's close across the switch to RDMA that starts behind each new
 * connection: some close before it, some while the client's announcement
 * and challenge echo are under way, some after. The client must read the
 * answer, then 0, on every connection. Each side exits non-zero at the
 * first surprise. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *me = "?";

#define CHECK(cond, ...)                                                                    \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "sovia-closerace %s: line %d: ", me, __LINE__);     \
			fprintf(stderr, __VA_ARGS__);                                       \
			fprintf(stderr, " (errno %s)\n", strerror(errno));                  \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static struct addrinfo *resolve(const char *host, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = host ? 0 : AI_PASSIVE}, *ai;
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo %s", port);
	return ai;
}

static void client(const char *host, const char *port, int n)
{
	struct addrinfo *ai = resolve(host, port);
	for (int i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0, "connect %d", i);
		CHECK(send(fd, "q", 1, MSG_NOSIGNAL) == 1, "connection %d: send", i);
		char c = 0;
		ssize_t r = recv(fd, &c, 1, 0);
		CHECK(r == 1 && c == 'a', "connection %d: the answer: recv gave %zd", i, r);
		r = recv(fd, &c, 1, 0);
		CHECK(r == 0, "connection %d: the server's close: recv gave %zd", i, r);
		CHECK(close(fd) == 0, "close %d", i);
	}
	freeaddrinfo(ai);
	printf("client: %d connections, each ended with the answer and EOF\n", n);
}

static void server(const char *port, int n, long step_us)
{
	struct addrinfo *ai = resolve(NULL, port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(l >= 0 && bind(l, ai->ai_addr, ai->ai_addrlen) == 0 && listen(l, 8) == 0, "listen");
	freeaddrinfo(ai);
	for (int i = 0; i < n; i++) {
		int fd = accept(l, NULL, NULL);
		CHECK(fd >= 0, "accept %d", i);
		char c = 0;
		CHECK(recv(fd, &c, 1, 0) == 1 && c == 'q', "connection %d: no request", i);
		CHECK(send(fd, "a", 1, MSG_NOSIGNAL) == 1, "connection %d: send", i);
		if (i)
			usleep((useconds_t)(i * step_us));
		CHECK(close(fd) == 0, "close %d", i);
	}
	close(l);
	printf("server: %d connections served\n", n);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && strcmp(argv[1], "-s") == 0) {
		me = "server";
		server(argv[2], atoi(argv[3]), atol(argv[4]));
	} else if (argc == 5 && strcmp(argv[1], "-c") == 0) {
		me = "client";
		client(argv[2], argv[3], atoi(argv[4]));
	} else {
		fprintf(stderr, "usage: sovia-closerace -s PORT N STEP_US | -c HOST PORT N\n");
		return 2;
	}
	return 0;
}
