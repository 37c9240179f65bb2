/* The protocol core's acknowledgments (delayed and piggybacked ACKs,
 * docs/protocol.md section 6) and its timers. */
#include "proto.h"
#include "proto_int.h"

#include <errno.h>

static int send_update(struct sv_proto *p)
{
	int r = sv_pr_rx_release(p);
	if (r < 0)
		return r;
	if (!p->unreported)
		return 0;
	r = sv_pr_send_control(p, SV_MSG_UPDATE, p->snd_nxt, 1);
	if (r == 0)
		p->st.updates_sent++;
	return r == -EAGAIN ? 0 : r;
}

/* A clock reading starts the delayed-ACK timer armed without one. */
static void ack_clock(struct sv_proto *p, uint64_t now)
{
	if (!p->ack_lazy_us)
		return;
	uint64_t d = now + p->ack_lazy_us;
	if (!p->ack_deadline || d < p->ack_deadline)
		p->ack_deadline = d;
	p->ack_lazy_us = 0;
}

bool sv_proto_ack_armed(const struct sv_proto *p)
{
	return p->ack_deadline || p->ack_lazy_us;
}

/* Decide whether our reposted buffers must be reported now. */
int sv_pr_ack_policy(struct sv_proto *p, struct sv_clock *clk)
{
	if (p->error || (!p->unreported && p->rx_held < 0))
		return 0;
	uint32_t freed = p->unreported + (p->rx_held >= 0); /* send_update reposts the held one */
	bool now_due = p->unreported_data >= p->prm.ack_delay ||
		       (p->peer_credits <= p->prm.reserve && freed >= 2);
	if (now_due) {
		int r = send_update(p);
		if (r < 0)
			return r;
	}
	/* Not sent (not due, or no credit or buffer free): the timer makes
	 * sure consumed data is reported. Its delay is ack_timeout_us once a
	 * small message is among it (its sender's coalescing may wait for the
	 * acknowledgment); for bulk DATA alone, SV_ACK_BULK_FACTOR times that:
	 * rules 1 and 3 report bulk data, and a short timer would fire after
	 * nearly every bulk message (docs/protocol.md, section 6).
	 *
	 * Without a clock reading (a read that found its data at once) the
	 * timer is armed lazily: its delay waits for the next reading, taken
	 * anyway before anything sleeps (sv_proto_next_deadline) or at the
	 * next timer check. A ping-pong's reply carries the ACK before that,
	 * so its read reads no clock. */
	uint64_t t = p->prm.ack_timeout_us;
	uint64_t delay;
	if (p->unreported_small > 0)
		delay = t;
	else if (p->unreported_data > 0 && !sv_proto_ack_armed(p))
		delay = SV_ACK_BULK_FACTOR * t;
	else
		return 0;
	if (!sv_clock_known(clk)) {
		if (!p->ack_lazy_us || delay < p->ack_lazy_us)
			p->ack_lazy_us = delay;
		return 0;
	}
	uint64_t now = clk->us;
	ack_clock(p, now);
	if (!p->ack_deadline || p->ack_deadline > now + delay)
		p->ack_deadline = now + delay;
	return 0;
}

/* The earlier of two deadlines (0: none). */
static uint64_t earlier(uint64_t a, uint64_t b)
{
	return b && (!a || b < a) ? b : a;
}

uint64_t sv_proto_next_deadline(struct sv_proto *p, struct sv_clock *clk)
{
	/* A broken core fires no timer (sv_proto_timers): a deadline it
	 * still had would have its caller wake for nothing, over and over. */
	if (p->error)
		return 0;
	if (p->ack_lazy_us)
		ack_clock(p, sv_clock_now(clk));
	if (p->idle_lazy)
		sv_pr_idle_timer(p, sv_clock_now(clk)); /* only starts it */
	return earlier(earlier(p->ack_deadline, sv_proto_flush_deadline(p)), p->idle_deadline);
}

uint64_t sv_proto_flush_deadline(const struct sv_proto *p)
{
	return p->pending_slot >= 0 ? p->pending_deadline : 0;
}

uint64_t sv_proto_timers(struct sv_proto *p, struct sv_clock *clk)
{
	if (p->error || sv_pr_rx_release(p) < 0)
		return 0;
	if (!sv_proto_ack_armed(p) && p->pending_slot < 0 && !p->idle_deadline && !p->idle_lazy &&
	    !sv_clock_known(clk))
		return 0; /* no timer armed: no clock needed */
	uint64_t now = sv_clock_now(clk);
	ack_clock(p, now);
	if (sv_pr_idle_timer(p, now) < 0)
		return 0;
	if (p->ack_deadline && now >= p->ack_deadline) {
		p->ack_deadline = 0;
		if (p->unreported_data > 0 && send_update(p) < 0)
			return 0;
		if (p->unreported_data > 0) /* no credit or buffer: try again later */
			p->ack_deadline = now + p->prm.ack_timeout_us;
	}
	if (p->pending_slot >= 0 && now >= p->pending_deadline) {
		if (sv_pr_flush_pending(p, SV_FLUSH_TIMER) == -EAGAIN)
			p->pending_deadline = now + p->prm.coalesce_timeout_us;
	}
	if (sv_pr_fin_if_wanted(p, clk) < 0)
		return 0;
	return sv_proto_next_deadline(p, clk);
}
