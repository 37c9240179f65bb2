/* The adaptive spin (src/spin.c): how long a wait polls before it sleeps,
 * from the stream's recent waits. */
#include "spin.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

TestSuite(spin, .timeout = 10);

struct budget_case {
	uint32_t avg, max, want;
};

ParameterizedTestParameters(spin, budget)
{
	static struct budget_case cases[] = {
		{0, 0, 0},        /* SOVIA_SPIN_US=0: never */
		{300, 0, 0},      /* never, whatever was seen */
		{0, 1000, 501},   /* nothing seen: from a quarter of the bound */
		{1, 1000, 3},     /* quick replies: twice the average */
		{300, 1000, 601}, /* a ping-pong under emulation */
		{500, 1000, 1001},
		{501, 1000, 62},  /* does not fit: the probe, 1/16 of the bound */
		{2000, 1000, 62}, /* an idle peer */
		{5, 50, 11},
		{26, 50, 3},
	};
	return cr_make_param_array(struct budget_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct budget_case *c, spin, budget)
{
	cr_assert_eq(sv_spin_budget(c->avg, c->max), c->want, "avg %u, bound %u", c->avg, c->max);
}

Test(spin, first_wait_sets_the_average_and_it_is_never_zero)
{
	cr_assert_eq(sv_spin_average(0, 300, 1000), 300);
	cr_assert_eq(sv_spin_average(0, 0, 1000), 1, "0 would mean: nothing seen");
	cr_assert_eq(sv_spin_average(1, 0, 1000), 1);
}

Test(spin, moving_average_weighs_the_new_wait_one_eighth)
{
	cr_assert_eq(sv_spin_average(800, 0, 1000), 700);
	cr_assert_eq(sv_spin_average(800, 1600, 1000), 900);
}

Test(spin, a_long_wait_counts_as_twice_the_bound)
{
	cr_assert_eq(sv_spin_average(0, 60000000, 1000), 2000);
	cr_assert_eq(sv_spin_average(2000, 60000000, 1000), 2000);
}

/* A server waits seconds for its first client, then runs a ping-pong whose
 * replies take 300 us: it spins again within 16 waits, and from then
 * on every reply comes within the spin. */
Test(spin, ping_pong_after_idle_gets_its_spin_back)
{
	uint32_t avg = sv_spin_average(0, 5000000, 1000);
	cr_assert_eq(sv_spin_budget(avg, 1000), 1000 / SV_SPIN_PROBE_DIV, "idle: the probe");
	int waits = 0;
	while (sv_spin_budget(avg, 1000) < 300) {
		avg = sv_spin_average(avg, 300, 1000);
		cr_assert_leq(++waits, 16, "still only probing after %d waits", waits);
	}
	for (int i = 0; i < 100; i++) {
		cr_assert_geq(sv_spin_budget(avg, 1000), 300);
		avg = sv_spin_average(avg, 300, 1000);
	}
}

/* A reader whose data comes every 2 ms (a slow stream) settles on the
 * probe: it does not burn the bound on every wait. */
Test(spin, slow_stream_settles_on_the_probe)
{
	uint32_t avg = 0;
	for (int i = 0; i < 20; i++)
		avg = sv_spin_average(avg, 2000, 1000);
	cr_assert_eq(sv_spin_budget(avg, 1000), 1000 / SV_SPIN_PROBE_DIV);
}
