/* Timestamps for the benchmark programs: the TSC where there is one (an
 * instruction, where clock_gettime may be a system call: in the test bed's
 * guest, whose clock is the HPET, about 0.9 us), CLOCK_MONOTONIC
 * nanoseconds elsewhere. Callers convert ticks at a rate they measure
 * against CLOCK_MONOTONIC over their own run. */
#ifndef SOVIA_APPS_TICKS_H
#define SOVIA_APPS_TICKS_H

#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

static inline uint64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline uint64_t ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return __rdtsc();
#else
	return mono_ns();
#endif
}

#endif
