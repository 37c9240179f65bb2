/* A call's view of the clock, read at most once and only when something
 * needs it (as libuv caches its loop time). Each reading is a system call
 * where the clock source has no vDSO (the emulated test bed: about 1 us),
 * and most calls need none: a write that goes out at once, a read that
 * finds its data. A call starts with an unread clock; whatever needs the
 * time first reads it, and later needs in the same call get that reading.
 * A wait that slept sets the reading it took when it woke.
 *
 * The protocol core has no clock of its own: it is handed the caller's. */
#ifndef SV_CLOCK_H
#define SV_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

struct sv_clock {
	uint64_t us;            /* the reading, in microseconds; 0: not read yet */
	uint64_t (*source)(void); /* monotonic microseconds, never 0 */
};

/* Monotonic microseconds (CLOCK_MONOTONIC), never 0: the library's source.
 * It includes the warps so far (sv_clock_warp). */
uint64_t sv_now_us(void);

/* Move the library's clock forward by `us` microseconds, for every thread
 * at once: the tests' virtual time, so that a timer of seconds (a peer's
 * allowed silence, a linger, an idle deadline) expires without the test
 * sleeping through it. Only a test calls it. A thread asleep on a
 * deadline computed before the warp sleeps on until woken: the caller
 * wakes it (the helper: sv_helper_wake; a stream's waiters:
 * sv_stream_wake). The clock never goes back. */
void sv_clock_warp(uint64_t us);

/* An unread clock on the library's source. */
#define SV_CLOCK_INIT ((struct sv_clock){.us = 0, .source = sv_now_us})

/* The time: the reading, taken now if there is none yet. */
static inline uint64_t sv_clock_now(struct sv_clock *c)
{
	if (!c->us)
		c->us = c->source();
	return c->us;
}

/* Has the clock been read in this call? */
static inline bool sv_clock_known(const struct sv_clock *c)
{
	return c->us != 0;
}

/* A fresh reading (after a wait, or before a deadline that must be exact). */
static inline uint64_t sv_clock_update(struct sv_clock *c)
{
	c->us = c->source();
	return c->us;
}

#endif
