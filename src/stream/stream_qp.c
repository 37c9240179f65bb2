/* The queue pair's side of a stream: completions into the core and the
 * progress they allow, and what happens when the QP goes. */
#include "stream_int.h"

#include "log.h"
#include "real.h"

#include <errno.h>
#include <string.h>

static void break_tx(struct sv_stream *s, int err);

/* The QP ended normally (the peer's FIN came, then the flush of its
 * disconnect) while our sending was still open: the core closed it, and it
 * goes on over TCP, the connection's other medium. A peer that closed has
 * closed its TCP socket too, and TCP answers our next writes as it answers
 * writes to a closed peer; one whose QP failed after it only shut down its
 * sending still reads what we write. */
static void tx_after_end(struct sv_stream *s)
{
	if (sv_proto_error(s->proto) || s->error)
		return;
	if (sv_proto_tx_state(s->proto) == SV_TX_RESET) {
		/* A peer that only shut its sending down resumes, and reads
		 * our record before our bytes (stream_resume.c). */
		sv_stream_resume_normal_end(s);
		break_tx(s, -ECONNRESET);
	} else if (sv_proto_fin_unsure(s->proto) && !s->fo.fin_owed && !s->fo.out_sent) {
		/* Our FIN was in flight: a peer that still reads resumes, and
		 * reads our record, then TCP's FIN. */
		sv_stream_resume_normal_end(s);
		s->fo.fin_owed = s->fo.announce_due;
	}
}

int sv_stream_poll_cq(struct sv_stream *s, struct sv_clock *clk)
{
	int r = sv_qp_poll(s->qp, s->proto, clk);
	if (r < 0) {
		if (s->fo.cause == SV_FO_NONE)
			s->fo.cause = SV_FO_QP_ERROR;
		sv_stream_break(s, r);
	} else if (r > 0) {
		tx_after_end(s);
		sv_stream_wake(s); /* a spinning thread sees the mark move */
	}
	return r;
}

int sv_stream_progress(struct sv_stream *s, struct sv_clock *clk, unsigned flags)
{
	if (!s->qp || s->error)
		return s->error;
	int r = 0;
	if (!(flags & SV_PROGRESS_DRAINED)) {
		r = sv_stream_poll_cq(s, clk);
		if (r < 0)
			return s->error;
	}
	bool timers = true;
	if (flags & SV_PROGRESS_SEND) {
		/* A coalesced buffer's timer is looked at by one write in
		 * SV_TX_TIMER_EVERY (or by any that has a clock reading anyway):
		 * each look reads the clock, a system call where it has no vDSO,
		 * which would cost a small writer a good part of each write.
		 * Appending writes poll the CQ, so the peer's acknowledgment
		 * still sends the buffer at once (Nagle's idle); a read sends it
		 * too, and the helper does for an application that stopped
		 * calling. */
		timers = false;
		if (sv_proto_tx_pending(s->proto) &&
		    (sv_clock_known(clk) || ++s->wt.tx_unclocked >= SV_TX_TIMER_EVERY)) {
			timers = true;
			s->wt.tx_unclocked = 0;
		}
	}
	if (timers)
		sv_proto_timers(s->proto, clk);
	if (s->state == SV_CONN_RESUMING) {
		sv_stream_resume_progress(s);
		return s->error;
	}
	if (s->state == SV_CONN_DETACHING || sv_proto_back_wanted(s->proto) || s->back_wanted) {
		sv_stream_back_progress(s);
		if (s->error)
			return s->error;
	}
	if (s->sw.echo_owed) {
		r = sv_stream_write_echo(s);
		if (r < 0 && r != -EAGAIN) {
			sv_stream_break(s, r);
			return s->error;
		}
	}
	if (r > 0)
		sv_stream_wake(s);
	return 0;
}

/* The peer announced a switch we had not verified yet, and nothing of
 * ours went over the QP. What follows its point on TCP decides: our
 * challenge means a real peer whose QP died (the echo is dropped, TCP
 * carries on); anything else is the TCP peer's own data (given back). The
 * receive path keeps checking. */
static void break_unverified(struct sv_stream *s)
{
	if (memcmp(s->sw.chal_got, s->sw.my_challenge, s->sw.chal_len) != 0) {
		sv_proto_rx_refuse(s->proto);
		if (sv_stream_tcpbuf_append(s, s->sw.chal_got, s->sw.chal_len) < 0)
			s->error = -ENOMEM;
		s->sw.chal_len = 0;
		s->fallback = SV_FB_CHALLENGE;
		sv_stream_set_state(s, SV_CONN_FALLBACK);
	} else {
		s->sw.qp_lost = true;
	}
	sv_stream_wake(s);
}

/* The connection fails: bytes may be lost. The peer must see it fail too,
 * never a clean end of a stream with a gap: its TCP connection is reset
 * now (connect() to AF_UNSPEC dissolves it with a reset), and the
 * application gets the error on its next call. */
void sv_stream_fail(struct sv_stream *s, int err)
{
	if (!s->error)
		s->error = err < 0 ? err : -ECONNRESET;
	s->cl.shut_deferred = false;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	SV_REAL(setsockopt)(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	struct sockaddr sa = {.sa_family = AF_UNSPEC};
	SV_REAL(connect)(s->fd, &sa, sizeof(sa));
}

/* Our sending was on the QP: if every message posted arrived, TCP carries
 * on from the next byte (with the bytes still held for coalescing);
 * otherwise bytes may be lost, and the stream fails rather than go on with
 * a gap. */
static void break_tx(struct sv_stream *s, int err)
{
	const void *buf;
	size_t len;
	uint64_t snd, rcv, read;
	sv_proto_offsets(s->proto, &snd, &rcv, &read);
	if (s->sw.tx_held || sv_proto_tx_lost_qp(s->proto, &buf, &len) < 0) {
		sv_dbg("fd %d: bytes we sent may be lost with the QP: the connection fails", s->fd);
		sv_stream_fail(s, err);
		return;
	}
	sv_dbg("fd %d: our sending goes on over TCP from byte %llu (%zu coalesced first)", s->fd,
	       (unsigned long long)snd, len);
	if (len)
		sv_stream_resume_announce(s);
	size_t off = 0;
	while (off < len) {
		ssize_t n = SV_REAL(send)(s->fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	if (off < len)
		sv_stream_fail(s, -ECONNRESET);
}

void sv_stream_break(struct sv_stream *s, int err)
{
	if (s->state == SV_CONN_BROKEN || s->state == SV_CONN_FALLBACK || s->sw.qp_lost ||
	    s->state == SV_CONN_DETACHED || s->state == SV_CONN_RESUMING)
		return;
	if (s->state == SV_CONN_DETACHING) {
		sv_warn("fd %d: the QP broke while going back to TCP", s->fd);
		sv_stream_set_state(s, SV_CONN_BROKEN);
		sv_stream_fail(s, err); /* bytes on their way back may be lost */
		sv_stream_wake(s);
		return;
	}
	sv_dbg("fd %d: the QP is down (%s)", s->fd, strerror(err < 0 ? -err : ECONNRESET));
	/* Before the QP was established nothing can have gone over it. */
	bool established = s->state == SV_CONN_SWITCHING || s->state == SV_CONN_RDMA;
	struct sv_proto *p = s->proto;
	if (!p || !established || !sv_proto_qp_used(p)) {
		/* Nothing ever went over the QP: TCP simply carries on. EACCES:
		 * the kernel refused our writes to the RDMA device's files
		 * (preload/creds.c); ECONNRESET: the peer disconnected (its
		 * client shut down on TCP before the QP was up); anything
		 * else: the QP failed on its own. */
		sv_stream_fall_back(s, err == -EACCES	    ? SV_FB_CREDENTIALS
				       : err == -ECONNRESET ? SV_FB_CALLED_OFF
							    : SV_FB_QP_LOST);
		return;
	}
	if (sv_proto_peer_switch(p, NULL) && !sv_proto_rx_on_qp(p) &&
	    sv_proto_tx_state(p) == SV_TX_TCP) {
		break_unverified(s);
		return;
	}
	/* Both directions settled on the QP: the ends agree on TCP where
	 * each goes on, and nothing is lost (stream_resume.c). */
	if (sv_stream_resume_start(s, err))
		return;
	sv_stream_set_state(s, SV_CONN_BROKEN);
	/* Receiving: what the QP delivered is read first, then TCP carries
	 * on from there. A peer that exited or was killed closed its TCP
	 * socket too, so that gives EOF or ECONNRESET, never a hang. */
	sv_proto_rx_lost_qp(p);
	uint64_t snd, rcv, read;
	sv_proto_offsets(p, &snd, &rcv, &read);
	sv_dbg("fd %d: receiving: the QP's part ends at byte %llu (%llu read), then TCP", s->fd,
	       (unsigned long long)rcv, (unsigned long long)read);
	/* Our echo goes only after a TO_RDMA known to have arrived: a peer
	 * that did not see it must not take the echo for data. (One that
	 * did takes what follows for a wrong echo and gives it back.) */
	s->sw.echo_owed = false;
	if (sv_proto_peer_switch(p, NULL))
		sv_stream_fail(s, -ECONNRESET); /* broke inside a switch */
	enum sv_tx_state tx = sv_proto_tx_state(p);
	if (tx == SV_TX_OPEN || tx == SV_TX_RESET || tx == SV_TX_FIN)
		break_tx(s, err);
	/* The peer reads TCP from here on: a FIN we sent over the QP must
	 * reach it there too. */
	sv_stream_kernel_shut(s);
	sv_stream_wake(s);
}

void sv_stream_qp_down(struct sv_stream *s, int err)
{
	sv_lock(&s->lock);
	if (s->state == SV_CONN_DETACHED) {
		sv_unlock(&s->lock);
		return;
	}
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->qp && !s->error)
		sv_qp_poll(s->qp, s->proto, &clk); /* keep what arrived; the break judges */
	struct sv_proto *p = s->proto;
	/* Both directions finished (our FIN completed), or the peer went
	 * first: its FIN came and none of our DATA is in flight. It is the
	 * judgement the flushed work requests get (sv_proto_peer_ended),
	 * made here too: the disconnect can come before they are in the CQ,
	 * and the poll above then finds none. */
	if (p && !sv_proto_peer_switch(p, NULL) && sv_proto_peer_ended(p)) {
		tx_after_end(s);
		sv_stream_wake(s); /* an ordinary end, nothing is lost */
		sv_unlock(&s->lock);
		return;
	}
	if (s->fo.cause == SV_FO_NONE)
		s->fo.cause = err == -ENODEV ? SV_FO_DEVICE : SV_FO_DISCONNECT;
	sv_stream_break(s, err == -ENODEV ? -ECONNRESET : err);
	sv_unlock(&s->lock);
}

void sv_stream_drain(struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	struct sv_clock clk = SV_CLOCK_INIT;
	uint64_t end = sv_clock_now(&clk) + 5000000u;
	while (!s->error && clk.us < end) {
		sv_stream_progress(s, &clk, 0);
		if (s->state == SV_CONN_BROKEN)
			return; /* TCP carries our bytes now (or nothing can) */
		if (s->state == SV_CONN_RESUMING) {
			sv_stream_wait(s, &clk, 0, clk.us + 10000, 0);
			continue;
		}
		if (sv_proto_tx_pending(p))
			sv_proto_flush(p, SV_FLUSH_CLOSE, &clk);
		if (!sv_proto_tx_pending(p) && sv_proto_sends_done(p))
			return;
		sv_stream_wait(s, &clk, 0, end, 0);
	}
}
