/* sovia-bench: a socket benchmark with plain blocking sockets (nothing in it
 * knows about libsovia), so the same binary measures kernel TCP, rsockets'
 * preload and libsovia's preload.
 *
 *   sovia-bench server [-b ADDR] [-p PORT]
 *   sovia-bench client -H ADDR [-p PORT] -t bw|lat|conn|quit [-s SIZES]
 *                      [-w WARMUP_S] [-d SECS] [-n MAX_ITERS] [-N]
 *
 * The server serves one connection at a time, forever (until a client sends
 * "quit"); it prints "LISTENING port=P" on stdout once it listens. Each
 * connection starts with a 16-byte header naming the test and the size.
 *
 * bw   (streaming bandwidth; SIZES are the write sizes): warm-up rounds of
 *      writes, each acknowledged by the server, for at least WARMUP_S
 *      seconds; the last round's rate sizes the timed phase (about SECS
 *      seconds), whose length goes in a round header. The server reads it
 *      all (64 KiB reads, or SIZE if larger) and answers with a report (its
 *      CPU time for the timed phase). Time: the client's, from the timed
 *      round header to the report.
 * lat  (ping-pong; SIZES are message sizes): the client writes SIZE bytes,
 *      the server reads them all and writes them back. Warm-up for WARMUP_S
 *      seconds, then timed exchanges for SECS seconds or MAX_ITERS. The
 *      first byte of each message says warm-up / timed / last. Latency is
 *      half the round trip (one way, as perftest reports it).
 * conn (set-up rate): for SECS seconds, connect, send the header, read one
 *      byte the server writes after accepting, close. Each connection's
 *      time from connect() to that byte is its set-up as the application
 *      sees it: the first connection's, and the median and 99th
 *      percentile of the later ones, are reported.
 * quit: tell the server to exit.
 *
 * Each size prints one line on stdout:
 *   RESULT test=bw size=65536 status=ok bytes=... secs=... mibps=...
 *          cpu_client_s=... cpu_server_s=... cpu_s_per_gb=...
 *   RESULT test=lat size=64 status=ok iters=... med_us=... p99_us=...
 *          avg_us=... min_us=...
 *   RESULT test=conn size=0 status=ok conns=... secs=... rate=... first_us=...
 *          med_us=... p99_us=...
 * or status=failed err=... for a size that failed (the others still run;
 * the exit status is then 1). -N sets TCP_NODELAY on the client's and the
 * server's socket of that connection. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ticks.h"

#define MAGIC 0x53564231u /* "SVB1" */
enum test { T_BW = 1, T_LAT = 2, T_CONN = 3, T_QUIT = 4 };
enum { F_NODELAY = 1 };
enum { R_WARM = 1, R_TIMED = 2 };     /* bw round kinds */
enum { P_WARM = 'w', P_TIMED = 't', P_LAST = 'e' }; /* lat message kinds */

struct hdr {
	uint32_t magic, test, size, flags;
};
struct round {
	uint64_t len, kind;
};
struct report {
	uint64_t bytes, cpu_us, elapsed_us;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Round trips are timed in ticks (ticks.h): half of each of the two
 * clock_gettime calls around a round trip fell inside it, where that is
 * a system call; ib_send_lat reads the TSC as well. Ticks per second
 * between two (ticks, CLOCK_MONOTONIC) readings: */
static double tick_rate(uint64_t k0, double m0, uint64_t k1, double m1)
{
	return m1 > m0 && k1 > k0 ? (double)(k1 - k0) / (m1 - m0) : 0;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Write / read exactly n bytes; 0 on success, -1 on error or EOF. */
static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t r = write(fd, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = read(fd, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = ECONNRESET;
			return -1;
		}
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Read and discard exactly len bytes with reads of at most bufsz. */
static int drain(int fd, char *buf, size_t bufsz, uint64_t len)
{
	while (len > 0) {
		size_t want = len < bufsz ? (size_t)len : bufsz;
		ssize_t r = read(fd, buf, want);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = ECONNRESET;
			return -1;
		}
		len -= (uint64_t)r;
	}
	return 0;
}

static void *xalloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, n ? n : 1) != 0) {
		fprintf(stderr, "sovia-bench: out of memory (%zu bytes)\n", n);
		exit(2);
	}
	memset(p, 0x5a, n);
	return p;
}

static void set_nodelay(int fd)
{
	int one = 1;
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		perror("sovia-bench: TCP_NODELAY");
}

/* ---- server ---- */

static int serve_bw(int fd, const struct hdr *h)
{
	size_t bufsz = h->size > 65536 ? h->size : 65536;
	char *buf = xalloc(bufsz);
	int rc = -1;
	for (;;) {
		struct round rd;
		if (read_all(fd, &rd, sizeof rd) < 0)
			break;
		if (rd.kind == R_WARM) {
			char ack = 'a';
			if (drain(fd, buf, bufsz, rd.len) < 0 || write_all(fd, &ack, 1) < 0)
				break;
			continue;
		}
		double t0 = now_s(), c0 = cpu_s();
		if (drain(fd, buf, bufsz, rd.len) < 0)
			break;
		struct report rep = {rd.len, (uint64_t)((cpu_s() - c0) * 1e6),
				     (uint64_t)((now_s() - t0) * 1e6)};
		rc = write_all(fd, &rep, sizeof rep);
		break;
	}
	free(buf);
	return rc;
}

static int serve_lat(int fd, const struct hdr *h)
{
	size_t n = h->size ? h->size : 1;
	char *buf = xalloc(n);
	double c0 = 0, t0 = 0;
	int started = 0, rc = -1;
	for (;;) {
		if (read_all(fd, buf, n) < 0)
			break;
		if (!started && buf[0] != P_WARM) {
			started = 1;
			c0 = cpu_s();
			t0 = now_s();
		}
		if (write_all(fd, buf, n) < 0)
			break;
		if (buf[0] == P_LAST) {
			struct report rep = {0, (uint64_t)((cpu_s() - c0) * 1e6),
					     (uint64_t)((now_s() - t0) * 1e6)};
			rc = write_all(fd, &rep, sizeof rep);
			break;
		}
	}
	free(buf);
	return rc;
}

static int run_server(const char *addr, int port)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0) {
		perror("sovia-bench: socket");
		return 1;
	}
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		fprintf(stderr, "sovia-bench: bad address %s\n", addr);
		return 1;
	}
	if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 128) < 0) {
		perror("sovia-bench: bind/listen");
		return 1;
	}
	printf("LISTENING port=%d\n", port);
	fflush(stdout);
	for (;;) {
		int fd = accept(ls, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("sovia-bench: accept");
			return 1;
		}
		struct hdr h;
		int rc = 0;
		if (read_all(fd, &h, sizeof h) < 0 || h.magic != MAGIC) {
			fprintf(stderr, "sovia-bench: bad or missing header\n");
			close(fd);
			continue;
		}
		if (h.flags & F_NODELAY)
			set_nodelay(fd);
		switch (h.test) {
		case T_BW:
			rc = serve_bw(fd, &h);
			break;
		case T_LAT:
			rc = serve_lat(fd, &h);
			break;
		case T_CONN: {
			char b = 'c';
			rc = write_all(fd, &b, 1);
			break;
		}
		case T_QUIT:
			close(fd);
			close(ls);
			return 0;
		default:
			rc = -1;
		}
		if (rc < 0)
			fprintf(stderr, "sovia-bench: test %u size %u: %s\n", h.test, h.size,
				strerror(errno));
		close(fd);
	}
}

/* ---- client ---- */

struct opts {
	const char *host;
	int port;
	int test;
	double warmup, secs;
	long max_iters;
	int nodelay;
};

static int dial(const struct opts *o, int test, uint32_t size)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
	if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1) {
		errno = EINVAL;
		return -1;
	}
	/* The server may still be starting: retry a refused connect briefly. */
	for (int tries = 0;; tries++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		if (o->nodelay)
			set_nodelay(fd);
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			struct hdr h = {MAGIC, (uint32_t)test, size, o->nodelay ? F_NODELAY : 0};
			if (write_all(fd, &h, sizeof h) < 0) {
				int e = errno;
				close(fd);
				errno = e;
				return -1;
			}
			return fd;
		}
		int e = errno;
		close(fd);
		if (e != ECONNREFUSED || tries >= 50) {
			errno = e;
			return -1;
		}
		usleep(100000);
	}
}

static int client_bw(const struct opts *o, uint32_t size)
{
	int fd = dial(o, T_BW, size);
	if (fd < 0)
		return -1;
	char *buf = xalloc(size);
	uint64_t round_len = (uint64_t)size * 4 > 262144 ? (uint64_t)size * 4 : 262144;
	round_len -= round_len % size;
	double t_start = now_s(), rate = 0, t_mark = 0;
	uint64_t warm_bytes = 0, bytes_mark = 0;
	int rounds = 0, rc = -1;
	/* Warm-up rounds until WARMUP_S passed (at least two). The rate over its
	 * second half (the steady state: a connection that changes transport
	 * does so early) sizes the timed phase. */
	while (rounds < 2 || now_s() - t_start < o->warmup) {
		if (t_mark == 0 && now_s() - t_start >= o->warmup / 2) {
			t_mark = now_s();
			bytes_mark = warm_bytes;
		}
		struct round rd = {round_len, R_WARM};
		double t0 = now_s();
		if (write_all(fd, &rd, sizeof rd) < 0)
			goto out;
		for (uint64_t done = 0; done < round_len; done += size)
			if (write_all(fd, buf, size) < 0)
				goto out;
		char ack;
		if (read_all(fd, &ack, 1) < 0)
			goto out;
		double t1 = now_s(), dt = t1 - t0;
		rate = (double)round_len / (dt > 1e-6 ? dt : 1e-6);
		rounds++;
		warm_bytes += round_len;
		if (t_mark > 0 && t1 - t_mark > 1e-3)
			rate = (double)(warm_bytes - bytes_mark) / (t1 - t_mark);
	}
	uint64_t len = (uint64_t)(rate * o->secs);
	len -= len % size;
	if (len < (uint64_t)size * 16)
		len = (uint64_t)size * 16;
	struct round rd = {len, R_TIMED};
	double t0 = now_s(), c0 = cpu_s();
	if (write_all(fd, &rd, sizeof rd) < 0)
		goto out;
	for (uint64_t done = 0; done < len; done += size)
		if (write_all(fd, buf, size) < 0)
			goto out;
	struct report rep;
	if (read_all(fd, &rep, sizeof rep) < 0)
		goto out;
	double dt = now_s() - t0, cc = cpu_s() - c0, cs = (double)rep.cpu_us * 1e-6;
	printf("RESULT test=bw size=%u status=ok bytes=%llu secs=%.6f mibps=%.3f "
	       "cpu_client_s=%.4f cpu_server_s=%.4f cpu_s_per_gb=%.4f warmup_rounds=%d\n",
	       size, (unsigned long long)len, dt, (double)len / dt / 1048576.0, cc, cs,
	       (cc + cs) / ((double)len / 1e9), rounds);
	rc = 0;
out:
	if (rc < 0) {
		int e = errno;
		close(fd);
		errno = e;
	} else {
		close(fd);
	}
	free(buf);
	return rc;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int client_lat(const struct opts *o, uint32_t size)
{
	int fd = dial(o, T_LAT, size);
	if (fd < 0)
		return -1;
	size_t n = size ? size : 1;
	char *buf = xalloc(n);
	double *rtt = malloc(sizeof *rtt * (size_t)o->max_iters);
	long iters = 0, warm = 0;
	int rc = -1;
	if (!rtt)
		goto out;
	double t_start = now_s();
	while (warm < 10 || now_s() - t_start < o->warmup) {
		buf[0] = P_WARM;
		if (write_all(fd, buf, n) < 0 || read_all(fd, buf, n) < 0)
			goto out;
		warm++;
	}
	double m0 = now_s(), deadline = m0 + o->secs;
	uint64_t k0 = ticks();
	int late = 0;
	for (;;) {
		/* The clock for the deadline is read outside the timed part. */
		if (iters % 16 == 0 && now_s() >= deadline)
			late = 1;
		int last = iters + 1 >= o->max_iters || (iters >= 10 && late);
		buf[0] = last ? P_LAST : P_TIMED;
		uint64_t t0 = ticks();
		if (write_all(fd, buf, n) < 0 || read_all(fd, buf, n) < 0)
			goto out;
		rtt[iters++] = (double)(ticks() - t0);
		if (last)
			break;
	}
	double rate = tick_rate(k0, m0, ticks(), now_s());
	if (rate <= 0) {
		fprintf(stderr, "sovia-bench: the tick counter did not advance\n");
		errno = EIO;
		goto out;
	}
	for (long i = 0; i < iters; i++)
		rtt[i] /= rate;
	struct report rep;
	if (read_all(fd, &rep, sizeof rep) < 0)
		goto out;
	double sum = 0;
	for (long i = 0; i < iters; i++)
		sum += rtt[i];
	qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
	long p99 = (long)((double)iters * 0.99);
	if (p99 >= iters)
		p99 = iters - 1;
	/* One way: half the round trip, in microseconds. */
	printf("RESULT test=lat size=%u status=ok iters=%ld med_us=%.2f p99_us=%.2f avg_us=%.2f "
	       "min_us=%.2f warmup_iters=%ld\n",
	       size, iters, rtt[iters / 2] * 0.5e6, rtt[p99] * 0.5e6, sum / (double)iters * 0.5e6,
	       rtt[0] * 0.5e6, warm);
	rc = 0;
out:
	if (rc < 0) {
		int e = errno;
		close(fd);
		errno = e;
	} else {
		close(fd);
	}
	free(rtt);
	free(buf);
	return rc;
}

static int client_conn(const struct opts *o)
{
	long conns = 0, cap = 0;
	double t0 = now_s(), dt, *took = NULL; /* each connection: dial to first byte */
	do {
		double c0 = now_s();
		int fd = dial(o, T_CONN, 0);
		if (fd < 0)
			goto fail;
		char b;
		if (read_all(fd, &b, 1) < 0) {
			int e = errno;
			close(fd);
			errno = e;
			goto fail;
		}
		if (conns == cap) {
			cap = cap ? 2 * cap : 1024;
			double *n = realloc(took, (size_t)cap * sizeof(*took));
			if (!n) {
				close(fd);
				goto fail;
			}
			took = n;
		}
		took[conns++] = now_s() - c0;
		close(fd);
		dt = now_s() - t0;
	} while (dt < o->secs && (o->max_iters <= 0 || conns < o->max_iters));
	/* The first connection (the process's first: rdma_cm starts), then
	 * the later ones' median and 99th percentile. */
	double first = took[0];
	long n = conns - 1, p99 = (long)((double)n * 0.99);
	if (n > 0) {
		qsort(took + 1, (size_t)n, sizeof(*took), cmp_double);
		if (p99 >= n)
			p99 = n - 1;
	}
	printf("RESULT test=conn size=0 status=ok conns=%ld secs=%.6f rate=%.2f first_us=%.0f "
	       "med_us=%.0f p99_us=%.0f\n",
	       conns, dt, (double)conns / dt, first * 1e6, n > 0 ? took[1 + n / 2] * 1e6 : 0.0,
	       n > 0 ? took[1 + p99] * 1e6 : 0.0);
	free(took);
	return 0;
fail:
	free(took);
	return -1;
}

static const char *test_name(int t)
{
	return t == T_BW ? "bw" : t == T_LAT ? "lat" : t == T_CONN ? "conn" : "quit";
}

static int run_client(struct opts *o, const char *sizes)
{
	int failed = 0;
	if (o->test == T_QUIT) {
		int fd = dial(o, T_QUIT, 0);
		if (fd < 0) {
			perror("sovia-bench: quit");
			return 1;
		}
		close(fd);
		return 0;
	}
	if (o->test == T_CONN) {
		if (client_conn(o) < 0) {
			printf("RESULT test=conn size=0 status=failed err=%s\n", strerror(errno));
			failed = 1;
		}
		fflush(stdout);
		return failed;
	}
	char *list = strdup(sizes), *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long v = strtoul(tok, &end, 10);
		if (*end == 'k' || *end == 'K')
			v *= 1024, end++;
		else if (*end == 'm' || *end == 'M')
			v *= 1048576, end++;
		if (*end || v == 0 || v > (1ul << 30)) {
			fprintf(stderr, "sovia-bench: bad size '%s'\n", tok);
			failed = 1;
			continue;
		}
		int rc = o->test == T_BW ? client_bw(o, (uint32_t)v) : client_lat(o, (uint32_t)v);
		if (rc < 0) {
			printf("RESULT test=%s size=%lu status=failed err=%s\n", test_name(o->test), v,
			       strerror(errno));
			failed = 1;
		}
		fflush(stdout);
	}
	free(list);
	return failed;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: sovia-bench server [-b ADDR] [-p PORT]\n"
		"       sovia-bench client -H ADDR [-p PORT] -t bw|lat|conn|quit [-s SIZES]\n"
		"                          [-w WARMUP_S] [-d SECS] [-n MAX_ITERS] [-N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	int server = !strcmp(argv[1], "server");
	if (!server && strcmp(argv[1], "client"))
		usage();
	struct opts o = {.host = NULL, .port = 5201, .test = 0, .warmup = 2, .secs = 3,
			 .max_iters = 100000, .nodelay = 0};
	const char *bind_addr = "0.0.0.0", *sizes = "65536";
	int c;
	optind = 2;
	while ((c = getopt(argc, argv, "b:p:H:t:s:w:d:n:N")) != -1) {
		switch (c) {
		case 'b':
			bind_addr = optarg;
			break;
		case 'p':
			o.port = atoi(optarg);
			break;
		case 'H':
			o.host = optarg;
			break;
		case 't':
			o.test = !strcmp(optarg, "bw")     ? T_BW
				 : !strcmp(optarg, "lat")  ? T_LAT
				 : !strcmp(optarg, "conn") ? T_CONN
				 : !strcmp(optarg, "quit") ? T_QUIT
							   : 0;
			break;
		case 's':
			sizes = optarg;
			break;
		case 'w':
			o.warmup = atof(optarg);
			break;
		case 'd':
			o.secs = atof(optarg);
			break;
		case 'n':
			o.max_iters = atol(optarg);
			break;
		case 'N':
			o.nodelay = 1;
			break;
		default:
			usage();
		}
	}
	if (o.port <= 0 || o.port > 65535)
		usage();
	if (server)
		return run_server(bind_addr, o.port);
	if (!o.host || !o.test || o.max_iters < 1 || o.secs <= 0)
		usage();
	return run_client(&o, sizes);
}
