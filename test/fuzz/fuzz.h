/* The entry point every fuzz target defines: libFuzzer's, which
 * test/fuzz/driver.c calls too where the compiler has no libFuzzer. One
 * input per call; the target returns 0 and aborts on a broken invariant. */
#ifndef SV_FUZZ_H
#define SV_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
