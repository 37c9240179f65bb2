#include "clock.h"

#include <stdatomic.h>
#include <time.h>

/* The warps so far: 0 outside the tests. An offset added to every reading
 * rather than a replaceable source: the library reads the time through
 * sv_now_us in many places, directly and through struct sv_clock, and an
 * offset moves all of them together, where a source would have to be
 * installed in each. Its cost is one relaxed load next to clock_gettime
 * (tens of nanoseconds on the vDSO, a microsecond without). Relaxed: a
 * reading needs no ordering with anything else the warping thread did, and
 * the offset only grows, so no reading goes back. */
static _Atomic uint64_t warp_us;

uint64_t sv_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u +
	       atomic_load_explicit(&warp_us, memory_order_relaxed);
}

void sv_clock_warp(uint64_t us)
{
	atomic_fetch_add_explicit(&warp_us, us, memory_order_relaxed);
}
