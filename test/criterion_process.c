/* What every Criterion test binary here links (test/CMakeLists.txt): two
 * adjustments to the processes Criterion makes, none to a test.
 *
 * Criterion runs each test in a worker process of its own, the test binary
 * exec'd again under the name "boxfort-worker"; the process started by
 * ctest is the runner, which only schedules the workers and collects their
 * reports. */
#include <errno.h>
#include <string.h>

/* LeakSanitizer (the ASan copies). With several workers at once (--jobs)
 * the runner (libcriterion 2.4's criterion_run_all_tests) leaves some of
 * its own allocations unfreed at exit, and LeakSanitizer's check there
 * would fail the whole binary. No test code runs in the runner, so its
 * check is off; every worker, where the tests and the library run, keeps
 * it. LeakSanitizer calls this before its check at exit: weak in the
 * sanitizer runtime, which this definition overrides (visible to it
 * despite -fvisibility=hidden); unused without a sanitizer. */
__attribute__((visibility("default"))) int __lsan_is_turned_off(void);

int __lsan_is_turned_off(void)
{
	return strcmp(program_invocation_short_name, "boxfort-worker") != 0;
}

/* The system's CA certificates. Each process's criterion_initialize calls
 * git_libgit2_init (Criterion uses libgit2 for its diffs), and Debian's
 * libgit2 then parses the whole CA bundle with mbedTLS: a PEM search with
 * strstr per certificate, which ASan's strstr interceptor makes quadratic
 * (a strlen of the rest of the bundle each time). That was a third of the
 * CPU time of the ASan copies, hundreds of processes each. No test makes
 * a TLS connection: the bundle is not read (0: parsed, no certificate).
 * libgit2 reaches this definition because the binary exports it
 * (test/CMakeLists.txt: --export-dynamic-symbol) and the executable comes
 * first in the dynamic linker's search. */
__attribute__((visibility("default"))) int mbedtls_x509_crt_parse_file(void *chain,
									 const char *path);

int mbedtls_x509_crt_parse_file(void *chain, const char *path)
{
	(void)chain;
	(void)path;
	return 0;
}
