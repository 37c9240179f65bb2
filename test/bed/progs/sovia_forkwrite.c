/* A client that lets a forked child write part of its stream: a shell
 * that runs a command with the connection as its output, then goes on
 * with it; or, with "leave", a client that hands its connection to a
 * child and exits (a daemon's start). Nothing here knows about libsovia.
 *
 *   sovia-forkwrite [-l] HOST PORT HEAD CHILD GO1 GO2 [leave] < FILE
 *
 * Connects to HOST:PORT (with -l: listens there and accepts one client,
 * a server that forks with a client connected) and sends FILE, a regular file, in three parts:
 * its first HEAD bytes; once the file GO1 exists, a forked child sends the
 * next CHILD bytes (read from the same stdin, whose offset parent and
 * child share) and exits; the parent waits for it, then for the file GO2,
 * and sends the rest. Then it shuts its sending down and reads until the
 * peer's end. Exits 0 when every byte went, 1 otherwise. With "leave",
 * the child goes on instead: the parent exits 0 once the child sent its
 * CHILD bytes, and the child waits for GO2, then sends the rest and ends
 * as the parent would have. With -l and "leave", an accept-then-fork
 * server: the parent closes its copy of the connection once the child
 * sent its CHILD bytes, keeps its listening socket, and exits with the
 * child's status; the child watches the connection (poll) while it waits
 * for GO2. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WHO "sovia-forkwrite"

static void die(const char *what)
{
	fprintf(stderr, WHO ": %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Copy up to n bytes (all, for n 0) of stdin to fd. */
static void copy(int fd, unsigned long long n)
{
	static char buf[65536];
	unsigned long long done = 0;
	while (!n || done < n) {
		size_t want = sizeof(buf);
		if (n && n - done < want)
			want = (size_t)(n - done);
		ssize_t r = read(0, buf, want);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("read stdin");
		if (r == 0) {
			if (n)
				die("stdin ended early");
			return;
		}
		for (ssize_t off = 0; off < r;) {
			ssize_t w = write(fd, buf + off, (size_t)(r - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				die("write");
			off += w;
		}
		done += (unsigned long long)r;
	}
}

/* Until path exists; watching fd (>= 0) meanwhile, as a server waits
 * for its client's next request. */
static void wait_file(const char *path, int fd)
{
	while (access(path, F_OK) != 0) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (fd < 0 || poll(&p, 1, 20) != 0)
			usleep(20000);
	}
}

int main(int argc, char **argv)
{
	bool listening = argc > 1 && strcmp(argv[1], "-l") == 0;
	if (listening) {
		argc--;
		argv++;
	}
	bool leave = argc == 8 && strcmp(argv[7], "leave") == 0;
	if (argc != 7 && !leave) {
		fprintf(stderr, "usage: " WHO " [-l] HOST PORT HEAD CHILD GO1 GO2 [leave] < FILE\n");
		return 2;
	}
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(argv[1], argv[2], &hints, &ai) != 0) {
		fprintf(stderr, WHO ": cannot resolve %s\n", argv[1]);
		return 1;
	}
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (listening) {
		int one = 1;
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1) < 0)
			die("listen");
		/* The listening socket stays open, as a server's does: a
		 * client asks its port again after the fork. */
		fd = accept(fd, NULL, NULL);
		if (fd < 0)
			die("accept");
	} else if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		die("connect");
	}
	freeaddrinfo(ai);
	copy(fd, strtoull(argv[3], NULL, 10));
	wait_file(argv[5], -1);
	int sent[2];
	if (pipe(sent) < 0)
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		copy(fd, strtoull(argv[4], NULL, 10));
		if (!leave)
			_exit(0);
		if (write(sent[1], "s", 1) != 1)
			die("write pipe");
	} else if (leave) {
		char c;
		if (read(sent[0], &c, 1) != 1)
			return 1;
		if (!listening)
			return 0;
		close(fd);
		int st;
		return waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
	} else {
		int st;
		if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, WHO ": the child failed\n");
			return 1;
		}
	}
	wait_file(argv[6], leave && listening ? fd : -1);
	copy(fd, 0);
	if (shutdown(fd, SHUT_WR) < 0)
		die("shutdown");
	char b[256];
	ssize_t r;
	while ((r = read(fd, b, sizeof(b))) > 0 || (r < 0 && errno == EINTR))
		;
	if (r < 0)
		die("read");
	close(fd);
	return 0;
}
