/* A server that moves to io_uring mid-connection: it reads the first
 * bytes with read(), waits until a gate file exists, sets up a ring, and
 * from then on receives with the ring, writing what it gets to stdout and
 * sending it back with the ring, until the client's end.
 *
 *   sovia-uring -r FIRST_BYTES -g GATE_FILE PORT
 *
 * Nothing in it knows about libsovia: the test runs it preloaded, with the
 * connection on RDMA when the ring comes. Exit 0 when every byte was
 * received and sent back. */
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int accept_one(int port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), on = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0)
		return -1;
	int fd = accept(l, NULL, NULL);
	close(l);
	return fd;
}

static int write_out(const char *b, size_t n)
{
	return fwrite(b, 1, n, stdout) == n ? 0 : -1;
}

/* One operation through the ring: its result (bytes, or -errno). */
static int ring_op(struct io_uring *ring, int fd, char *buf, size_t n, bool rx)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (rx)
		io_uring_prep_recv(sqe, fd, buf, n, 0);
	else
		io_uring_prep_send(sqe, fd, buf, n, MSG_NOSIGNAL);
	io_uring_submit(ring);
	struct io_uring_cqe *cqe;
	int r = io_uring_wait_cqe(ring, &cqe);
	if (r < 0)
		return r;
	r = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return r;
}

static int serve_with_ring(int fd, long long *echoed)
{
	struct io_uring ring;
	int r = io_uring_queue_init(8, &ring, 0);
	if (r < 0) {
		fprintf(stderr, "uring: io_uring_queue_init: %s\n", strerror(-r));
		return -1;
	}
	static char buf[65536];
	for (;;) {
		int n = ring_op(&ring, fd, buf, sizeof(buf), true);
		if (n < 0) {
			fprintf(stderr, "uring: recv: %s\n", strerror(-n));
			return -1;
		}
		if (n == 0)
			break;
		if (write_out(buf, (size_t)n) < 0)
			return -1;
		for (int off = 0; off < n;) {
			int k = ring_op(&ring, fd, buf + off, (size_t)(n - off), false);
			if (k <= 0) {
				fprintf(stderr, "uring: send: %s\n", strerror(k < 0 ? -k : EIO));
				return -1;
			}
			off += k;
			*echoed += k;
		}
	}
	io_uring_queue_exit(&ring);
	return 0;
}

int main(int argc, char **argv)
{
	long long first = 0;
	const char *gate = NULL;
	int o;
	while ((o = getopt(argc, argv, "r:g:")) != -1) {
		if (o == 'r')
			first = atoll(optarg);
		else if (o == 'g')
			gate = optarg;
		else
			return 2;
	}
	if (optind != argc - 1 || !gate) {
		fprintf(stderr, "usage: sovia-uring -r FIRST_BYTES -g GATE_FILE PORT\n");
		return 2;
	}
	int fd = accept_one(atoi(argv[optind]));
	if (fd < 0) {
		perror("uring: accept");
		return 1;
	}
	static char buf[65536];
	for (long long got = 0; got < first;) {
		size_t want = first - got < (long long)sizeof(buf) ? (size_t)(first - got) : sizeof(buf);
		ssize_t n = read(fd, buf, want);
		if (n <= 0 || write_out(buf, (size_t)n) < 0) {
			perror("uring: read");
			return 1;
		}
		got += n;
	}
	struct stat st;
	while (stat(gate, &st) < 0)
		usleep(10000);
	long long echoed = 0;
	if (serve_with_ring(fd, &echoed) < 0)
		return 1;
	fprintf(stderr, "uring: %lld bytes received and sent back through the ring\n", echoed);
	close(fd);
	return fflush(stdout) == 0 ? 0 : 1;
}
