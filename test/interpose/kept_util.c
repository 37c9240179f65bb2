/* What the tests of connections kept across a fork share (kept_util.h). */
#include "kept_util.h"

#include <criterion/criterion.h>
#include <sys/wait.h>

void kept_setup(void)
{
	h_setup();
	fake_net_fork_keeps(true);
}

void child_ok(pid_t pid)
{
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed check %d",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
}

/* Bytes both ways over the QP, every one of them. */
void exchange_on_rdma(struct pair *p, uint64_t seed)
{
	enum { LEN = 6000 };
	static uint8_t out[LEN], in[LEN];
	struct h_counts c0 = h_counts(p->c), s0 = h_counts(p->s);
	h_pattern(out, LEN, seed, 0);
	cr_assert_eq(ph_write_all(p->cfd, out, LEN), LEN);
	cr_assert_eq(ph_read_all(p->sfd, in, LEN), LEN);
	cr_assert(h_pattern_ok(in, LEN, seed, 0));
	cr_assert_eq(ph_write_all(p->sfd, out, LEN), LEN);
	cr_assert_eq(ph_read_all(p->cfd, in, LEN), LEN);
	cr_assert(h_pattern_ok(in, LEN, seed, 0));
	cr_assert_eq(h_counts(p->c).rdma_tx - c0.rdma_tx, LEN);
	cr_assert_eq(h_counts(p->s).rdma_tx - s0.rdma_tx, LEN);
}

