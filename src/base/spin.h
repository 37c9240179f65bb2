/* The adaptive spin: how long a wait on a stream polls its completion
 * queue before it sleeps in the kernel.
 *
 * A reply that comes within the spin costs no interrupt and no two context
 * switches; a spin that ends in a sleep anyway is CPU taken from the peer
 * and, on soft-RoCE, from rxe. So each stream keeps a moving average of how
 * long its waits lasted (7/8 old, 1/8 new; a wait longer than twice the
 * bound counts as twice the bound, since only whether the average fits
 * matters, and a ping-pong that starts after a long idle wait then gets
 * its spin back within 16 waits). A wait spins twice the average when
 * the average is at most half the bound (SOVIA_SPIN_US), and otherwise a
 * probe of 1/16 of the bound that still catches the odd quick reply. A
 * stream with no wait behind it yet starts from a quarter of the bound.
 *
 * The probe must be longer than a small message's round trip. A wait the
 * probe does not cover ends in a sleep, and a slept wait lasts the reply
 * plus the wake-up, which under emulation can take milliseconds: the average
 * then stays above half the bound and the stream never spins again (the
 * "slow mode" of docs/design.md). With the default 4 ms bound the probe is
 * 250 us, above a small message's round trip in the emulated bed. */
#ifndef SV_SPIN_H
#define SV_SPIN_H

#include <stdint.h>

#define SV_SPIN_PROBE_DIV 16u

/* Microseconds to spin, given the average (0: none seen yet) and the bound
 * (0: never spin). */
uint32_t sv_spin_budget(uint32_t avg_us, uint32_t max_us);

/* A wait with no write on the stream since its last read (a streaming
 * reader, a server between requests) is not waiting for a reply: it spins
 * at most SV_SPIN_READER_US. A streaming receiver's waits last as long as
 * the sender takes to fill a message; spinning through them bought no
 * throughput that sleeping lost at 1 MiB and cost the CPU the rest of the
 * time (src/base/spin.c, docs/design.md). */
#define SV_SPIN_READER_US 50u
uint32_t sv_spin_reader(uint32_t budget_us);

/* A pass of the spin is a look at the completion queue. The clock is read
 * every SV_SPIN_CLOCK_PASSES passes and the CPU offered to others
 * (sched_yield) every SV_SPIN_YIELD_PASSES: both are system calls where
 * the clock has no vDSO (about 1 us each in the emulated bed), and doing
 * both on every pass adds microseconds to each message of a ping-pong.
 * The yield still comes every few microseconds for a peer that shares the
 * CPU. */
#define SV_SPIN_CLOCK_PASSES 32u
#define SV_SPIN_YIELD_PASSES 64u

/* The average after a wait of sample_us. Never 0 (0 means "none yet"). */
uint32_t sv_spin_average(uint32_t avg_us, uint64_t sample_us, uint32_t max_us);

#endif
