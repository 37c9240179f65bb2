/* A growable byte buffer append, shared by the core (bytes given back) and
 * the stream (TCP bytes read ahead). No locks, no I/O. */
#ifndef SV_BYTEBUF_H
#define SV_BYTEBUF_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Bytes read or kept ahead of their reader: buf[off, len) is what is
 * left of them, cap what buf holds. */
struct sv_bytebuf {
	uint8_t *buf;
	size_t len, off, cap;
};

/* Append n bytes to (*buf, *len, *cap), doubling the capacity from 64 KiB
 * as needed. 0, or -ENOMEM with the buffer unchanged. */
static inline int sv_bytes_append(uint8_t **buf, size_t *len, size_t *cap, const void *data,
				  size_t n)
{
	if (!n)
		return 0; /* memcpy wants a buffer even for nothing, and there may be none */
	if (*len + n > *cap) {
		size_t c = *cap ? *cap : 65536;
		while (c < *len + n)
			c *= 2;
		uint8_t *nb = realloc(*buf, c);
		if (!nb)
			return -ENOMEM;
		*buf = nb;
		*cap = c;
	}
	memcpy(*buf + *len, data, n);
	*len += n;
	return 0;
}

#endif
