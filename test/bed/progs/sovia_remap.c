/* Zero-copy sends from memory whose pages change under the same address,
 * for the registration cache's safety (docs/registration.md, section 3).
 *
 *   sovia-remap -s PORT ROUNDS     receive and check
 *   sovia-remap -c HOST PORT ROUNDS
 *
 * The client connects, then waits for SIGUSR1 (the test sends it once the
 * connection is on RDMA) before the first round.
 *
 * The client sends ROUNDS rounds of 1 MiB, every round from the same
 * address. Odd rounds unmap the buffer and map fresh pages at that address
 * (MAP_FIXED, through the raw system calls, as an allocator's hidden
 * munmap/mmap would); even rounds drop its pages with
 * madvise(MADV_DONTNEED) (fresh zero pages on the next touch). Each round
 * fills its own pattern before the write. A registration found by address
 * alone would send the previous round's pages: the server checks every
 * byte. A plain socket program: nothing in it knows about libsovia. */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ROUND (1u << 20)

static void die(const char *what)
{
	fprintf(stderr, "sovia-remap: %s: %s\n", what, strerror(errno));
	exit(2);
}

static uint8_t pattern(long round, size_t i)
{
	return (uint8_t)((i * 7 + (i >> 12) * 13 + (size_t)round * 101 + 1) & 0xff);
}

static int server(int port, long rounds)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0)
		die("socket");
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 1) < 0)
		die("bind/listen");
	int c = accept(ls, NULL, NULL);
	if (c < 0)
		die("accept");
	static uint8_t buf[65536];
	for (long r = 0; r < rounds; r++) {
		for (size_t off = 0; off < ROUND;) {
			size_t want = ROUND - off < sizeof(buf) ? ROUND - off : sizeof(buf);
			ssize_t n = read(c, buf, want);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				fprintf(stderr, "sovia-remap: round %ld: %s after %zu bytes\n", r,
					n ? strerror(errno) : "EOF", off);
				return 1;
			}
			for (ssize_t i = 0; i < n; i++) {
				if (buf[i] != pattern(r, off + (size_t)i)) {
					fprintf(stderr,
						"sovia-remap: round %ld byte %zu: got %u, want %u "
						"(round %ld's would be %u)\n",
						r, off + (size_t)i, buf[i], pattern(r, off + (size_t)i),
						r - 1, r ? pattern(r - 1, off + (size_t)i) : 0);
					return 1;
				}
			}
			off += (size_t)n;
		}
	}
	char extra;
	if (read(c, &extra, 1) != 0) {
		fprintf(stderr, "sovia-remap: more than %ld rounds\n", rounds);
		return 1;
	}
	printf("OK %ld rounds of %u bytes\n", rounds, ROUND);
	return 0;
}

static int client(const char *host, const char *port, long rounds)
{
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, port, &hints, &ai))
		die("getaddrinfo");
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || connect(c, ai->ai_addr, ai->ai_addrlen) < 0)
		die("connect");
	freeaddrinfo(ai);
	int sig;
	if (sigwait(&usr1, &sig) != 0)
		die("sigwait");
	uint8_t *buf = mmap(NULL, ROUND, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	for (long r = 0; r < rounds; r++) {
		if (r > 0 && r % 2) {
			/* New pages at the same address, unseen by any interposer. */
			if (syscall(SYS_munmap, buf, ROUND) < 0)
				die("munmap");
			void *p = (void *)syscall(SYS_mmap, buf, ROUND, PROT_READ | PROT_WRITE,
						  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			if (p != buf)
				die("mmap at the same address");
		} else if (r > 0) {
			if (syscall(SYS_madvise, buf, ROUND, MADV_DONTNEED) < 0)
				die("madvise");
		}
		for (size_t i = 0; i < ROUND; i++)
			buf[i] = pattern(r, i);
		for (size_t off = 0; off < ROUND;) {
			ssize_t n = write(c, buf + off, ROUND - off);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				die("write");
			off += (size_t)n;
		}
	}
	if (close(c) < 0)
		die("close");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "-s"))
		return server(atoi(argv[2]), atol(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "-c"))
		return client(argv[2], argv[3], atol(argv[4]));
	fprintf(stderr, "usage: sovia-remap -s PORT ROUNDS | -c HOST PORT ROUNDS\n");
	return 2;
}
