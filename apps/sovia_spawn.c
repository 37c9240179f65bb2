/* The classic process models on one accepted connection, for the tests of
 * the way back to TCP: accept, let the client's data arrive (it is then
 * held by libsovia, if the connection went over RDMA), then hand the
 * socket to another program as its stdin and stdout.
 *
 *   sovia-spawn [-w MS] [-r BYTES] PORT CMD [ARGS...]
 *
 * Listens on PORT (all addresses), accepts one connection, waits MS
 * milliseconds (default 2000), reads BYTES bytes itself and writes them
 * back (default 0), then forks; the child dup2()s the socket onto 0 and 1
 * and execs CMD; the parent closes its copy and waits for the child.
 * Exit status: the child's. Nothing here knows about libsovia. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "sovia-spawn: %s: %s\n", what, strerror(errno));
	exit(2);
}

int main(int argc, char **argv)
{
	long wait_ms = 2000, own = 0;
	int o;
	while ((o = getopt(argc, argv, "+w:r:")) != -1) {
		if (o == 'w')
			wait_ms = atol(optarg);
		else if (o == 'r')
			own = atol(optarg);
		else
			return 2;
	}
	if (argc - optind < 2) {
		fprintf(stderr, "usage: sovia-spawn [-w MS] [-r BYTES] PORT CMD [ARGS...]\n");
		return 2;
	}
	int port = atoi(argv[optind]);
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0)
		die("socket");
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("bind");
	if (listen(ls, 4) < 0)
		die("listen");
	int c = accept(ls, NULL, NULL);
	if (c < 0)
		die("accept");
	struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
	/* Some of the stream read and echoed by this process itself. */
	char buf[4096];
	while (own > 0) {
		ssize_t n = read(c, buf, own < (long)sizeof(buf) ? (size_t)own : sizeof(buf));
		if (n <= 0)
			die("read");
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(c, buf + off, (size_t)(n - off));
			if (w <= 0)
				die("write");
			off += w;
		}
		own -= n;
	}
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (dup2(c, 0) < 0 || dup2(c, 1) < 0)
			die("dup2");
		close(c);
		close(ls);
		execvp(argv[optind + 1], argv + optind + 1);
		die("exec");
	}
	close(c);
	int st;
	if (waitpid(pid, &st, 0) < 0)
		die("waitpid");
	return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}
