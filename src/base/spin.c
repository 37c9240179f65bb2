/* The adaptive spin: see spin.h. */
#include "spin.h"

uint32_t sv_spin_budget(uint32_t avg_us, uint32_t max_us)
{
	if (!max_us)
		return 0;
	if (!avg_us)
		avg_us = max_us / 4;
	return avg_us <= max_us / 2 ? 2 * avg_us + 1 : max_us / SV_SPIN_PROBE_DIV;
}

uint32_t sv_spin_average(uint32_t avg_us, uint64_t sample_us, uint32_t max_us)
{
	uint64_t cap = 2 * (uint64_t)max_us;
	uint64_t v = sample_us < cap ? sample_us : cap;
	uint64_t avg = avg_us ? ((uint64_t)avg_us * 7 + v) / 8 : v;
	return avg ? (uint32_t)avg : 1;
}

uint32_t sv_spin_reader(uint32_t budget_us)
{
	return budget_us < SV_SPIN_READER_US ? budget_us : SV_SPIN_READER_US;
}
