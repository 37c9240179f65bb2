/* What the operations on libsovia's data path cost on this CPU: a call and
 * its return, an indirect call, an atomic, an uncontended mutex or spinlock
 * pair (each a call into libc), a clock read. Under full emulation (qemu's
 * TCG, the soft-RoCE test bed) these are far dearer, next to a plain
 * instruction, than on hardware, which is why counting instructions does
 * not tell the whole cost of a path there (docs/benchmarks.md).
 *
 *   sovia-opcost [MILLIONS]   (iterations per operation, default 2)
 *
 * Prints a Markdown table: nanoseconds per loop iteration for each
 * operation and the extra over the loop alone, the median of three
 * rounds. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ticks.h"

__attribute__((noinline)) static int plus_one(int x)
{
	__asm__ volatile("");
	return x + 1;
}

static int (*volatile plus_one_ptr)(int) = plus_one;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_spinlock_t spl;
static volatile int sink;
static long iters;

/* Each operation has its own loop, so no dispatch is timed with it. */
#define TIMED_LOOP(name, body)                                                                     \
	static double name(void)                                                                   \
	{                                                                                          \
		int x = 0;                                                                         \
		uint64_t t0 = mono_ns();                                                           \
		for (long i = 0; i < iters; i++) {                                                 \
			__asm__ volatile("" : "+r"(x));                                            \
			body;                                                                      \
		}                                                                                  \
		uint64_t t1 = mono_ns();                                                           \
		sink = x;                                                                          \
		return (double)(t1 - t0) / (double)iters;                                          \
	}

TIMED_LOOP(op_loop, x++)
TIMED_LOOP(op_call, x = plus_one(x))
TIMED_LOOP(op_icall, x = plus_one_ptr(x))
TIMED_LOOP(op_atomic, x += __atomic_fetch_add(&sink, 1, __ATOMIC_SEQ_CST))
TIMED_LOOP(op_mutex, pthread_mutex_lock(&mu); x++; pthread_mutex_unlock(&mu))
TIMED_LOOP(op_spin, pthread_spin_lock(&spl); x++; pthread_spin_unlock(&spl))

static double op_clock(void)
{
	long n = iters / 100 > 0 ? iters / 100 : 1; /* a system call in some guests */
	uint64_t t0 = mono_ns(), acc = 0;
	for (long i = 0; i < n; i++)
		acc += mono_ns();
	uint64_t t1 = mono_ns();
	sink = (int)acc;
	return (double)(t1 - t0) / (double)n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	long m = argc > 1 ? strtol(argv[1], NULL, 10) : 2;
	if (m < 1 || m > 1000) {
		fprintf(stderr, "usage: sovia-opcost [MILLIONS] (1-1000)\n");
		return 2;
	}
	iters = m * 1000000;
	pthread_spin_init(&spl, PTHREAD_PROCESS_PRIVATE);
	static const struct {
		const char *name;
		double (*fn)(void);
	} ops[] = {
		{"loop alone", op_loop},
		{"direct call + return", op_call},
		{"indirect call + return", op_icall},
		{"atomic add (lock xadd)", op_atomic},
		{"mutex lock + unlock (libc)", op_mutex},
		{"spinlock lock + unlock (libc)", op_spin},
		{"clock_gettime(CLOCK_MONOTONIC)", op_clock},
	};
	enum { NOPS = sizeof(ops) / sizeof(ops[0]), ROUNDS = 3 };
	double t[NOPS][ROUNDS];
	for (int r = 0; r < ROUNDS; r++)
		for (int k = 0; k < NOPS; k++)
			t[k][r] = ops[k].fn();
	double med[NOPS];
	for (int k = 0; k < NOPS; k++) {
		qsort(t[k], ROUNDS, sizeof(double), cmp_double);
		med[k] = t[k][ROUNDS / 2];
	}
	printf("| operation | ns per iteration | extra over the loop |\n|---|---:|---:|\n");
	for (int k = 0; k < NOPS; k++)
		printf("| %s | %.2f | %.2f |\n", ops[k].name, med[k], k ? med[k] - med[0] : 0.0);
	return 0;
}
