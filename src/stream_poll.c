/* Readiness of a stream for poll(): each direction is judged by whoever
 * carries it. While a direction is on the QP, the kernel's TCP socket knows
 * nothing about it, so libsovia answers; otherwise the kernel does. */
#include "real.h"
#include "stream_int.h"

#include "readiness.h"
#include "verbs.h"

#include <poll.h>
#include <unistd.h>

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

/* Is the receive side answered by libsovia rather than the kernel? */
static bool rx_ours(const struct sv_stream *s)
{
	if (s->tcpbuf_len > s->tcpbuf_off)
		return true;
	if (!s->proto_ready || !sv_stream_may_switch(s))
		return false; /* TCP for good, or after the way back */
	/* During a switch the TCP socket may hold only the echo: our read
	 * decides what is data. */
	return s->proto.rx_on_qp || s->proto.peer_to_rdma || s->chal_len;
}

static bool tx_ours(const struct sv_stream *s)
{
	if (s->state == SV_CONN_DETACHING)
		return true; /* writable once the bytes given back are out */
	return s->proto_ready && sv_stream_may_switch(s) && s->proto.tx_state != SV_TX_TCP;
}

void sv_stream_poll_split(struct sv_stream *s, short events, short *own, short *kernel,
			  uint64_t *gen)
{
	pthread_mutex_lock(&s->lock);
	s->app_calls++;
	if (s->proto_ready && !s->error)
		sv_stream_progress(s);
	short rx = events & (POLLIN | POLLRDNORM | POLLRDHUP | POLLPRI);
	short tx = events & (POLLOUT | POLLWRNORM);
	short mine = 0, rev = 0;
	if (s->error) {
		mine = events;
		rev = POLLERR | POLLHUP | (rx & ~POLLPRI) | tx;
	} else {
		if (rx_ours(s)) {
			mine |= rx;
			struct sv_proto *p = &s->proto;
			bool data = s->tcpbuf_len > s->tcpbuf_off ||
				    (s->proto_ready && sv_proto_readable(p) > 0);
			bool eof = s->proto_ready && p->rx_fin && p->rcv_read == p->rx_fin_seq;
			bool switched = s->proto_ready && !p->rx_on_qp && !p->peer_to_rdma;
			if (data || eof || switched)
				rev |= rx & (POLLIN | POLLRDNORM);
			if (eof)
				rev |= rx & POLLRDHUP;
			if (eof && s->tx_shut)
				rev |= POLLHUP;
		}
		if (tx_ours(s)) {
			mine |= tx;
			struct sv_proto *p = &s->proto;
			bool room = p->tx_state == SV_TX_OPEN && !s->tx_held &&
				    ((p->credits > p->prm.reserve && p->nfree > 0) ||
				     (p->pending_slot >= 0 && p->pending_len < p->tx_payload_max));
			bool closed = p->tx_state == SV_TX_FIN || p->tx_state == SV_TX_RESET;
			if (room || closed)
				rev |= tx;
		}
	}
	*own = rev;
	*kernel = (short)(events & ~mine);
	*gen = s->wake_gen;
	pthread_mutex_unlock(&s->lock);
}

void sv_stream_poll_waits(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->proto_ready && !s->error && s->proto.pending_slot >= 0)
		sv_proto_flush(&s->proto, SV_FLUSH_RECV, sv_now_us());
	pthread_mutex_unlock(&s->lock);
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

int sv_stream_poll_sources(struct sv_stream *s, struct pollfd *out, bool *again, uint64_t gen)
{
	int n = 0;
	pthread_mutex_lock(&s->lock);
	s->app_calls++;
	/* Changed since sv_stream_poll_split judged it (another thread, the
	 * helper): its wake-up came before we were a waiter. Judge again. */
	if (s->wake_gen != gen)
		*again = true;
	if (s->verbs && !s->error) {
		/* Arm, then look once more: a completion before the arming
		 * would not wake the sleep. */
		sv_verbs_arm(s->verbs);
		int r = sv_verbs_poll(s->verbs, &s->proto, sv_now_us());
		if (r < 0)
			sv_stream_break(s, r);
		if (r != 0)
			*again = true;
		out[n++] = (struct pollfd){.fd = sv_verbs_fd(s->verbs), .events = POLLIN};
	}
	out[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
	/* A pending switch still reads TCP (its bytes up to the switch point,
	 * then the echo): TCP's readiness may change what we answer. */
	if (s->proto_ready && !s->proto.rx_on_qp && (s->proto.peer_to_rdma || s->chal_len))
		out[n++] = (struct pollfd){.fd = s->fd, .events = POLLIN};
	s->waiters++;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void sv_stream_poll_done(struct sv_stream *s, const struct pollfd *src, int n)
{
	pthread_mutex_lock(&s->lock);
	s->waiters--;
	for (int i = 0; i < n; i++) {
		if (!(src[i].revents & POLLIN))
			continue;
		if (src[i].fd == s->wake_fd) {
			if (s->waiters == 0) {
				uint64_t v;
				ssize_t r = SV_REAL(read)(s->wake_fd, &v, sizeof(v));
				(void)r;
			}
		} else if (s->verbs) {
			sv_verbs_drain_events(s->verbs);
		}
	}
	pthread_mutex_unlock(&s->lock);
}

void sv_stream_marks(struct sv_stream *s, struct sv_marks *m)
{
	pthread_mutex_lock(&s->lock);
	/* Any message, TCP bytes read, wake-up or state change moves it. */
	m->activity = s->wake_gen + s->tcp_rx + (s->error != 0) +
		      (uint64_t)s->state + (s->proto_ready ? s->proto.st.rx_msgs : 0);
	pthread_mutex_unlock(&s->lock);
	m->rx_eagain = atomic_load_explicit(&s->rx_eagain, memory_order_relaxed);
	m->tx_eagain = atomic_load_explicit(&s->tx_eagain, memory_order_relaxed);
}

bool sv_stream_kernel_only(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	bool r = false;
	switch (s->state) {
	case SV_CONN_FALLBACK:
	case SV_CONN_DETACHED:
		r = s->tcpbuf_len == s->tcpbuf_off;
		break;
	case SV_CONN_TCP:
	case SV_CONN_RESOLVING:
	case SV_CONN_REQUESTED:
	case SV_CONN_SWITCHING:
	case SV_CONN_RDMA:
	case SV_CONN_BROKEN:
	case SV_CONN_DETACHING:
		break;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}
