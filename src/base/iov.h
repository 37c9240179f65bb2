/* Scatter/gather helpers shared by the protocol core and the stream: byte
 * ranges of an iovec array. No allocation, no I/O. */
#ifndef SV_IOV_H
#define SV_IOV_H

#include "copy.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* The most iovec entries a slice or rest of one holds (the kernel's
 * UIO_MAXIOV is 1024; a write's tail past this many is written by the
 * caller's next pass). */
#define SV_IOV_MAX 64

static inline size_t sv_iov_total(const struct iovec *iov, int iovcnt)
{
	size_t n = 0;
	for (int i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}

/* Copy n bytes, starting at byte `skip` of the iovec, into dst. */
static inline void sv_iov_gather(void *dst, const struct iovec *iov, int iovcnt, size_t skip,
				 size_t n)
{
	uint8_t *d = dst;
	for (int i = 0; i < iovcnt && n > 0; i++) {
		size_t l = iov[i].iov_len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		size_t take = l - skip < n ? l - skip : n;
		sv_copy(d, (const uint8_t *)iov[i].iov_base + skip, take);
		d += take;
		n -= take;
		skip = 0;
	}
}

/* The bytes [skip, skip + n) of an iovec as an iovec of at most `max`
 * entries (fewer bytes when they need more). Returns the entries. */
static inline int sv_iov_slice(const struct iovec *iov, int iovcnt, size_t skip, size_t n,
			       struct iovec *out, int max)
{
	int k = 0;
	for (int i = 0; i < iovcnt && n > 0 && k < max; i++) {
		size_t l = iov[i].iov_len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		size_t take = l - skip < n ? l - skip : n;
		out[k].iov_base = (uint8_t *)iov[i].iov_base + skip;
		out[k].iov_len = take;
		k++;
		n -= take;
		skip = 0;
	}
	return k;
}

/* Everything after `skip` bytes (at most SV_IOV_MAX entries). */
static inline int sv_iov_advance(const struct iovec *iov, int iovcnt, size_t skip,
				 struct iovec *out)
{
	return sv_iov_slice(iov, iovcnt, skip, SIZE_MAX, out, SV_IOV_MAX);
}

#endif
