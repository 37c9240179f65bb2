/* Where a ping-pong's round trip goes: a plain socket ping-pong that times
 * each write() and each read() on its own, so the cost of sending (on
 * soft-RoCE, the doorbell system call runs the whole send path) shows apart
 * from the wait for the reply.
 *
 *   sovia-pingsplit server [-b ADDR] [-p PORT] [-s SIZE] [-n KEEP]
 *   sovia-pingsplit client -H ADDR [-p PORT] [-s SIZE] [-w WARMUP_S] [-n ITERS]
 *
 * The client warms up for WARMUP_S seconds (default 3, long enough for
 * libsovia's upgrade), then times ITERS round trips (default 50000) and
 * closes; the server answers until EOF and reports its last KEEP (default
 * 50000) iterations. Each prints medians, in microseconds:
 *
 *   RESULT role=client size=64 iters=... write_us=... wait_us=... rtt_us=... oneway_us=...
 *   RESULT role=server size=64 iters=... wait_us=... write_us=... loop_us=...
 *
 * Timing uses the TSC on x86-64 (a clock_gettime costs a system call where
 * the kernel's clocksource is not the TSC, as in the test bed's guest, and
 * would be part of what is measured), converted with the rate measured
 * against CLOCK_MONOTONIC over the timed loop; elsewhere CLOCK_MONOTONIC. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ticks.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double median_us(uint64_t *v, size_t n, double ticks_per_us)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return (double)v[n / 2] / ticks_per_us;
}

/* All of n bytes; 0 at EOF before any byte, -1 on error. */
static int io_all(int fd, char *buf, size_t n, int reading)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = reading ? read(fd, buf + done, n - done) : write(fd, buf + done, n - done);
		if (r == 0 && reading && done == 0)
			return 0;
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			fprintf(stderr, "sovia-pingsplit: %s: %s\n", reading ? "read" : "write",
				r == 0 ? "unexpected EOF" : strerror(errno));
			return -1;
		}
		done += (size_t)r;
	}
	return 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: sovia-pingsplit server [-b ADDR] [-p PORT] [-s SIZE] [-n KEEP]\n"
			"       sovia-pingsplit client -H ADDR [-p PORT] [-s SIZE] [-w WARMUP_S] "
			"[-n ITERS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")))
		usage();
	int server = !strcmp(argv[1], "server");
	const char *addr = server ? "0.0.0.0" : NULL;
	int port = 5300, c;
	long size = 64, iters = 50000, warmup = 3;
	optind = 2;
	while ((c = getopt(argc, argv, "b:H:p:s:n:w:")) != -1) {
		switch (c) {
		case 'b':
		case 'H':
			addr = optarg;
			break;
		case 'p':
			port = atoi(optarg);
			break;
		case 's':
			size = atol(optarg);
			break;
		case 'n':
			iters = atol(optarg);
			break;
		case 'w':
			warmup = atol(optarg);
			break;
		default:
			usage();
		}
	}
	if (!addr || size < 1 || size > (1 << 20) || iters < 1 || warmup < 0)
		usage();
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		fprintf(stderr, "sovia-pingsplit: not an IPv4 address: %s\n", addr);
		return 2;
	}
	int fd;
	if (server) {
		int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 1) < 0) {
			perror("sovia-pingsplit: listen");
			return 1;
		}
		printf("LISTENING port=%d\n", port);
		fflush(stdout);
		fd = accept(l, NULL, NULL);
		close(l);
	} else {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(fd);
			fd = -1;
		}
	}
	if (fd < 0) {
		perror(server ? "sovia-pingsplit: accept" : "sovia-pingsplit: connect");
		return 1;
	}
	char *buf = calloc(1, (size_t)size);
	uint64_t *a = malloc(sizeof(*a) * (size_t)iters), *b = malloc(sizeof(*b) * (size_t)iters);
	uint64_t *t = malloc(sizeof(*t) * (size_t)iters);
	if (!buf || !a || !b || !t) {
		fprintf(stderr, "sovia-pingsplit: out of memory\n");
		return 1;
	}
	size_t n = (size_t)size;
	if (!server) {
		uint64_t until = mono_ns() + (uint64_t)warmup * 1000000000u;
		while (mono_ns() < until)
			if (io_all(fd, buf, n, 0) < 0 || io_all(fd, buf, n, 1) <= 0)
				return 1;
	}
	/* The server keeps its last `iters` iterations in a ring: those are the
	 * client's timed ones. */
	uint64_t m0 = mono_ns(), c0 = ticks();
	long count = 0;
	for (;;) {
		/* The server reads first and ends at the client's EOF; the
		 * client writes first and ends after ITERS. */
		if (!server && count == iters)
			break;
		uint64_t t0 = ticks();
		int r = io_all(fd, buf, n, server);
		if (r < 0)
			return 1;
		if (r == 0)
			break;
		uint64_t t1 = ticks();
		if (io_all(fd, buf, n, !server) <= 0)
			return 1;
		uint64_t t2 = ticks();
		size_t k = (size_t)(count % iters);
		a[k] = t1 - t0;
		b[k] = t2 - t1;
		t[k] = t2 - t0;
		count++;
	}
	double per_us = (double)(ticks() - c0) / ((double)(mono_ns() - m0) / 1000.0);
	size_t kept = count < iters ? (size_t)count : (size_t)iters;
	if (!kept) {
		fprintf(stderr, "sovia-pingsplit: no round trips\n");
		return 1;
	}
	double ma = median_us(a, kept, per_us), mb = median_us(b, kept, per_us);
	double mt = median_us(t, kept, per_us);
	if (server)
		printf("RESULT role=server size=%ld iters=%zu wait_us=%.2f write_us=%.2f loop_us=%.2f\n",
		       size, kept, ma, mb, mt);
	else
		printf("RESULT role=client size=%ld iters=%zu write_us=%.2f wait_us=%.2f rtt_us=%.2f "
		       "oneway_us=%.2f\n",
		       size, kept, ma, mb, mt, mt / 2);
	close(fd);
	return 0;
}
