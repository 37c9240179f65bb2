/* "Readable" must mean a read will not block: checked while connections
 * switch to RDMA under a waiting application (a plain socket program).
 *
 *   sovia-ready -s PORT N [DELAY_MS]   server: N connections, one at a time
 *   sovia-ready -c HOST PORT N         client
 *   sovia-ready -S PORT N STEP_US      close-race server (below)
 *   sovia-ready -C HOST PORT N         close-race client
 *
 * The client first opens four busy connections on which the server streams
 * data without pause. Then, for each of N connections, the client waits
 * until the new connection is readable (select, poll and epoll in turn),
 * watching the busy ones as well and draining them whenever readable,
 * as iperf3 does with its control and data connections. The server sends
 * nothing on the new connection for DELAY_MS (default 300): meanwhile it
 * switches to RDMA, and the peer's switch puts bytes on TCP that are
 * libsovia's, not the application's. Once told readable, the client reads
 * with MSG_DONTWAIT: on the kernel's TCP that always finds the server's
 * byte, so EAGAIN here means a readiness lie (an application doing a
 * blocking read would hang). Then the client answers and both close. Each
 * side exits non-zero at the first surprise.
 *
 * The close race: a server that closes while the connection switches must
 * still end it the way TCP would, so the client reads the answer and then
 * EOF, never a reset. For connection i the client sends one byte; the
 * server reads it, answers with one byte, waits i * STEP_US and closes. The
 * growing wait sweeps the server's close across the switch that starts
 * behind each new connection. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *me = "?";

#define CHECK(cond, ...)                                                                    \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "sovia-ready %s: line %d: ", me, __LINE__);         \
			fprintf(stderr, __VA_ARGS__);                                       \
			fprintf(stderr, " (errno %s)\n", strerror(errno));                  \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static const char *const how[] = {"select", "poll", "epoll"};

static long long drained;

/* Read what the busy connection has, without blocking. */
static void drain(int busy)
{
	static char buf[65536];
	ssize_t r;
	while ((r = recv(busy, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		drained += r;
	CHECK(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "the busy connection: %zd", r);
}

/* Block until fd is readable, the way how[mode] does it, while draining
 * the busy connection. The new connection comes first in each wait, so it
 * is judged before the busy one's completions are handled. */
#define NBUSY 4

static void wait_readable(int fd, const int *busy, int mode)
{
	for (;;) {
		int r;
		bool ready = false, busy_ready[NBUSY] = {false};
		switch (mode) {
		case 0: {
			fd_set rd;
			FD_ZERO(&rd);
			FD_SET(fd, &rd);
			for (int b = 0; b < NBUSY; b++)
				FD_SET(busy[b], &rd);
			r = select(busy[NBUSY - 1] + 1, &rd, NULL, NULL, NULL);
			CHECK(r > 0 || errno == EINTR, "select gave %d", r);
			ready = r > 0 && FD_ISSET(fd, &rd);
			for (int b = 0; b < NBUSY; b++)
				busy_ready[b] = r > 0 && FD_ISSET(busy[b], &rd);
			break;
		}
		case 1: {
			/* Counted as it is filled, as programs do: the count
			 * is not a constant, so a fortified build calls
			 * __poll_chk. */
			struct pollfd p[1 + NBUSY] = {{.fd = fd, .events = POLLIN}};
			nfds_t n = 1;
			for (int b = 0; b < NBUSY; b++)
				if (busy[b] >= 0)
					p[n++] = (struct pollfd){.fd = busy[b], .events = POLLIN};
			r = poll(p, n, -1);
			CHECK(r > 0 || errno == EINTR, "poll gave %d", r);
			ready = r > 0 && (p[0].revents & POLLIN);
			for (int b = 0; b < NBUSY; b++)
				busy_ready[b] = r > 0 && (p[1 + b].revents & POLLIN);
			break;
		}
		default: {
			int ep = epoll_create1(EPOLL_CLOEXEC);
			CHECK(ep >= 0, "epoll_create1");
			struct epoll_event ev = {.events = EPOLLIN, .data.u32 = NBUSY}, out[1 + NBUSY];
			CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl");
			for (int b = 0; b < NBUSY; b++) {
				ev.data.u32 = (uint32_t)b;
				CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, busy[b], &ev) == 0, "epoll_ctl");
			}
			r = epoll_wait(ep, out, 1 + NBUSY, -1);
			CHECK(r > 0 || errno == EINTR, "epoll_wait gave %d", r);
			for (int i = 0; i < r; i++) {
				if (!(out[i].events & EPOLLIN))
					continue;
				if (out[i].data.u32 == NBUSY)
					ready = true;
				else
					busy_ready[out[i].data.u32] = true;
			}
			close(ep);
			break;
		}
		}
		for (int b = 0; b < NBUSY; b++)
			if (busy_ready[b])
				drain(busy[b]);
		if (ready)
			return;
	}
}

static struct addrinfo *resolve(const char *host, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = host ? 0 : AI_PASSIVE}, *ai;
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo %s", port);
	return ai;
}

/* A listening socket on all IPv4 addresses. */
static int listen_on(const char *port)
{
	struct addrinfo *ai = resolve(NULL, port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(l >= 0 && bind(l, ai->ai_addr, ai->ai_addrlen) == 0 && listen(l, 8) == 0, "listen");
	freeaddrinfo(ai);
	return l;
}

static void client(const char *host, const char *port, int n)
{
	struct addrinfo *ai = resolve(host, port);
	int busy[NBUSY];
	for (int b = 0; b < NBUSY; b++) {
		int c = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(c >= 0 && connect(c, ai->ai_addr, ai->ai_addrlen) == 0, "connect busy");
		/* Above the new connections' fds: select judges them after. */
		busy[b] = dup2(c, 200 + b);
		CHECK(busy[b] == 200 + b && close(c) == 0, "dup2");
		CHECK(fcntl(busy[b], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	}
	for (int i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0, "connect %d", i);
		int mode = i % 3;
		wait_readable(fd, busy, mode);
		char c = 0;
		ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
		CHECK(r == 1 && c == 'x', "connection %d: %s said readable, then recv gave %zd", i,
		      how[mode], r);
		CHECK(send(fd, "y", 1, MSG_NOSIGNAL) == 1, "send %d", i);
		/* The server closes first: its end shows we got everything. */
		CHECK(recv(fd, &c, 1, 0) == 0, "connection %d: no end after the answer", i);
		close(fd);
	}
	freeaddrinfo(ai);
	for (int b = 0; b < NBUSY; b++)
		close(busy[b]);
	printf("client: %d connections, readable meant readable (select, poll, epoll); "
	       "%lld bytes drained from the busy ones\n", n, drained);
}

/* Stream on the busy connection until the client closes it. */
static void *stream_busy(void *arg)
{
	int fd = (int)(long)arg;
	char buf[65536]; /* one per thread */
	memset(buf, 'b', sizeof(buf));
	while (send(fd, buf, sizeof(buf), MSG_NOSIGNAL) > 0)
		;
	close(fd);
	return NULL;
}

static void server(const char *port, int n, int delay_ms)
{
	int l = listen_on(port);
	pthread_t t[NBUSY];
	for (int b = 0; b < NBUSY; b++) {
		int busy = accept(l, NULL, NULL);
		CHECK(busy >= 0, "accept busy");
		CHECK(pthread_create(&t[b], NULL, stream_busy, (void *)(long)busy) == 0,
		      "pthread_create");
	}
	for (int i = 0; i < n; i++) {
		int fd = accept(l, NULL, NULL);
		CHECK(fd >= 0, "accept %d", i);
		usleep((useconds_t)delay_ms * 1000u);
		CHECK(send(fd, "x", 1, MSG_NOSIGNAL) == 1, "send %d", i);
		char c = 0;
		CHECK(recv(fd, &c, 1, 0) == 1 && c == 'y', "connection %d: no answer", i);
		close(fd);
	}
	close(l);
	for (int b = 0; b < NBUSY; b++)
		pthread_join(t[b], NULL);
	printf("server: %d connections served\n", n);
}

static void race_client(const char *host, const char *port, int n)
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
	printf("close-race client: %d connections, each ended with the answer and EOF\n", n);
}

static void race_server(const char *port, int n, long step_us)
{
	int l = listen_on(port);
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
	printf("close-race server: %d connections served\n", n);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "-s") == 0) {
		me = "server";
		server(argv[2], atoi(argv[3]), argc == 5 ? atoi(argv[4]) : 300);
	} else if (argc == 5 && strcmp(argv[1], "-c") == 0) {
		me = "client";
		client(argv[2], argv[3], atoi(argv[4]));
	} else if (argc == 5 && strcmp(argv[1], "-S") == 0) {
		me = "close-race server";
		race_server(argv[2], atoi(argv[3]), atol(argv[4]));
	} else if (argc == 5 && strcmp(argv[1], "-C") == 0) {
		me = "close-race client";
		race_client(argv[2], argv[3], atoi(argv[4]));
	} else {
		fprintf(stderr, "usage: sovia-ready -s PORT N [DELAY_MS] | -c HOST PORT N | "
				"-S PORT N STEP_US | -C HOST PORT N\n");
		return 2;
	}
	return 0;
}
