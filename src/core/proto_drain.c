/* The protocol core's giving back of grown buffers (docs/protocol.md, 5,
 * "Buffers that grow"): a sending direction that went idle spends the
 * peer's large receive buffers with DRAIN messages, the peer posts its
 * buffers at the set-up size again and frees the large ones once none is
 * posted, and the sender's own send buffers follow.
 *
 * Posted receive buffers cannot be taken back on an RC queue pair: only a
 * message consumes one. So the one who holds the credits for them, the
 * sender, gives them back, and it does when it knows it has nothing to
 * send: when its direction was idle for idle_us. */
#include "proto.h"
#include "proto_int.h"

#include <errno.h>
#include <string.h>

/* Do we hold a credit for one of the peer's buffers larger than cap? */
static bool holds_above(const struct sv_proto *p, uint32_t cap)
{
	for (uint32_t i = 0; i < p->run_count; i++) {
		const struct sv_credit_run *r = &p->runs[(p->run_head + i) % SV_RUNS];
		if (r->n && r->cap > cap)
			return true;
	}
	return false;
}

/* ... for one of its grown buffers (larger than at its set-up)? */
static bool holds_large(const struct sv_proto *p)
{
	return holds_above(p, p->peer_start_cap);
}

/* The QP may carry a DRAIN of ours: not broken or ended, not after our
 * BACK (only RETURN and UPDATE follow it). */
static bool may_drain(const struct sv_proto *p)
{
	return !p->error && !p->qp_ended && !p->back_sent && p->tx_state != SV_TX_RESET;
}

/* Is the drain over: every old credit spent (SV_DRAIN_OLD)? */
static bool drain_over(const struct sv_proto *p)
{
	return p->drain == SV_DRAIN_OLD && p->drain_left == 0;
}

int sv_pr_drain(struct sv_proto *p)
{
	while (p->drain != SV_DRAIN_NONE && !p->error) {
		if (drain_over(p)) {
			p->drain = SV_DRAIN_NONE;
			p->tx_shrink_wanted = p->st.tx_grown && p->start_max < p->payload_max;
			sv_pr_tx_shrink_if_due(p);
			if (holds_large(p))
				sv_pr_idle_arm(p); /* the peer grew again meanwhile */
			return 0;
		}
		/* Before the peer's first smaller report every large credit is
		 * an old buffer (it grows again only once all of those are
		 * consumed and reported small): none held, its next report
		 * says more. */
		if (p->drain == SV_DRAIN_ASKED && !holds_large(p))
			return 0;
		/* As DATA, a DRAIN leaves the reserve to the control messages. */
		if (!may_drain(p))
			return 0;
		int r = sv_pr_send_control(p, SV_MSG_DRAIN, p->snd_nxt, p->prm.reserve + 1);
		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		p->st.drains_sent++;
	}
	return 0;
}

int sv_pr_peer_shrank(struct sv_proto *p, uint32_t cap)
{
	/* Only a DRAIN lets the peer post smaller buffers, and only back to
	 * its set-up's size (sv_pr_wait_cap counts on that minimum). */
	if (p->drain != SV_DRAIN_ASKED || cap != p->peer_start_cap)
		return sv_pr_malformed(p);
	/* What we hold now was posted before the switch: spend it all (a
	 * few may be small buffers from before the growth; spending those
	 * costs a message each and nothing else). */
	p->drain = SV_DRAIN_OLD;
	p->drain_left = p->credits;
	return 0;
}

int sv_pr_on_drain(struct sv_proto *p, uint32_t buf)
{
	if (p->st.rx_grown && p->start_max < p->payload_max && !p->error) {
		p->rx_shrink_wanted = true;
		p->rx_grow_wanted = false;
		/* Switch before this buffer is reposted, if nothing posted
		 * earlier waits to be reported: then it goes back small. */
		sv_pr_rx_grow_if_due(p);
	}
	return sv_pr_repost_control(p, buf);
}

void sv_pr_tx_shrink_if_due(struct sv_proto *p)
{
	if (!p->tx_shrink_wanted || p->nfree < sv_proto_nsend(&p->prm))
		return;
	p->tx_shrink_wanted = false;
	/* The peer's buffers are larger than our start size again (it grew
	 * before we got to it): keep them. */
	if (!p->st.tx_grown || holds_above(p, p->start_max))
		return;
	p->xp.ops->shrink(p->xp.ctx, false);
	memset(p->slot_big, 0, sv_proto_nsend(&p->prm));
	p->st.tx_grown = false;
	p->tx_grow_tried = false; /* the peer's next growth may take us along again */
	p->st.tx_shrinks++;
}

/* What moves while our sending is not idle: DATA sent, and writes that
 * found no credit. */
static uint64_t idle_count(const struct sv_proto *p)
{
	return p->st.tx_data_msgs + p->st.credit_stalls;
}

void sv_pr_idle_arm(struct sv_proto *p)
{
	if (!p->prm.idle_us || p->drain != SV_DRAIN_NONE || p->idle_deadline || p->idle_lazy)
		return;
	p->idle_lazy = true; /* the next clock reading starts it */
}

int sv_pr_idle_timer(struct sv_proto *p, uint64_t now)
{
	if (p->idle_lazy) {
		p->idle_lazy = false;
		p->idle_mark = idle_count(p);
		p->idle_deadline = now + p->prm.idle_us;
		return 0;
	}
	if (!p->idle_deadline || now < p->idle_deadline)
		return 0;
	p->idle_deadline = 0;
	/* Spent already (the peer's next large report arms it again), or
	 * the QP carries nothing of ours any more. */
	if (!holds_large(p) || !may_drain(p))
		return 0;
	/* Idle: no DATA since the last look and no write that found the
	 * window closed, the window open now (a writer waiting for credits is
	 * not idle, and the DRAINs would take them first), nothing waiting or
	 * in flight. Counting costs the data path nothing; a busy direction
	 * is looked at once per idle_us. */
	bool idle = idle_count(p) == p->idle_mark && p->pending_slot < 0 && sv_pr_tx_idle(p) &&
		    sv_pr_can_send_data(p);
	if (!idle) {
		p->idle_mark = idle_count(p);
		p->idle_deadline = now + p->prm.idle_us;
		return 0;
	}
	p->drain = SV_DRAIN_ASKED;
	return sv_pr_drain(p);
}
