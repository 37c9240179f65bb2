/* The locked-memory budget (src/pinned.c): takes within the budget, growth
 * that keeps a quarter free, and the room hook that tells the connections
 * waiting for room when some is given back. */
#include "pinned.h"

#include <criterion/criterion.h>
#include <errno.h>

static unsigned hook_calls;

static void hook(void)
{
	hook_calls++;
}

static void setup(void)
{
	sv_pinned_set_budget(100 * 4096);
	hook_calls = 0;
	sv_pinned_on_room(hook);
}

static void teardown(void)
{
	sv_pinned_on_room(NULL);
	sv_pinned_give(sv_pinned_taken());
}

TestSuite(pinned, .init = setup, .fini = teardown, .timeout = 10);

Test(pinned, takes_within_the_budget)
{
	cr_assert_eq(sv_pinned_take(60 * 4096), 0);
	cr_assert_eq(sv_pinned_take(40 * 4096), 0);
	cr_assert_eq(sv_pinned_taken(), 100 * 4096);
	cr_assert_eq(sv_pinned_take(1), -ENOBUFS);
	cr_assert_eq(sv_pinned_taken(), 100 * 4096, "a refused take takes nothing");
}

Test(pinned, growth_leaves_a_quarter_free)
{
	cr_assert_eq(sv_pinned_take_growth(75 * 4096), 0);
	cr_assert_eq(sv_pinned_take_growth(1), -ENOBUFS);
	cr_assert_eq(sv_pinned_take(25 * 4096), 0, "connections may take the last quarter");
	cr_assert_eq(hook_calls, 0);
}

Test(pinned, a_give_back_after_a_refusal_calls_the_hook_once)
{
	cr_assert_eq(sv_pinned_take(100 * 4096), 0);
	sv_pinned_give(4096);
	cr_assert_eq(hook_calls, 0, "a take that fitted asked for nothing");
	cr_assert_eq(sv_pinned_take(2 * 4096), -ENOBUFS);
	sv_pinned_give(4096);
	cr_assert_eq(hook_calls, 1, "the refused take asked for room");
	sv_pinned_give(4096);
	cr_assert_eq(hook_calls, 1, "nobody asked since");
	cr_assert_eq(sv_pinned_take(2 * 4096), 0, "room now");
	sv_pinned_give(0);
	cr_assert_eq(hook_calls, 1, "giving nothing wakes nobody");
}

Test(pinned, what_could_never_fit)
{
	cr_assert(sv_pinned_fits_ever(100 * 4096));
	cr_assert_not(sv_pinned_fits_ever(100 * 4096 + 1));
}
