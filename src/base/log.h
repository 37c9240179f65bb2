/* Logging for libsovia internals. Writes go straight to fd 2 with the raw
 * write syscall so that logging never re-enters the interposer. */
#ifndef SV_LOG_H
#define SV_LOG_H

#include <stddef.h>

enum sv_log_level {
	SV_LOG_ERROR = 0,
	SV_LOG_WARN = 1,
	SV_LOG_INFO = 2,
	SV_LOG_DEBUG = 3,
};

/* The current threshold; messages above it are dropped. */
extern int sv_log_threshold;

void sv_log_write(enum sv_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define sv_log(level, ...)                                                     \
	do {                                                                   \
		if ((int)(level) <= sv_log_threshold)                          \
			sv_log_write((level), __VA_ARGS__);                    \
	} while (0)

#define sv_err(...) sv_log(SV_LOG_ERROR, __VA_ARGS__)
#define sv_warn(...) sv_log(SV_LOG_WARN, __VA_ARGS__)
#define sv_info(...) sv_log(SV_LOG_INFO, __VA_ARGS__)
#define sv_dbg(...) sv_log(SV_LOG_DEBUG, __VA_ARGS__)

/* Write a finished line to fd 2, with the raw syscall. Nothing is written
 * when fd 2 is a socket (an inetd service's connection, or a program that
 * dup2()ed its own onto it): the line would enter that byte stream. */
void sv_log_raw(const char *buf, size_t len);

/* Print and abort: for broken invariants only (never for peer input). */
_Noreturn void sv_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
