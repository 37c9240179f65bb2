/* An edge-triggered epoll echo server and its non-blocking clients, as
 * event-driven programs write them. Nothing here knows about libsovia.
 *
 *   sovia-echo-epoll -s PORT CONNS
 *   sovia-echo-epoll -c HOST PORT CLIENTS BYTES
 *
 * Server: listens on PORT (all IPv4 addresses), non-blocking; accepts with
 * accept4(SOCK_NONBLOCK) and watches every connection with EPOLLIN |
 * EPOLLOUT | EPOLLRDHUP | EPOLLET, reading and writing until EAGAIN. It
 * echoes every byte and checks each stream (echo_common.h); at a client's
 * EOF it sends the rest of the echo, then closes. After CONNS connections
 * are served it prints "OK CONNS connections, N bytes" and exits 0; any
 * wrong byte makes it exit 1.
 *
 * Client: opens CLIENTS connections at once with non-blocking connect()s
 * (EINPROGRESS, then writability and SO_ERROR), all in one edge-triggered
 * epoll loop; each sends a stream of BYTES payload bytes with its own seed,
 * shuts down writing, and checks the echo until EOF. Prints "OK ..." and
 * exits 0 if every echo was exact. */
#include "echo_common.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define WHO "sovia-echo-epoll"
#define BUF (256 * 1024)

/* One connection, on either side. */
struct conn {
	int fd;
	uint8_t *buf;     /* server: bytes read, not yet echoed; client: next to send */
	size_t off, len;  /* buf[off, len) is pending */
	int rd_eof;       /* server: the client's EOF came */
	int wr_shut;      /* our side shut down writing */
	int connected;    /* client: the non-blocking connect finished */
	struct echo_check check;   /* server */
	struct echo_stream stream; /* client */
	uint64_t sent, got;        /* client */
	int done;
};

static void ep_add(int ep, struct conn *c, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = c};
	if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0)
		echo_die(WHO, "epoll_ctl");
}

static int would_block(void)
{
	return errno == EAGAIN || errno == EWOULDBLOCK;
}

/* Server: move bytes until neither direction can. Returns 1 when the
 * connection is finished (echoed and closed), -1 on a wrong byte, else 0. */
static int serve(struct conn *c)
{
	for (;;) {
		int progress = 0;
		while (c->off < c->len) {
			ssize_t w = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && would_block())
				break;
			if (w < 0)
				echo_die(WHO, "send");
			c->off += (size_t)w;
			progress = 1;
		}
		if (c->off > 0) { /* keep the pending bytes at the front */
			memmove(c->buf, c->buf + c->off, c->len - c->off);
			c->len -= c->off;
			c->off = 0;
		}
		while (!c->rd_eof && c->len < BUF) {
			ssize_t n = recv(c->fd, c->buf + c->len, BUF - c->len, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && would_block())
				break;
			if (n < 0)
				echo_die(WHO, "recv");
			if (n == 0) {
				c->rd_eof = 1;
				if (echo_check_end(&c->check, WHO " server") < 0)
					return -1;
				break;
			}
			if (echo_check_feed(&c->check, c->buf + c->len, (size_t)n, WHO " server") < 0)
				return -1;
			c->len += (size_t)n;
			progress = 1;
		}
		if (c->rd_eof && c->off == c->len) {
			close(c->fd); /* also leaves the epoll set */
			return 1;
		}
		if (!progress)
			return 0;
	}
}

static int server(int port, int conns)
{
	int ls = echo_listen(WHO, port, 64);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		echo_die(WHO, "epoll_create1");
	struct conn lc = {.fd = ls};
	ep_add(ep, &lc, EPOLLIN);
	int accepted = 0, finished = 0, bad = 0;
	uint64_t bytes = 0;
	struct epoll_event evs[16];
	while (finished < conns) {
		int n = epoll_wait(ep, evs, 16, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			echo_die(WHO, "epoll_wait");
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c == &lc) {
				while (accepted < conns) {
					int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
					if (fd < 0 && (would_block() || errno == EINTR))
						break;
					if (fd < 0)
						echo_die(WHO, "accept4");
					struct conn *nc = calloc(1, sizeof(*nc));
					if (!nc || !(nc->buf = malloc(BUF)))
						echo_die(WHO, "malloc");
					nc->fd = fd;
					echo_check_init(&nc->check);
					accepted++;
					ep_add(ep, nc, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
					/* Edge-triggered: bytes that came before the
					 * registration may give no edge; look now. */
					int r = serve(nc);
					if (r != 0) {
						bad |= r < 0;
						finished++;
						bytes += nc->check.got;
						if (r < 0)
							close(nc->fd);
						nc->done = 1;
					}
				}
				if (accepted == conns)
					epoll_ctl(ep, EPOLL_CTL_DEL, ls, NULL);
				continue;
			}
			if (c->done)
				continue;
			int r = serve(c);
			if (r != 0) {
				bad |= r < 0;
				finished++;
				bytes += c->check.got;
				if (r < 0)
					close(c->fd);
				c->done = 1; /* kept: later events of this batch may name it */
			}
		}
	}
	if (bad)
		return 1;
	printf("OK %d connections, %llu bytes echoed\n", conns, (unsigned long long)bytes);
	return 0;
}

/* Client, on events ev: returns 1 when this connection is finished and
 * right, -1 on an error, else 0. */
static int client_step(struct conn *c, uint32_t ev)
{
	static uint8_t in[65536];
	uint64_t total = echo_total(&c->stream);
	if (!c->connected) {
		/* A connect in progress reports its end as writability (or an
		 * error); SO_ERROR then says how it went. */
		if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return 0;
		int err = 0;
		socklen_t l = sizeof(err);
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
			echo_die(WHO, "getsockopt(SO_ERROR)");
		if (err) {
			fprintf(stderr, "%s: connect: %s\n", WHO, strerror(err));
			return -1;
		}
		c->connected = 1;
	}
	for (;;) {
		int progress = 0;
		while (!c->wr_shut) {
			if (c->off == c->len) {
				if (c->sent == total) {
					if (shutdown(c->fd, SHUT_WR) < 0)
						echo_die(WHO, "shutdown");
					c->wr_shut = 1;
					break;
				}
				c->len = total - c->sent < BUF ? (size_t)(total - c->sent) : BUF;
				echo_fill(&c->stream, c->sent, c->buf, c->len);
				c->off = 0;
			}
			ssize_t w = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && would_block())
				break;
			if (w < 0) {
				/* Before the first byte went out, a refused connect
				 * shows here too. */
				fprintf(stderr, "%s: send: %s\n", WHO, strerror(errno));
				return -1;
			}
			c->off += (size_t)w;
			c->sent += (uint64_t)w;
			progress = 1;
		}
		for (;;) {
			ssize_t n = recv(c->fd, in, sizeof(in), 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && would_block())
				break;
			if (n < 0) {
				fprintf(stderr, "%s: recv: %s\n", WHO, strerror(errno));
				return -1;
			}
			if (n == 0) {
				if (c->got != total || !c->wr_shut) {
					fprintf(stderr, "%s: seed %u: EOF after %llu of %llu echoed bytes\n",
					        WHO, c->stream.seed, (unsigned long long)c->got,
					        (unsigned long long)total);
					return -1;
				}
				close(c->fd);
				return 1;
			}
			if (c->got + (uint64_t)n > total) {
				fprintf(stderr, "%s: seed %u: more echoed than sent\n", WHO, c->stream.seed);
				return -1;
			}
			size_t d = echo_diff(&c->stream, c->got, in, (size_t)n);
			if (d < (size_t)n) {
				fprintf(stderr, "%s: seed %u: wrong echo at offset %llu\n", WHO,
				        c->stream.seed, (unsigned long long)(c->got + d));
				return -1;
			}
			c->got += (uint64_t)n;
			progress = 1;
		}
		if (!progress)
			return 0;
	}
}

static int client(const char *host, const char *port, int clients, uint64_t bytes)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	int r = getaddrinfo(host, port, &hints, &ai);
	if (r) {
		fprintf(stderr, "%s: %s: %s\n", WHO, host, gai_strerror(r));
		return 2;
	}
	int ep = epoll_create1(0);
	if (ep < 0)
		echo_die(WHO, "epoll_create1");
	struct conn *cs = calloc((size_t)clients, sizeof(*cs));
	if (!cs)
		echo_die(WHO, "calloc");
	for (int i = 0; i < clients; i++) {
		struct conn *c = &cs[i];
		c->stream = (struct echo_stream){.seed = 0x5eed0000u + (uint32_t)i, .len = bytes};
		if (!(c->buf = malloc(BUF)))
			echo_die(WHO, "malloc");
		c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (c->fd < 0)
			echo_die(WHO, "socket");
		if (connect(c->fd, ai->ai_addr, ai->ai_addrlen) == 0)
			c->connected = 1;
		else if (errno != EINPROGRESS)
			echo_die(WHO, "connect");
		ep_add(ep, c, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
	}
	freeaddrinfo(ai);
	int left = clients;
	struct epoll_event evs[16];
	while (left > 0) {
		int n = epoll_wait(ep, evs, 16, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			echo_die(WHO, "epoll_wait");
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c->done)
				continue;
			int s = client_step(c, evs[i].events);
			if (s < 0)
				return 1;
			if (s > 0) {
				c->done = 1;
				left--;
			}
		}
	}
	printf("OK %d clients, %llu bytes each way each\n", clients,
	       (unsigned long long)(bytes + ECHO_HDR));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "-s") == 0)
		return server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 6 && strcmp(argv[1], "-c") == 0)
		return client(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 0));
	fprintf(stderr, "usage: %s -s PORT CONNS | -c HOST PORT CLIENTS BYTES\n", WHO);
	return 2;
}
