/* The payload copy in pieces (src/copy.h): the same bytes as memcpy, for
 * lengths around the piece size and at unaligned addresses, and nothing
 * outside the destination range touched. */
#include "copy.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>

TestSuite(copy, .timeout = 10);

struct copy_case {
	size_t len, src_off, dst_off;
};

ParameterizedTestParameters(copy, same_bytes_as_memcpy)
{
	static struct copy_case cases[] = {
		{0, 0, 0},
		{1, 3, 5},
		{SV_COPY_PIECE - 1, 0, 24},
		{SV_COPY_PIECE, 1, 0},
		{SV_COPY_PIECE + 1, 0, 7},
		{2 * SV_COPY_PIECE, 24, 24},
		{2 * SV_COPY_PIECE + 13, 5, 3},
		{65536, 0, 24},
		{65536 + 3, 11, 1},
		{1u << 20, 0, 24},
	};
	return cr_make_param_array(struct copy_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct copy_case *c, copy, same_bytes_as_memcpy)
{
	const size_t guard = 64, size = c->len + c->dst_off + 2 * guard;
	unsigned char *src = malloc(c->len + c->src_off + 1);
	unsigned char *got = malloc(size), *want = malloc(size);
	cr_assert(src && got && want);
	for (size_t i = 0; i < c->len + c->src_off + 1; i++)
		src[i] = (unsigned char)(i * 131 + (i >> 11)); /* differs per piece */
	memset(got, 0xEE, size);
	memset(want, 0xEE, size);
	sv_copy(got + guard + c->dst_off, src + c->src_off, c->len);
	memcpy(want + guard + c->dst_off, src + c->src_off, c->len);
	cr_assert_eq(memcmp(got, want, size), 0, "len %zu, offsets %zu/%zu", c->len, c->src_off,
		     c->dst_off);
	free(src);
	free(got);
	free(want);
}
