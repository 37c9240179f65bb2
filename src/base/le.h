/* Little-endian field access for the wire formats (docs/protocol.md).
 * One load or store each on little-endian hosts (memcpy of a converted
 * value), where a byte-by-byte loop cost about 120 instructions per
 * header on the data path. */
#ifndef SV_LE_H
#define SV_LE_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline void sv_put16(uint8_t *p, uint16_t v)
{
	v = htole16(v);
	memcpy(p, &v, sizeof(v));
}

static inline void sv_put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, sizeof(v));
}

static inline void sv_put64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, sizeof(v));
}

static inline uint16_t sv_get16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof(v));
	return le16toh(v);
}

static inline uint32_t sv_get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return le32toh(v);
}

static inline uint64_t sv_get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

#endif
