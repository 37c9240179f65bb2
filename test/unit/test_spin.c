/* The adaptive spin (src/spin.c): how long a wait polls before it sleeps,
 * from the stream's recent waits. */
#include "spin.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdbool.h>

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

/* A reader (nothing written since its last read) spins at most
 * SV_SPIN_READER_US, whatever its average allows; a shorter budget stays. */
Test(spin, a_reader_spins_at_most_the_reader_cap)
{
	cr_assert_eq(sv_spin_reader(sv_spin_budget(300, 4000)), SV_SPIN_READER_US);
	cr_assert_eq(sv_spin_reader(sv_spin_budget(2, 4000)), 5);
	cr_assert_eq(sv_spin_reader(0), 0, "SOVIA_SPIN_US=0 still never spins");
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

/* A wait as it goes: the reply comes after reply_us; a spin that covers it
 * catches it, otherwise the wait sleeps and also pays the wake-up. */
static uint64_t one_wait(uint32_t budget, uint32_t reply_us, uint32_t wake_us)
{
	return budget >= reply_us ? reply_us : (uint64_t)reply_us + wake_us;
}

struct recover_case {
	uint32_t max, reply, wake;
	bool recovers;
};

ParameterizedTestParameters(spin, recovers_when_the_probe_covers_the_reply)
{
	static struct recover_case cases[] = {
		/* The default bound: its 250 us probe covers a small message's
		 * round trip, however slow a sleep is. */
		{4000, 130, 3500, true},
		{4000, 250, 3500, true},
		/* A reply too slow for the probe recovers only when sleeping
		 * is cheap: 16 KiB on the bed, cheap and dear wake-ups. */
		{4000, 1100, 300, true},
		{4000, 1100, 3500, false},
		/* The old 1 ms bound: a 62 us probe, shorter than the 130 us
		 * reply; the slow wake-ups measured on the bed kept it there. */
		{1000, 130, 3500, false},
		{1000, 130, 200, true},
	};
	return cr_make_param_array(struct recover_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* A ping-pong whose spin average was pushed up (a long first wait, a
 * scheduling hiccup): does it get back to catching every reply in its
 * spin within 32 waits? */
ParameterizedTest(struct recover_case *c, spin, recovers_when_the_probe_covers_the_reply)
{
	uint32_t avg = sv_spin_average(0, 60000000, c->max);
	bool spinning = false;
	for (int i = 0; i < 32 && !spinning; i++) {
		uint32_t budget = sv_spin_budget(avg, c->max);
		spinning = budget >= c->reply;
		avg = sv_spin_average(avg, one_wait(budget, c->reply, c->wake), c->max);
	}
	cr_assert_eq(spinning, c->recovers, "bound %u, reply %u us, wake-up %u us", c->max,
		     c->reply, c->wake);
	if (!spinning)
		return;
	for (int i = 0; i < 100; i++) {
		uint32_t budget = sv_spin_budget(avg, c->max);
		cr_assert_geq(budget, c->reply, "fell back to sleeping after %d waits", i);
		avg = sv_spin_average(avg, one_wait(budget, c->reply, c->wake), c->max);
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
