/* A forking echo server, the classic process model: the parent accepts and
 * forks, closes its copy of the connection and goes back to accept; the
 * child serves. Nothing here knows about libsovia.
 *
 *   sovia-echo-fork -s [-S] PORT CONNS
 *   sovia-echo-fork -p WORKERS PORT CONNS
 *   sovia-echo-fork -c HOST PORT BYTES SEED [GO]
 *
 * Server: listens on PORT (all IPv4 addresses); for each of CONNS
 * connections it forks a child that echoes every byte with blocking
 * read()/write() and checks the stream (echo_common.h). With -S the parent
 * waits for SIGUSR1 after each accept, before the fork (so a test can let
 * the connection run for a while in the parent first). After all children
 * exited it prints "OK CONNS connections" and exits 0, or 1 if any child
 * saw a wrong byte. With -p it preforks WORKERS children instead, which
 * accept on the listening socket they inherited (nginx's model) and serve
 * each connection themselves, CONNS in all, while the parent only waits.
 *
 * Client: one connection; sends a stream of BYTES payload bytes with seed
 * SEED and checks the echo (poll() and a non-blocking socket). Prints "OK"
 * and exits 0 if the echo was exact. With GO, it sends its first 64 KiB, then waits
 * until the file GO exists. */
#include "echo_common.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WHO "sovia-echo-fork"

static int write_all(int fd, const uint8_t *buf, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, buf + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* The child: echo until EOF, checking the stream. */
static int child(int c)
{
	static uint8_t buf[65536];
	struct echo_check chk;
	echo_check_init(&chk);
	for (;;) {
		ssize_t n = read(c, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			echo_die(WHO " child", "read");
		if (n == 0)
			break;
		if (echo_check_feed(&chk, buf, (size_t)n, WHO " child") < 0)
			return 1;
		if (write_all(c, buf, (size_t)n) < 0)
			echo_die(WHO " child", "write");
	}
	if (echo_check_end(&chk, WHO " child") < 0)
		return 1;
	if (close(c) < 0)
		echo_die(WHO " child", "close");
	return 0;
}

int main(int argc, char **argv)
{
	return echo_fork_main(WHO, argc, argv, child, "a child");
}
