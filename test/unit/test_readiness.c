/* epoll's level, edge and one-shot rules over libsovia's own readiness
 * (src/readiness.c): what is reported, when it is reported again, and
 * what a wait watches. */
#include "readiness.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <sys/epoll.h>

static struct sv_ep_rule r;
static struct sv_marks m;

static void setup(void)
{
	r = (struct sv_ep_rule){0};
	m = (struct sv_marks){0};
}

TestSuite(readiness, .init = setup, .timeout = 10);

static uint32_t report(uint32_t ready)
{
	return sv_ep_rule_report(&r, ready, &m);
}

Test(readiness, level_reports_what_is_ready_every_time)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLOUT);
	cr_assert_eq(report(EPOLLIN), EPOLLIN);
	cr_assert_eq(report(EPOLLIN), EPOLLIN, "level-triggered: again while still ready");
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN | EPOLLOUT);
	cr_assert_eq(report(0), 0);
	cr_assert_eq(sv_ep_rule_watch(&r, &m), EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP);
}

Test(readiness, unasked_bits_are_not_reported_but_errors_always_are)
{
	sv_ep_rule_set(&r, EPOLLIN);
	cr_assert_eq(report(EPOLLOUT), 0, "EPOLLOUT was not asked for");
	cr_assert_eq(report(EPOLLRDHUP | EPOLLIN), EPOLLIN, "EPOLLRDHUP only when asked");
	cr_assert_eq(report(EPOLLERR | EPOLLOUT), EPOLLERR);
	cr_assert_eq(report(EPOLLHUP), EPOLLHUP);
	sv_ep_rule_set(&r, EPOLLIN | EPOLLRDHUP);
	cr_assert_eq(report(EPOLLRDHUP | EPOLLIN), EPOLLRDHUP | EPOLLIN);
}

Test(readiness, flags_are_never_reported)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE);
	cr_assert_eq(report(EPOLLIN) & (EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE), 0);
	cr_assert_eq(sv_ep_rule_watch(&r, &m) & ~(uint32_t)(EPOLLERR | EPOLLHUP), 0,
		     "one-shot fired: nothing to watch");
}

Test(readiness, edge_reports_once_until_something_moves)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLOUT | EPOLLET);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN | EPOLLOUT);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), 0, "no new edge");
	cr_assert_eq(sv_ep_rule_watch(&r, &m), EPOLLERR | EPOLLHUP,
		     "a wait must not watch bits that stay reported");
	m.activity++;
	cr_assert_eq(sv_ep_rule_watch(&r, &m), EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN | EPOLLOUT,
		     "an arrival re-arms everything, as the kernel's wake-up does");
	cr_assert_eq(report(EPOLLIN), 0);
}

Test(readiness, edge_receive_eagain_rearms_only_input)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN | EPOLLOUT);
	m.rx_eagain++;
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), 0);
}

Test(readiness, edge_send_eagain_rearms_only_output)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLOUT | EPOLLET);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN | EPOLLOUT);
	m.tx_eagain++;
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLOUT);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), 0);
}

Test(readiness, edge_bits_not_ready_at_the_report_stay_armed)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLOUT | EPOLLET);
	cr_assert_eq(report(EPOLLOUT), EPOLLOUT);
	cr_assert_eq(report(EPOLLIN | EPOLLOUT), EPOLLIN, "EPOLLIN's first edge");
}

Test(readiness, edge_hangup_is_not_watched_again_until_activity)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLET);
	cr_assert_eq(report(EPOLLIN | EPOLLHUP), EPOLLIN | EPOLLHUP);
	cr_assert_eq(sv_ep_rule_watch(&r, &m), 0,
		     "a hang-up the kernel's poll keeps reporting must not spin the wait");
	m.rx_eagain++;
	cr_assert_eq(sv_ep_rule_watch(&r, &m), 0, "EAGAIN re-arms input, not the hang-up");
	m.activity++;
	cr_assert_neq(sv_ep_rule_watch(&r, &m), 0);
}

Test(readiness, oneshot_disables_until_modified)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLONESHOT);
	cr_assert_eq(report(EPOLLIN), EPOLLIN);
	cr_assert_eq(report(EPOLLIN), 0);
	m.activity++;
	cr_assert_eq(report(EPOLLIN | EPOLLERR), 0, "disabled: not even errors");
	cr_assert_eq(sv_ep_rule_watch(&r, &m), 0);
	sv_ep_rule_set(&r, EPOLLIN | EPOLLONESHOT); /* EPOLL_CTL_MOD */
	cr_assert_eq(report(EPOLLIN), EPOLLIN);
}

Test(readiness, oneshot_with_edge)
{
	sv_ep_rule_set(&r, EPOLLIN | EPOLLET | EPOLLONESHOT);
	cr_assert_eq(report(0), 0, "nothing ready: still armed");
	cr_assert_eq(report(EPOLLIN), EPOLLIN);
	m.activity++;
	cr_assert_eq(report(EPOLLIN), 0);
	sv_ep_rule_set(&r, EPOLLIN | EPOLLET | EPOLLONESHOT);
	cr_assert_eq(report(EPOLLIN), EPOLLIN, "MOD re-arms even without a new edge");
}

/* An edge-triggered entry through a series of marks and readiness. */
struct et_step {
	uint32_t events;  /* set once, at the first step */
	uint64_t act, rxe, txe;
	uint32_t ready;
	uint32_t want;    /* reported */
};

static const struct et_step steps[] = {
	/* a reader that drains until EAGAIN */
	{EPOLLIN | EPOLLET, 0, 0, 0, EPOLLIN, EPOLLIN},
	{0, 0, 1, 0, 0, 0},                         /* drained: EAGAIN, nothing ready */
	{0, 1, 1, 0, EPOLLIN, EPOLLIN},             /* new data */
	{0, 1, 1, 0, EPOLLIN, 0},                   /* no new edge */
	{0, 1, 2, 0, EPOLLIN, EPOLLIN},             /* EAGAIN seen, then data again */
	{0, 2, 2, 0, EPOLLIN | EPOLLRDHUP, EPOLLIN},/* RDHUP not asked for */
	{0, 2, 2, 0, EPOLLIN | EPOLLERR, EPOLLERR}, /* a reset: a new edge */
	{0, 2, 2, 0, EPOLLIN | EPOLLERR, 0},
};
#define NSTEPS (sizeof(steps) / sizeof(steps[0]))

ParameterizedTestParameters(readiness, edge_sequences)
{
	static int idx[NSTEPS];
	for (size_t i = 0; i < NSTEPS; i++)
		idx[i] = (int)i;
	return cr_make_param_array(int, idx, NSTEPS);
}

/* Each parameter is one step of the same sequence: replay up to it. */
ParameterizedTest(int *last, readiness, edge_sequences)
{
	sv_ep_rule_set(&r, steps[0].events);
	for (int i = 0; i <= *last; i++) {
		const struct et_step *s = &steps[i];
		m = (struct sv_marks){s->act, s->rxe, s->txe};
		uint32_t got = report(s->ready);
		if (i == *last)
			cr_assert_eq(got, s->want, "step %d: ready %#x: got %#x, want %#x", i,
				     s->ready, got, s->want);
	}
}
