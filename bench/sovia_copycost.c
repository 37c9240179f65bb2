/* What a payload copy costs here: glibc's memcpy in one call against
 * libsovia's copy in pieces (src/base/copy.h), for the sizes of messages.
 *
 *   sovia-copycost [MIB_PER_SIZE]   (default 32)
 *
 * Prints MiB/s and microseconds per copy for each size. Run it where the
 * library runs (in the soft-RoCE test bed: bench/run.sh does). */
#include "copy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
	if (mib < 1) {
		fprintf(stderr, "usage: sovia-copycost [MIB_PER_SIZE]\n");
		return 2;
	}
	static const size_t sizes[] = {1024, 4096, 16384, 32768, 65536, 262144, 1048576};
	const size_t max = 1u << 20;
	/* The destination offset of a payload behind its 24-byte header. */
	unsigned char *src = aligned_alloc(4096, max), *dst = aligned_alloc(4096, max + 4096);
	if (!src || !dst)
		return 1;
	memset(src, 1, max);
	memset(dst, 2, max + 4096);
	printf("| size | memcpy MiB/s | memcpy us | pieces MiB/s | pieces us | pieces/memcpy time |\n");
	printf("|---:|---:|---:|---:|---:|---:|\n");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t s = sizes[i], n = (mib << 20) / s;
		double t[2];
		for (int m = 0; m < 2; m++) {
			double t0 = now();
			for (size_t k = 0; k < n; k++) {
				if (m == 0)
					memcpy(dst + 24, src, s);
				else
					sv_copy(dst + 24, src, s);
				__asm__ volatile("" : : "r"(dst) : "memory");
			}
			t[m] = now() - t0;
		}
		double total = (double)(n * s) / 1048576.0;
		printf("| %zu | %.1f | %.2f | %.1f | %.2f | %.2f |\n", s, total / t[0],
		       t[0] / (double)n * 1e6, total / t[1], t[1] / (double)n * 1e6, t[1] / t[0]);
	}
	free(src);
	free(dst);
	return 0;
}
