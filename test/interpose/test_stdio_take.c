/* stdin, stdout and stderr taken over on fds 0-2 (preload/stdio_std.c):
 * every stdio call, puts() and putchar() too (they use libc's own
 * variable), goes through the cookie FILE and so through the interposed
 * read and write; freopen() keeps the FILE on the new file; a FILE
 * something already used is refused. The take replaces process-wide
 * FILEs: each case runs in a forked child whose fds 0, 1 and 2 are one
 * end of a socketpair, and the parent checks the exact bytes. */
#include "preload_harness.h"
#include "preload.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(stdio_take, .init = h_setup, .fini = h_teardown, .timeout = 60);

struct run {
	char out[4096]; /* what the child wrote on fds 1 and 2, in order */
	size_t len;
	int status;
};

/* body() in a child whose fds 0-2 are a socketpair's end; the parent
 * writes `input` and ends its side, then reads until the child is gone.
 * The child leaves with _exit: stdio's exit flush adds nothing, so the
 * parent sees only what the FILEs the variables point at wrote. */
static void run_child(void (*body)(void), const char *input, struct run *r)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		for (int fd = 0; fd < 3; fd++) {
			if (dup2(sv[1], fd) != fd)
				_exit(2);
		}
		close(sv[1]);
		body();
		_exit(0);
	}
	close(sv[1]);
	size_t n = strlen(input);
	cr_assert_eq(ph_write_all(sv[0], input, n), (long)n);
	cr_assert_eq(shutdown(sv[0], SHUT_WR), 0);
	r->len = ph_read_all(sv[0], r->out, sizeof(r->out) - 1);
	r->out[r->len] = '\0';
	close(sv[0]);
	cr_assert_eq(waitpid(pid, &r->status, 0), pid);
}

static void child_ok(const struct run *r)
{
	cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0, "the child failed check %d",
		  WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1);
}

static void take_all(void)
{
	for (int fd = 0; fd < 3; fd++) {
		CHILD_CHECK(10 + fd, sv_stdio_take_std(fd) == 0);
		CHILD_CHECK(13, sv_stdio_ours(fd));
	}
}

/* glibc's fileno() has no fd for a cookie FILE (its _fileno is -2);
 * ours answers from the list stdio.c keeps. */
static bool is_cookie_on(FILE *fp, int fd)
{
	int (*glibc_fileno)(FILE *) = (int (*)(FILE *))dlsym(RTLD_NEXT, "fileno");
	return glibc_fileno && glibc_fileno(fp) == -1 && fileno(fp) == fd;
}

static void child_writes_and_reads(void)
{
	take_all();
	CHILD_CHECK(14, is_cookie_on(stdin, 0) && is_cookie_on(stdout, 1) &&
				is_cookie_on(stderr, 2));
	CHILD_CHECK(15, fileno_unlocked(stdout) == 1);
	/* libc's own variable points at the same FILE (puts reads it). */
	FILE **libcs = dlsym(RTLD_NEXT, "stdout");
	CHILD_CHECK(16, libcs && *libcs == stdout);
	CHILD_CHECK(17, printf("printf %d\n", 1) == 9);
	CHILD_CHECK(18, puts("puts") >= 0);
	CHILD_CHECK(19, putchar('c') == 'c' && putchar('\n') == '\n');
	CHILD_CHECK(20, fputs("fputs\n", stdout) >= 0);
	CHILD_CHECK(21, fwrite("fwrite\n", 1, 7, stdout) == 7);
	/* Unbuffered: out before stdout's buffer. */
	CHILD_CHECK(22, fputs("stderr\n", stderr) >= 0);
	CHILD_CHECK(23, fflush(stdout) == 0);
	char line[64], rest[64];
	CHILD_CHECK(24, fgets(line, sizeof(line), stdin) && strcmp(line, "line one\n") == 0);
	size_t n = fread(rest, 1, sizeof(rest) - 1, stdin);
	rest[n] = '\0';
	CHILD_CHECK(25, strcmp(rest, "and the rest") == 0 && feof(stdin));
	CHILD_CHECK(26, printf("read [%s]\n", rest) > 0 && fflush(stdout) == 0);
}

Test(stdio_take, every_call_goes_through_the_cookies)
{
	struct run r;
	run_child(child_writes_and_reads, "line one\nand the rest", &r);
	child_ok(&r);
	cr_assert_str_eq(r.out, "stderr\nprintf 1\nputs\nc\nfputs\nfwrite\nread [and the rest]\n");
}

/* The take writes libc's own variable too: dlsym(RTLD_NEXT) gives
 * libc's, not this executable's copy (it has one: the wrappers here read
 * stdout). */
Test(stdio_take, rtld_next_gives_libcs_own_variable)
{
	FILE **libcs = dlsym(RTLD_NEXT, "stdout");
	cr_assert_not_null(libcs);
	Dl_info in;
	cr_assert(dladdr(libcs, &in) && in.dli_fname, "no object holds %p", (void *)libcs);
	cr_assert(strstr(in.dli_fname, "libc.so"), "RTLD_NEXT's stdout is in %s", in.dli_fname);
	cr_assert_neq(libcs, &stdout, "no copy relocation: this test proves nothing");
}

/* setvbuf() on a taken stdout: unbuffered, each call's bytes go out
 * before the next write(1). */
static void child_unbuffers_stdout(void)
{
	take_all();
	CHILD_CHECK(30, setvbuf(stdout, NULL, _IONBF, 0) == 0);
	CHILD_CHECK(31, fputs("a", stdout) >= 0);
	CHILD_CHECK(32, write(1, "b", 1) == 1);
	CHILD_CHECK(33, printf("c") == 1);
	CHILD_CHECK(34, write(1, "d", 1) == 1);
	/* And back to a buffer of its own: held until the flush. */
	static char buf[1024];
	CHILD_CHECK(35, setvbuf(stdout, buf, _IOFBF, sizeof(buf)) == 0);
	CHILD_CHECK(36, fputs("e", stdout) >= 0);
	CHILD_CHECK(37, write(1, "f", 1) == 1);
	CHILD_CHECK(38, fflush(stdout) == 0);
}

Test(stdio_take, setvbuf_works_on_taken_stdout)
{
	struct run r;
	run_child(child_unbuffers_stdout, "", &r);
	child_ok(&r);
	cr_assert_str_eq(r.out, "abcdfe");
}

/* Something wrote to stdout before the take: its bytes are in glibc's
 * buffer, so stdout stays glibc's (-EBUSY), and the unused stderr is
 * still taken. */
static void child_used_stdout_first(void)
{
	FILE *before = stdout;
	CHILD_CHECK(40, printf("early\n") == 6);
	CHILD_CHECK(41, sv_stdio_take_std(1) == -EBUSY);
	CHILD_CHECK(42, !sv_stdio_ours(1) && stdout == before);
	CHILD_CHECK(43, sv_stdio_take_std(2) == 0 && sv_stdio_ours(2));
	CHILD_CHECK(44, sv_stdio_take_std(3) == -EINVAL && !sv_stdio_ours(3));
	CHILD_CHECK(45, fputs("err\n", stderr) >= 0 && fflush(stdout) == 0);
}

Test(stdio_take, a_used_stdout_is_refused)
{
	struct run r;
	run_child(child_used_stdout_first, "", &r);
	child_ok(&r);
	cr_assert_str_eq(r.out, "err\nearly\n");
}

/* freopen() of the taken stdin: the same FILE, on fd 0, now /dev/null;
 * what it had read ahead from the socket is gone with the old file. */
static void child_reopens_stdin(void)
{
	take_all();
	FILE *fp = stdin;
	CHILD_CHECK(50, fgetc(stdin) == 'x');
	CHILD_CHECK(51, freopen(NULL, "r", stdin) == fp); /* a mode change: kept */
	errno = 1234;
	CHILD_CHECK(52, freopen("/dev/null", "r", stdin) == fp && errno == 1234);
	CHILD_CHECK(53, fgetc(stdin) == EOF && feof(stdin) && !ferror(stdin));
	CHILD_CHECK(54, fileno(stdin) == 0 && sv_stdio_ours(0));
	struct stat a, b;
	CHILD_CHECK(55, fstat(0, &a) == 0 && stat("/dev/null", &b) == 0 && a.st_rdev == b.st_rdev);
	CHILD_CHECK(56, printf("done\n") == 5 && fflush(stdout) == 0);
}

Test(stdio_take, freopen_of_stdin_keeps_the_file_on_fd_0)
{
	struct run r;
	run_child(child_reopens_stdin, "xyz", &r);
	child_ok(&r);
	cr_assert_str_eq(r.out, "done\n");
}

static char out_path[64];

/* freopen() of the taken stdout onto a file: the socket's fd 1 is closed
 * through the interposer, the same FILE writes the file on fd 1. */
static void child_reopens_stdout(void)
{
	take_all();
	FILE *fp = stdout;
	CHILD_CHECK(60, printf("before\n") == 7);
	CHILD_CHECK(61, freopen(out_path, "w", stdout) == fp);
	CHILD_CHECK(62, fileno(stdout) == 1 && sv_stdio_ours(1));
	CHILD_CHECK(63, puts("after") >= 0 && fflush(stdout) == 0);
	char b[16] = {0};
	int fd = open(out_path, O_RDONLY);
	CHILD_CHECK(64, fd >= 0 && read(fd, b, sizeof(b) - 1) == 6 && strcmp(b, "after\n") == 0);
	close(fd);
	/* A mode stdout's cookie cannot do: glibc's own FILE takes it. */
	CHILD_CHECK(65, freopen(out_path, "r", stdout) != NULL && stdout != fp);
	FILE **libcs = dlsym(RTLD_NEXT, "stdout");
	CHILD_CHECK(66, !sv_stdio_ours(1) && *libcs == stdout && fileno(stdout) == 1);
	CHILD_CHECK(67, fgets(b, sizeof(b), stdout) && strcmp(b, "after\n") == 0);
	CHILD_CHECK(68, fputs("err\n", stderr) >= 0);
}

Test(stdio_take, freopen_of_stdout_keeps_the_file_on_fd_1)
{
	strcpy(out_path, "/tmp/sv_stdio_take.XXXXXX");
	int fd = mkstemp(out_path);
	cr_assert_geq(fd, 0);
	close(fd);
	struct run r;
	run_child(child_reopens_stdout, "", &r);
	unlink(out_path);
	child_ok(&r);
	/* The flush before the reopen, then stderr's line: nothing of the
	 * file's on the socket. */
	cr_assert_str_eq(r.out, "before\nerr\n");
}
