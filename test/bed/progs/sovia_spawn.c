/* The classic process models on one connection, for the tests of the way
 * back to TCP: let data arrive or leave (it is then held by libsovia, if
 * the connection went over RDMA), then hand the socket to another program.
 *
 *   sovia-spawn [-w MS | -s] [-r BYTES] PORT CMD [ARGS...]
 *   sovia-spawn -c HOST [-s] [-r BYTES] PORT CMD [ARGS...]
 *
 * Server (default): listens on PORT (all addresses), accepts one
 * connection, waits MS milliseconds (default 2000) or, with -s, until
 * SIGUSR1; reads BYTES bytes itself and writes them back (default 0); then
 * forks: the child dup2()s the socket onto 0 and 1 and execs CMD.
 *
 * Client (-c): connects to HOST:PORT; with -s waits until SIGUSR1; writes
 * BYTES bytes of its stdin to the socket itself; then forks: the child
 * dup2()s the socket onto 1 only (stdin stays, so CMD = cat sends the rest
 * of it) and execs CMD.
 *
 * The parent closes its copy and waits for the child. Exit status: the
 * child's. Nothing here knows about libsovia. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
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

static void write_all(int fd, const char *buf, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, buf + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("write");
		off += (size_t)w;
	}
}

/* Some of the stream read (from `from`) and written (to `to`) by this
 * process itself. */
static void copy_own(int from, int to, long own)
{
	char buf[4096];
	while (own > 0) {
		ssize_t n = read(from, buf, own < (long)sizeof(buf) ? (size_t)own : sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("read");
		write_all(to, buf, (size_t)n);
		own -= n;
	}
}

static int server_socket(int port, int *ls_out)
{
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
	*ls_out = ls;
	return c;
}

static int client_socket(const char *host, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	int r = getaddrinfo(host, port, &hints, &ai);
	if (r) {
		fprintf(stderr, "sovia-spawn: %s: %s\n", host, gai_strerror(r));
		exit(2);
	}
	int c = socket(ai->ai_family, ai->ai_socktype, 0);
	if (c < 0)
		die("socket");
	if (connect(c, ai->ai_addr, ai->ai_addrlen) < 0)
		die("connect");
	freeaddrinfo(ai);
	return c;
}

int main(int argc, char **argv)
{
	long wait_ms = 2000, own = 0;
	const char *host = NULL;
	int by_signal = 0, o;
	while ((o = getopt(argc, argv, "+w:r:sc:")) != -1) {
		if (o == 'w')
			wait_ms = atol(optarg);
		else if (o == 'r')
			own = atol(optarg);
		else if (o == 's')
			by_signal = 1;
		else if (o == 'c')
			host = optarg;
		else
			return 2;
	}
	if (argc - optind < 2) {
		fprintf(stderr, "usage: sovia-spawn [-c HOST] [-w MS | -s] [-r BYTES] PORT CMD [ARGS...]\n");
		return 2;
	}
	/* SIGUSR1 is taken by sigwait, from before the connection exists. */
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (by_signal)
		sigprocmask(SIG_BLOCK, &usr1, NULL);

	int ls = -1;
	int c = host ? client_socket(host, argv[optind]) : server_socket(atoi(argv[optind]), &ls);
	if (by_signal) {
		int sig;
		if (sigwait(&usr1, &sig) != 0)
			die("sigwait");
		sigprocmask(SIG_UNBLOCK, &usr1, NULL);
	} else if (!host) {
		struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000};
		nanosleep(&ts, NULL);
	}
	if (host)
		copy_own(0, c, own);
	else
		copy_own(c, c, own);

	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if ((!host && dup2(c, 0) < 0) || dup2(c, 1) < 0)
			die("dup2");
		close(c);
		if (ls >= 0)
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
