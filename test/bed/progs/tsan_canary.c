/* A deliberate data race, run by tsan.sh under the same LD_PRELOAD as the
 * test it follows. TSan must report it (exit code 66 with halt_on_error):
 * otherwise a clean TSan run would prove nothing, for example if the
 * runtime were loaded in a way that leaves it inert.
 *
 * Like the programs the tests run (nc, ftpd, apps/), this one is not built
 * with -fsanitize=thread: it reports its accesses to the runtime through
 * __tsan_write8, found at run time, which is what libsovia's instrumented
 * code calls. So it checks the runtime that the preload brings, and that
 * threads created by an uninstrumented program are tracked. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define ROUNDS 8

/* One variable per round, each written by two threads with no
 * synchronisation. One round was once not reported in the bed (of about
 * ten runs; never in 200 on the host), so there are several: TSan stops at
 * its first report. */
static long counter[ROUNDS];
static void (*tsan_write8)(void *);

static void *bump(void *arg)
{
	long *c = arg;
	for (int i = 0; i < 1000; i++) {
		tsan_write8(c);
		(*c)++;
	}
	return NULL;
}

int main(void)
{
	*(void **)&tsan_write8 = dlsym(RTLD_DEFAULT, "__tsan_write8");
	if (!tsan_write8) {
		fprintf(stderr, "tsan-canary: no TSan runtime loaded\n");
		return 3;
	}
	for (int r = 0; r < ROUNDS; r++) {
		pthread_t t;
		if (pthread_create(&t, NULL, bump, &counter[r]) != 0)
			return 2;
		bump(&counter[r]);
		pthread_join(t, NULL);
	}
	printf("tsan-canary: %d rounds, no race reported\n", ROUNDS);
	return 0;
}
