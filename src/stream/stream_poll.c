/* Readiness of a stream for poll(): each direction is judged by whoever
 * carries it. While a direction is on the QP, the kernel's TCP socket knows
 * nothing about it, so libsovia answers; otherwise the kernel does. */
#include "stream_int.h"

#include "readiness.h"
#include "real.h"

#include <poll.h>

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

/* Is the receive side answered by libsovia rather than the kernel? */
static bool rx_ours(const struct sv_stream *s)
{
	if (sv_stream_tcpbuf_held(s))
		return true;
	if (s->state == SV_CONN_RESUMING)
		return true; /* the QP's part, then the peer's record */
	if (s->proto && sv_proto_rx_on_qp(s->proto))
		return true; /* what the QP delivered, even after it broke */
	if (!s->proto || !sv_stream_may_switch(s))
		return false; /* TCP for good, or after the way back */
	/* During a switch the TCP socket may hold only the echo: our read
	 * decides what is data. */
	return sv_proto_rx_on_qp(s->proto) || sv_proto_peer_switch(s->proto, NULL) ||
	       s->sw.chal_len;
}

static bool tx_ours(const struct sv_stream *s)
{
	if (s->state == SV_CONN_DETACHING || s->state == SV_CONN_RESUMING)
		return true; /* writable once the bytes given back (or resent) are out */
	if (sv_stream_holding_first(s) && s->hold.refused)
		return true; /* writable once the QP or the hold's end says so */
	return s->proto && sv_stream_may_switch(s) && sv_proto_tx_state(s->proto) != SV_TX_TCP;
}

static short rx_ready(const struct sv_stream *s, short rx)
{
	struct sv_proto *p = s->proto;
	bool data = sv_stream_tcpbuf_held(s) || (p && sv_proto_readable(p) > 0);
	bool eof = p && sv_proto_rx_eof(p);
	bool switched = p && !sv_proto_rx_on_qp(p) && !sv_proto_peer_switch(p, NULL) &&
			sv_stream_resume_heard(s);
	short rev = 0;
	if (data || eof || switched)
		rev |= rx & (POLLIN | POLLRDNORM);
	if (eof)
		rev |= rx & POLLRDHUP;
	if (eof && s->cl.tx_shut)
		rev |= POLLHUP;
	return rev;
}

static bool tx_ready(const struct sv_stream *s)
{
	if (sv_stream_holding_first(s))
		return false; /* a write was refused: tx_ours */
	struct sv_proto *p = s->proto;
	enum sv_tx_state t = sv_proto_tx_state(p);
	bool room = t == SV_TX_OPEN && !s->sw.tx_held && sv_proto_writable(p);
	return room || t == SV_TX_FIN || t == SV_TX_RESET;
}

void sv_stream_poll_split(struct sv_stream *s, short events, short *own, short *kernel,
			  uint64_t *gen)
{
	sv_stream_app_uses(s);
	sv_lock(&s->lock);
	s->wt.app_calls++;
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->proto && !s->error)
		sv_stream_progress(s, &clk, 0);
	/* A hold whose time is up ends here too: the helper may still be
	 * starting rdma_cm. */
	sv_stream_hold_due(s, &clk);
	short rx = events & (POLLIN | POLLRDNORM | POLLRDHUP | POLLPRI);
	short tx = events & (POLLOUT | POLLWRNORM);
	short mine = 0, rev = 0;
	if (s->error) {
		mine = events;
		rev = POLLERR | POLLHUP | (rx & ~POLLPRI) | tx;
	} else {
		if (rx_ours(s)) {
			mine |= rx;
			rev |= rx_ready(s, rx);
		}
		if (tx_ours(s)) {
			mine |= tx;
			if (s->state != SV_CONN_DETACHING && s->state != SV_CONN_RESUMING &&
			    tx_ready(s))
				rev |= tx;
		}
	}
	*own = rev;
	*kernel = (short)(events & ~mine);
	*gen = s->wt.wake_gen;
	sv_stream_note_kernel_only(s);
	sv_unlock(&s->lock);
}

void sv_stream_poll_waits(struct sv_stream *s)
{
	sv_lock(&s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->proto && !s->error && sv_proto_tx_pending(s->proto))
		sv_proto_flush(s->proto, SV_FLUSH_RECV, &clk);
	sv_unlock(&s->lock);
}

short sv_stream_poll_recheck(struct sv_stream *s, short events, short rev)
{
	short own, kernel;
	uint64_t gen;
	sv_stream_poll_split(s, events, &own, &kernel, &gen);
	short rx = events & (POLLIN | POLLRDNORM | POLLRDHUP | POLLPRI);
	if (!(kernel & (POLLIN | POLLRDNORM)))
		rev = (short)((rev & ~rx) | (own & rx)); /* libsovia answers for reading now */
	return rev;
}

/* Arm and look once more (a completion before the arming would not wake
 * the sleep); *again when the stream changed since `gen`. The TCP events
 * that may also change it (a pending switch still reads TCP: its bytes up
 * to the switch point, then the echo). Under the lock. */
static short arm_locked(struct sv_stream *s, bool *again, uint64_t gen)
{
	s->wt.app_calls++;
	/* Changed since sv_stream_poll_split judged it (another thread, the
	 * helper): its wake-up came before we watched. Judge again. */
	if (s->wt.wake_gen != gen)
		*again = true;
	if (s->qp && !s->error) {
		struct sv_clock clk = SV_CLOCK_INIT;
		sv_qp_arm(s->qp);
		if (sv_stream_poll_cq(s, &clk) != 0)
			*again = true;
	}
	if (s->proto && !sv_proto_rx_on_qp(s->proto) &&
	    (sv_proto_peer_switch(s->proto, NULL) || s->sw.chal_len))
		return POLLIN;
	/* Before a sleep: has the peer lost its QP and resumed (its record
	 * waits on TCP)? From then on TCP is watched for it. */
	enum sv_conn_state was = s->state;
	sv_stream_resume_peek(s);
	if (s->state != was)
		*again = true;
	return sv_stream_resume_events(s);
}

int sv_stream_poll_sources(struct sv_stream *s, struct sv_hub_watch *w, struct pollfd *out,
			   bool *again, uint64_t gen)
{
	sv_lock(&s->lock);
	/* Attached before the arming: a completion after it fires the node. */
	sv_hub_attach(&s->wt.node, w);
	short tcp = arm_locked(s, again, gen);
	s->wt.waiters++;
	sv_unlock(&s->lock);
	if (!tcp)
		return 0;
	out[0] = (struct pollfd){.fd = s->fd, .events = tcp};
	return 1;
}

bool sv_stream_poll_arm(struct sv_stream *s, uint64_t gen, short *tcp_events)
{
	bool again = false;
	sv_lock(&s->lock);
	*tcp_events = arm_locked(s, &again, gen);
	sv_unlock(&s->lock);
	return again;
}

void sv_stream_poll_done(struct sv_stream *s, struct sv_hub_watch *w)
{
	sv_hub_detach(w);
	sv_lock(&s->lock);
	s->wt.waiters--;
	sv_unlock(&s->lock);
}

void sv_stream_marks(struct sv_stream *s, struct sv_marks *m)
{
	sv_lock(&s->lock);
	/* Any message, TCP bytes read, wake-up or state change moves it. */
	m->activity = s->wt.wake_gen + s->tcp_rx + (s->error != 0) + (uint64_t)s->state +
		      (s->proto ? sv_proto_stats(s->proto)->rx_msgs : 0);
	sv_unlock(&s->lock);
	m->rx_eagain = atomic_load_explicit(&s->wt.rx_eagain, memory_order_relaxed);
	m->tx_eagain = atomic_load_explicit(&s->wt.tx_eagain, memory_order_relaxed);
}

bool sv_stream_kernel_only(struct sv_stream *s)
{
	sv_lock(&s->lock);
	bool r = sv_stream_tcp_for_good(s) && !sv_stream_tcpbuf_held(s);
	sv_stream_note_kernel_only(s);
	sv_unlock(&s->lock);
	return r;
}
