/* Both ends send at once: a writer thread sends BYTES of a pattern while
 * the main thread reads and checks the peer's BYTES. With -d the readers
 * start late, so both sides first fill their send windows completely and
 * block; the connection must still finish (no deadlock). A plain socket
 * program: nothing in it knows about libsovia.
 *
 *   sovia-bidir -s ADDR PORT BYTES [-d MS]
 *   sovia-bidir -c ADDR PORT BYTES [-d MS] */
#include <netdb.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fd;
static long long total;

static uint8_t pattern(long long off, int who)
{
	return (uint8_t)((off * 131 + (off >> 11) + who * 71) & 0xff);
}

static void *writer(void *arg)
{
	int who = *(int *)arg;
	static const size_t sizes[] = {1, 7, 100, 1500, 4096, 65536, 300000};
	uint8_t *buf = malloc(300000);
	long long off = 0;
	size_t k = 0;
	while (off < total) {
		size_t n = sizes[k++ % 7];
		if ((long long)n > total - off)
			n = (size_t)(total - off);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(off + (long long)i, who);
		size_t done = 0;
		while (done < n) {
			ssize_t r = write(fd, buf + done, n - done);
			if (r <= 0) {
				perror("sovia-bidir: write");
				exit(1);
			}
			done += (size_t)r;
		}
		off += (long long)n;
	}
	shutdown(fd, SHUT_WR);
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 5 || (strcmp(argv[1], "-s") && strcmp(argv[1], "-c"))) {
		fprintf(stderr, "usage: sovia-bidir -s|-c ADDR PORT BYTES [-d MS]\n");
		return 1;
	}
	int server = strcmp(argv[1], "-s") == 0;
	total = atoll(argv[4]);
	int delay_ms = argc >= 7 && strcmp(argv[5], "-d") == 0 ? atoi(argv[6]) : 0;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(argv[2], argv[3], &hints, &ai)) {
		fprintf(stderr, "sovia-bidir: cannot resolve %s\n", argv[2]);
		return 1;
	}
	if (server) {
		int ls = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(ls, ai->ai_addr, ai->ai_addrlen) < 0 || listen(ls, 1) < 0) {
			perror("sovia-bidir: listen");
			return 1;
		}
		fd = accept(ls, NULL, NULL);
		close(ls);
	} else {
		for (int i = 0; i < 100; i++) {
			fd = socket(ai->ai_family, SOCK_STREAM, 0);
			if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
				break;
			close(fd);
			fd = -1;
			usleep(100000);
		}
	}
	freeaddrinfo(ai);
	if (fd < 0) {
		perror("sovia-bidir: connect/accept");
		return 1;
	}
	int me = server ? 1 : 2, peer = server ? 2 : 1;
	pthread_t t;
	pthread_create(&t, NULL, writer, &me);
	if (delay_ms)
		usleep((useconds_t)delay_ms * 1000);
	static uint8_t buf[131072];
	long long off = 0;
	for (;;) {
		ssize_t r = read(fd, buf, sizeof(buf) - (size_t)(off % 977));
		if (r < 0) {
			perror("sovia-bidir: read");
			return 1;
		}
		if (r == 0)
			break;
		for (ssize_t i = 0; i < r; i++) {
			if (buf[i] != pattern(off + i, peer)) {
				fprintf(stderr, "sovia-bidir: byte %lld differs\n", off + i);
				return 2;
			}
		}
		off += r;
	}
	pthread_join(t, NULL);
	if (off != total) {
		fprintf(stderr, "sovia-bidir: got %lld bytes, want %lld\n", off, total);
		return 2;
	}
	close(fd);
	printf("sovia-bidir: OK %lld bytes each way\n", total);
	return 0;
}
