/* The echo examples' stream, its check and the poll()-driven client. See
 * echo_common.h. */
#include "echo_common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

_Noreturn void echo_die(const char *who, const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", who, what, strerror(errno));
	exit(2);
}

uint64_t echo_total(const struct echo_stream *s)
{
	return ECHO_HDR + s->len;
}

/* Payload word w (8 bytes) of seed: a splitmix64 step, so neighbouring
 * words and seeds share nothing visible. */
static uint64_t word(uint32_t seed, uint64_t w)
{
	uint64_t x = (w + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void header(const struct echo_stream *s, uint8_t *h)
{
	memcpy(h, "SVE1", 4);
	put_le(h + 4, s->seed, 4);
	put_le(h + 8, s->len, 8);
}

void echo_fill(const struct echo_stream *s, uint64_t off, uint8_t *buf, size_t n)
{
	uint8_t h[ECHO_HDR];
	header(s, h);
	size_t i = 0;
	for (; i < n && off + i < ECHO_HDR; i++)
		buf[i] = h[off + i];
	while (i < n) {
		uint64_t p = off + i - ECHO_HDR; /* payload offset */
		uint64_t w = word(s->seed, p / 8);
		for (unsigned b = (unsigned)(p % 8); b < 8 && i < n; b++, i++)
			buf[i] = (uint8_t)(w >> (8 * b));
	}
}

size_t echo_diff(const struct echo_stream *s, uint64_t off, const uint8_t *buf, size_t n)
{
	uint8_t want[4096];
	for (size_t done = 0; done < n;) {
		size_t k = n - done < sizeof(want) ? n - done : sizeof(want);
		echo_fill(s, off + done, want, k);
		if (memcmp(want, buf + done, k) != 0) {
			for (size_t i = 0; i < k; i++)
				if (want[i] != buf[done + i])
					return done + i;
		}
		done += k;
	}
	return n;
}

void echo_check_init(struct echo_check *c)
{
	memset(c, 0, sizeof(*c));
}

int echo_check_feed(struct echo_check *c, const uint8_t *buf, size_t n, const char *who)
{
	if (c->bad)
		return 0;
	while (n > 0 && c->got < ECHO_HDR) {
		c->hdr[c->got++] = *buf++;
		n--;
		if (c->got == ECHO_HDR) {
			if (memcmp(c->hdr, "SVE1", 4) != 0) {
				fprintf(stderr, "%s: the stream does not start with a header\n", who);
				c->bad = 1;
				return -1;
			}
			c->s.seed = (uint32_t)get_le(c->hdr + 4, 4);
			c->s.len = get_le(c->hdr + 8, 8);
		}
	}
	if (n == 0)
		return 0;
	if (c->got + n > echo_total(&c->s)) {
		fprintf(stderr, "%s: seed %u: %zu bytes more than the %llu announced\n", who,
		        c->s.seed, (size_t)(c->got + n - echo_total(&c->s)),
		        (unsigned long long)c->s.len);
		c->bad = 1;
		return -1;
	}
	size_t d = echo_diff(&c->s, c->got, buf, n);
	if (d < n) {
		fprintf(stderr, "%s: seed %u: wrong byte at stream offset %llu\n", who, c->s.seed,
		        (unsigned long long)(c->got + d));
		c->bad = 1;
		return -1;
	}
	c->got += n;
	return 0;
}

int echo_check_end(const struct echo_check *c, const char *who)
{
	if (c->bad)
		return -1;
	if (c->got < ECHO_HDR || c->got != echo_total(&c->s)) {
		fprintf(stderr, "%s: seed %u: the stream ended after %llu of %llu bytes\n", who,
		        c->s.seed, (unsigned long long)c->got,
		        (unsigned long long)(c->got < ECHO_HDR ? 0 : echo_total(&c->s)));
		return -1;
	}
	return 0;
}

int echo_listen(const char *who, int port, int backlog)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0)
		echo_die(who, "socket");
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0)
		echo_die(who, "bind");
	if (listen(ls, backlog) < 0)
		echo_die(who, "listen");
	return ls;
}

int echo_poll_client(const char *who, const char *host, const char *port,
                     const struct echo_stream *s)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	int r = getaddrinfo(host, port, &hints, &ai);
	if (r) {
		fprintf(stderr, "%s: %s: %s\n", who, host, gai_strerror(r));
		return -1;
	}
	int fd = socket(ai->ai_family, ai->ai_socktype, 0);
	if (fd < 0)
		echo_die(who, "socket");
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)
		echo_die(who, "connect");
	freeaddrinfo(ai);
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		echo_die(who, "fcntl(O_NONBLOCK)");

	uint64_t total = echo_total(s), sent = 0, got = 0;
	static uint8_t out[65536], in[65536];
	size_t out_len = 0, out_off = 0; /* out[out_off, out_len) not yet sent */
	int wr_done = 0;
	while (got < total || !wr_done) {
		/* Paused after the first chunk until the go file exists. */
		int paused = s->go && sent > 0 && out_off == out_len && access(s->go, F_OK) < 0;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (!wr_done && !paused)
			p.events |= POLLOUT;
		if (poll(&p, 1, paused ? 50 : -1) < 0) {
			if (errno == EINTR)
				continue;
			echo_die(who, "poll");
		}
		if (p.revents & POLLNVAL) {
			fprintf(stderr, "%s: poll: POLLNVAL\n", who);
			return -1;
		}
		if (!wr_done && !paused && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
			for (;;) {
				if (out_off == out_len) {
					if (sent == total) {
						if (shutdown(fd, SHUT_WR) < 0)
							echo_die(who, "shutdown");
						wr_done = 1;
						break;
					}
					out_len = total - sent < sizeof(out) ? (size_t)(total - sent)
					                                      : sizeof(out);
					echo_fill(s, sent, out, out_len);
					out_off = 0;
				}
				ssize_t w = send(fd, out + out_off, out_len - out_off, MSG_NOSIGNAL);
				if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
					break;
				if (w < 0)
					echo_die(who, "send");
				out_off += (size_t)w;
				sent += (uint64_t)w;
				if (s->go && out_off == out_len && sent == out_len)
					break; /* the first chunk: see whether to pause */
			}
		}
		if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
			for (;;) {
				ssize_t n = recv(fd, in, sizeof(in), 0);
				if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
					break;
				if (n < 0)
					echo_die(who, "recv");
				if (n == 0) {
					if (got < total) {
						fprintf(stderr, "%s: seed %u: EOF after %llu of %llu echoed bytes\n",
						        who, s->seed, (unsigned long long)got,
						        (unsigned long long)total);
						return -1;
					}
					break;
				}
				if (got + (uint64_t)n > total) {
					fprintf(stderr, "%s: seed %u: more echoed than sent\n", who, s->seed);
					return -1;
				}
				size_t d = echo_diff(s, got, in, (size_t)n);
				if (d < (size_t)n) {
					fprintf(stderr, "%s: seed %u: wrong echo at offset %llu\n", who,
					        s->seed, (unsigned long long)(got + d));
					return -1;
				}
				got += (uint64_t)n;
			}
		}
	}
	/* Everything came back: the peer's EOF must follow, with nothing more. */
	int fl2 = fcntl(fd, F_GETFL);
	if (fl2 < 0 || fcntl(fd, F_SETFL, fl2 & ~O_NONBLOCK) < 0)
		echo_die(who, "fcntl");
	ssize_t n = recv(fd, in, 1, 0);
	if (n != 0) {
		fprintf(stderr, "%s: seed %u: %s after the whole echo\n", who, s->seed,
		        n > 0 ? "more bytes" : strerror(errno));
		return -1;
	}
	close(fd);
	return 0;
}

int echo_reap(const char *who, int conns, const char *what)
{
	int bad = 0, st;
	for (int i = 0; i < conns; i++) {
		if (wait(&st) < 0)
			echo_die(who, "wait");
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
	}
	if (bad) {
		fprintf(stderr, "%s: %s failed\n", who, what);
		return 1;
	}
	printf("OK %d connections\n", conns);
	return 0;
}

static int fork_server(const char *who, int port, int conns, int hold, int (*child)(int fd),
		       const char *what)
{
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (hold)
		sigprocmask(SIG_BLOCK, &usr1, NULL);
	int ls = echo_listen(who, port, 64);
	for (int i = 0; i < conns; i++) {
		int c = accept(ls, NULL, NULL);
		if (c < 0 && errno == EINTR) {
			i--;
			continue;
		}
		if (c < 0)
			echo_die(who, "accept");
		if (hold) {
			int sig;
			if (sigwait(&usr1, &sig) != 0)
				echo_die(who, "sigwait");
		}
		pid_t pid = fork();
		if (pid < 0)
			echo_die(who, "fork");
		if (pid == 0) {
			sigprocmask(SIG_UNBLOCK, &usr1, NULL);
			close(ls);
			exit(child(c));
		}
		if (close(c) < 0)
			echo_die(who, "close");
	}
	close(ls);
	return echo_reap(who, conns, what);
}

/* Prefork: WORKERS children inherit the listening socket and accept on
 * it, one connection at a time, CONNS in all (a token each from a pipe the
 * parent filled), while the parent keeps the socket and only waits, as
 * nginx's master does. */
static int prefork_server(const char *who, int workers, int port, int conns,
			  int (*child)(int fd))
{
	int ls = echo_listen(who, port, 64);
	int tokens[2];
	if (pipe(tokens) < 0)
		echo_die(who, "pipe");
	for (int i = 0; i < conns; i++)
		if (write(tokens[1], "t", 1) != 1)
			echo_die(who, "write token");
	if (close(tokens[1]) < 0)
		echo_die(who, "close");
	for (int w = 0; w < workers; w++) {
		pid_t pid = fork();
		if (pid < 0)
			echo_die(who, "fork");
		if (pid > 0)
			continue;
		int bad = 0;
		char t;
		while (read(tokens[0], &t, 1) == 1) {
			int c;
			while ((c = accept(ls, NULL, NULL)) < 0 && errno == EINTR)
				;
			if (c < 0)
				echo_die(who, "accept");
			bad |= child(c);
		}
		exit(bad);
	}
	close(tokens[0]);
	int bad = 0, st;
	for (int w = 0; w < workers; w++) {
		if (wait(&st) < 0)
			echo_die(who, "wait");
		bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	close(ls);
	if (bad) {
		fprintf(stderr, "%s: a worker failed\n", who);
		return 1;
	}
	printf("OK %d connections\n", conns);
	return 0;
}

int echo_fork_main(const char *who, int argc, char **argv, int (*child)(int fd),
		   const char *what)
{
	if (argc == 5 && strcmp(argv[1], "-p") == 0)
		return prefork_server(who, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), child);
	if (argc >= 4 && strcmp(argv[1], "-s") == 0) {
		int hold = strcmp(argv[2], "-S") == 0;
		if (argc == 4 + hold)
			return fork_server(who, atoi(argv[2 + hold]), atoi(argv[3 + hold]), hold,
					   child, what);
	}
	if ((argc == 6 || argc == 7) && strcmp(argv[1], "-c") == 0) {
		struct echo_stream s = {.seed = (uint32_t)strtoul(argv[5], NULL, 0),
					.len = strtoull(argv[4], NULL, 0),
					.go = argc == 7 ? argv[6] : NULL};
		if (echo_poll_client(who, argv[2], argv[3], &s) < 0)
			return 1;
		printf("OK %llu bytes echoed\n", (unsigned long long)echo_total(&s));
		return 0;
	}
	fprintf(stderr, "usage: %s -s [-S] PORT CONNS | -p WORKERS PORT CONNS | -c HOST PORT BYTES SEED [GO]\n",
		who);
	return 2;
}
