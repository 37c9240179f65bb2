/* The inetd way: a server that forks and execs `cat` with the connection
 * as its stdin and stdout, so cat echoes the stream; and a client that
 * sends a stream and checks the echo. Nothing here knows about libsovia.
 *
 *   sovia-execcat -s [-S] PORT CONNS
 *   sovia-execcat -c HOST PORT BYTES SEED
 *
 * Server: listens on PORT (all IPv4 addresses); for each of CONNS
 * connections it forks; the child dup2()s the socket onto 0 and 1, closes
 * everything else of ours and execs cat. With -S the parent waits for
 * SIGUSR1 after each accept, before the fork. The parent closes its copy
 * at once, and after all children exited prints "OK CONNS connections"
 * and exits 0, or 1 if a cat failed.
 *
 * Client: one connection; sends a stream of BYTES payload bytes with seed
 * SEED (echo_common.h) and checks the echo. Prints "OK" and exits 0 if the
 * echo was exact. */
#include "echo_common.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WHO "sovia-execcat"

static int server(int port, int conns, int hold)
{
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (hold)
		sigprocmask(SIG_BLOCK, &usr1, NULL);
	int ls = echo_listen(WHO, port, 64);
	for (int i = 0; i < conns; i++) {
		int c = accept(ls, NULL, NULL);
		if (c < 0 && errno == EINTR) {
			i--;
			continue;
		}
		if (c < 0)
			echo_die(WHO, "accept");
		if (hold) {
			int sig;
			if (sigwait(&usr1, &sig) != 0)
				echo_die(WHO, "sigwait");
		}
		pid_t pid = fork();
		if (pid < 0)
			echo_die(WHO, "fork");
		if (pid == 0) {
			sigprocmask(SIG_UNBLOCK, &usr1, NULL);
			if (dup2(c, 0) < 0 || dup2(c, 1) < 0)
				echo_die(WHO " child", "dup2");
			close(c);
			close(ls);
			execlp("cat", "cat", (char *)NULL);
			echo_die(WHO " child", "exec cat");
		}
		if (close(c) < 0)
			echo_die(WHO, "close");
	}
	close(ls);
	return echo_reap(WHO, conns, "a cat");
}

int main(int argc, char **argv)
{
	return echo_fork_main(WHO, argc, argv, server);
}
