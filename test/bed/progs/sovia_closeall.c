/* A daemon that closes every descriptor it does not know, as many do at
 * start-up or before a re-exec: a close() loop, close_range() or
 * closefrom(). libsovia's own descriptors (its eventfds, completion
 * channels, the verbs context's files) must survive it, and the
 * application's must really go, table entries and all.
 *
 *   sovia-closeall -s PORT             echo server for two connections
 *   sovia-closeall -c IP PORT MODE     MODE: loop, range or from
 *
 * The client echoes on its first connection until SIGUSR1 (the test starts
 * it once the connection is on RDMA), then closes everything from 3 up,
 * and checks: a new file at a freed number works as that file; an epoll
 * fd at a freed number works; the process is not spinning (a helper thread
 * on a closed fd would); a second connection works. Exit 0 when all hold. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#include <linux/close_range.h>
#endif

static volatile sig_atomic_t go;

static void on_usr1(int sig)
{
	(void)sig;
	go = 1;
}

static void die(const char *what)
{
	fprintf(stderr, "closeall: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int echo_one(int c)
{
	char buf[65536];
	for (;;) {
		ssize_t n = read(c, buf, sizeof(buf));
		if (n <= 0)
			return n < 0 ? -1 : 0;
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(c, buf + off, (size_t)(n - off));
			if (w <= 0)
				return -1;
			off += w;
		}
	}
}

static int server(int port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0)
		die("listen");
	for (int i = 0; i < 2; i++) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			die("accept");
		if (echo_one(c) < 0)
			die("echo");
		close(c);
	}
	return 0;
}

static int dial(const char *ip, int port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect");
	return s;
}

/* n bytes there and back; 0 when they came back the same. */
static int round_trip(int s, size_t n)
{
	char out[4096], in[4096];
	for (size_t done = 0; done < n; done += sizeof(out)) {
		for (size_t i = 0; i < sizeof(out); i++)
			out[i] = (char)(done + i * 7);
		if (write(s, out, sizeof(out)) != (ssize_t)sizeof(out))
			return -1;
		size_t got = 0;
		while (got < sizeof(in)) {
			ssize_t r = read(s, in + got, sizeof(in) - got);
			if (r <= 0)
				return -1;
			got += (size_t)r;
		}
		if (memcmp(in, out, sizeof(in)) != 0)
			return -1;
	}
	return 0;
}

static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int client(const char *ip, int port, const char *mode)
{
	signal(SIGUSR1, on_usr1);
	int s = dial(ip, port);
	while (!go)
		if (round_trip(s, 4096) < 0)
			die("echo before the close-all");
	/* The close-all, the connection's socket included. */
	if (strcmp(mode, "loop") == 0) {
		long max = sysconf(_SC_OPEN_MAX);
		for (int fd = 3; fd < max; fd++)
			close(fd);
	} else if (strcmp(mode, "range") == 0) {
		if (close_range(3, ~0U, 0) < 0)
			die("close_range");
	} else {
		closefrom(3);
	}
	/* A file at the freed number is that file. */
	int f = open("/dev/null", O_WRONLY);
	if (f < 0)
		die("open /dev/null");
	struct stat st;
	if (fstat(f, &st) < 0 || !S_ISCHR(st.st_mode))
		die("fstat of the new file");
	if (write(f, "x", 1) != 1)
		die("write to /dev/null at a freed number");
	if (close(f) < 0)
		die("close of the new file");
	/* An epoll fd at a freed number works, and nothing else reads it. */
	int ep = epoll_create1(0);
	struct epoll_event ev;
	if (ep < 0 || epoll_wait(ep, &ev, 1, 0) != 0)
		die("epoll at a freed number");
	/* Not spinning: a helper thread on a closed fd would burn a CPU. */
	double c0 = cpu_seconds();
	sleep(2);
	double used = cpu_seconds() - c0;
	printf("closeall %s: cpu %.3f s in 2 s asleep\n", mode, used);
	if (used > 1.0) {
		fprintf(stderr, "closeall: %.3f s of CPU in 2 s asleep: something spins\n", used);
		return 1;
	}
	close(ep);
	/* A second connection works, and (the script checks) reaches RDMA. */
	int s2 = dial(ip, port);
	go = 0;
	for (int i = 0; i < 256; i++)
		if (round_trip(s2, 4096) < 0)
			die("echo on the second connection");
	close(s2);
	printf("closeall %s: ok\n", mode);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "-s") == 0)
		return server(atoi(argv[2]));
	if (argc == 5 && strcmp(argv[1], "-c") == 0)
		return client(argv[2], atoi(argv[3]), argv[4]);
	fprintf(stderr, "usage: sovia-closeall -s PORT | -c IP PORT loop|range|from\n");
	return 2;
}
