/* The inetd way: a server that forks and execs `cat` with the connection
 * as its stdin and stdout, so cat echoes the stream; and a client that
 * sends a stream and checks the echo. Nothing here knows about libsovia.
 *
 *   sovia-execcat -s [-S] PORT CONNS
 *   sovia-execcat -c HOST PORT BYTES SEED [GO]
 *
 * Server: listens on PORT (all IPv4 addresses); for each of CONNS
 * connections it forks; the child dup2()s the socket onto 0 and 1, closes
 * everything else of ours and execs cat. With -S the parent waits for
 * SIGUSR1 after each accept, before the fork. The parent closes its copy
 * at once, and after all children exited prints "OK CONNS connections"
 * and exits 0, or 1 if a cat failed. EXECCAT_PROG="sed -n p" (words split
 * at spaces) runs another echoing program instead of cat: sed uses
 * glibc's stdio on the socket. `sovia-execcat -e` is such a program: an
 * echo through fread and fwrite whose last bytes exit() writes.
 *
 * Client: one connection; sends a stream of BYTES payload bytes with seed
 * SEED (echo_common.h) and checks the echo. Prints "OK" and exits 0 if the
 * echo was exact. With GO, it sends its first 64 KiB, then waits
 * until the file GO exists. */
#include "echo_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WHO "sovia-execcat"

/* The child: cat (or $EXECCAT_PROG, split at spaces) on the socket as its
 * stdin and stdout. */
static int child(int c)
{
	if (dup2(c, 0) < 0 || dup2(c, 1) < 0)
		echo_die(WHO " child", "dup2");
	close(c);
	char *argv[16] = {"cat", NULL};
	const char *prog = getenv("EXECCAT_PROG");
	if (prog && *prog) {
		char *words = strdup(prog);
		int n = 0;
		for (char *w = strtok(words, " "); w && n < 15; w = strtok(NULL, " "))
			argv[n++] = w;
		argv[n] = NULL;
	}
	execvp(argv[0], argv);
	echo_die(WHO " child", "exec");
}

/* -e: an echo through stdio that leaves its last bytes in stdout's buffer
 * for exit() to write (no fflush, no fclose), as many small programs do. */
static int stdio_echo(void)
{
	char b[4096];
	size_t n;
	while ((n = fread(b, 1, sizeof(b), stdin)) > 0)
		if (fwrite(b, 1, n, stdout) != n)
			return 1;
	return ferror(stdin) ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "-e") == 0)
		return stdio_echo();
	return echo_fork_main(WHO, argc, argv, child, "a cat");
}
