/* LeakSanitizer in the ASan copies of the Criterion tests (test/CMakeLists.txt).
 *
 * Criterion runs each test in a worker process of its own, the test binary
 * exec'd again under the name "boxfort-worker"; the process started by
 * ctest is the runner, which only schedules the workers and collects their
 * reports. With several workers at once (--jobs) the runner (libcriterion
 * 2.4's criterion_run_all_tests) leaves some of its own allocations
 * unfreed at exit, and LeakSanitizer's check there fails the whole binary.
 * No test code runs in the runner, so its check is off; every worker,
 * where the tests and the library run, keeps it. */
#include <errno.h>
#include <string.h>

/* Called by LeakSanitizer before its check at exit (weak in the
 * sanitizer runtime, which this one overrides: visible to it despite
 * -fvisibility=hidden; unused without a sanitizer). */
__attribute__((visibility("default"))) int __lsan_is_turned_off(void);

int __lsan_is_turned_off(void)
{
	return strcmp(program_invocation_short_name, "boxfort-worker") != 0;
}
