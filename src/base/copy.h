/* Copying payload between the application's memory and the registered
 * buffers: in pieces below glibc's `rep movsb` threshold.
 *
 * glibc copies blocks from a few KiB up to about its non-temporal threshold
 * with `rep movsb` on CPUs that advertise ERMS. Where that instruction is
 * slow, so is every message we copy: in the soft-RoCE test bed (qemu TCG,
 * `-cpu max`) glibc's memcpy moves about 230 MiB/s at 16-256 KiB, the same
 * bytes in 2 KiB pieces about 1800 MiB/s (glibc's vector loop). Natively
 * the pieces cost 0.9-1.5x one call. The measurements are in
 * docs/benchmarks.md, "Copies in the test bed" (bench/sovia_copycost.c).
 *
 * SV_COPY_PIECE is the lowest threshold glibc uses (2048 bytes, SSE2 vectors;
 * 4096 with AVX2, 8192 with AVX-512), so each piece takes the vector path. */
#ifndef SV_COPY_H
#define SV_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SV_COPY_PIECE 2048u

static inline void sv_copy(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	while (n > SV_COPY_PIECE) {
		memcpy(d, s, SV_COPY_PIECE);
		d += SV_COPY_PIECE;
		s += SV_COPY_PIECE;
		n -= SV_COPY_PIECE;
	}
	memcpy(d, s, n);
}

#endif
