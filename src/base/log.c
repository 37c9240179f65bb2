#include "log.h"
#include "real.h"

#include "guard.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int sv_log_threshold = SV_LOG_WARN;
__thread int sv_tls_inside __attribute__((tls_model("initial-exec")));

static const char *const level_names[] = {
	[SV_LOG_ERROR] = "error",
	[SV_LOG_WARN] = "warning",
	[SV_LOG_INFO] = "info",
	[SV_LOG_DEBUG] = "debug",
};

static void log_vwrite(const char *prefix, bool with_time, const char *fmt, va_list ap)
{
	char buf[512];
	int saved = errno;
	int n;
	if (with_time) {
		/* Debug lines carry a monotonic time: where an upgrade spends
		 * its time shows only that way. */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		n = snprintf(buf, sizeof(buf), "libsovia[%d]: %s: %lld.%06ld ", (int)getpid(), prefix,
			     (long long)ts.tv_sec, ts.tv_nsec / 1000);
	} else {
		n = snprintf(buf, sizeof(buf), "libsovia[%d]: %s: ", (int)getpid(), prefix);
	}
	if (n < 0)
		n = 0;
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2;
	buf[len++] = '\n';
	sv_log_raw(buf, len);
	errno = saved;
}

void sv_log_raw(const char *buf, size_t len)
{
	/* The raw syscalls: never the (possibly interposed) fstat() or
	 * write(). Asked at every line: fd 2 may be another file by now. */
	struct stat st;
	int saved = errno;
	if (sv_real_syscall()(SYS_fstat, 2, &st) == 0 && S_ISSOCK(st.st_mode)) {
		errno = saved;
		return;
	}
	(void)sv_real_syscall()(SYS_write, 2, buf, len);
	errno = saved;
}

void sv_log_write(enum sv_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vwrite(level_names[level], level == SV_LOG_DEBUG, fmt, ap);
	va_end(ap);
}

void sv_fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vwrite("fatal", false, fmt, ap);
	va_end(ap);
	abort();
}
