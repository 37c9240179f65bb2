/* Resuming over TCP after the QP is lost: a QP error, a disconnect, the
 * device removed, the port down, or the peer's resume record on TCP. The
 * connection goes on over TCP from the last byte each end holds, with no
 * error for the application (docs/protocol.md, section 11):
 *
 *  1. the core is aborted, which copies the bytes whose arrival is not
 *     known (proto_resume.c); the QP goes to the error state, so no
 *     receive completes after the CQ is drained; the receive side's QP
 *     part ends at what arrived;
 *  2. each end writes its resume record on TCP: the bytes of the other's
 *     stream it holds, and the end of its own;
 *  3. each reads the other's, and writes on TCP its stream from there on;
 *     its reader reads the QP part, then TCP after the peer's record.
 *
 * TCP in each direction is quiet on RDMA (after the echo), so the record
 * is the first byte there; a peer that lost its QP first is noticed by it
 * (sv_stream_resume_peek), as well as by rdma_cm's disconnect. */
#include "stream_int.h"

#include "clock.h"
#include "helper.h"
#include "le.h"
#include "log.h"
#include "real.h"

#include <errno.h>
#include <string.h>

static const uint8_t magic[4] = {'S', 'V', 'R', 'S'};
#define SV_RESUME_VERSION 1

const char *sv_failover_name(enum sv_failover f)
{
	switch (f) {
	case SV_FO_NONE:
		return "none";
	case SV_FO_QP_ERROR:
		return "qp-error";
	case SV_FO_DISCONNECT:
		return "disconnect";
	case SV_FO_DEVICE:
		return "device-removed";
	case SV_FO_PEER:
		return "peer";
	}
	return "?";
}

/* Can a break of this connection resume? Both directions settled on the
 * QP: a switch half done has its echo in the TCP stream, where the record
 * would go. */
static bool resumable(const struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	return s->state == SV_CONN_RDMA && p && s->fd >= 0 && !s->error && !s->sw.echo_owed &&
	       !s->sw.tx_held && !sv_proto_peer_switch(p, NULL) && sv_proto_resumable(p);
}

static void encode(uint8_t out[SV_RESUME_SIZE], uint64_t rcv, uint64_t snd_end)
{
	memcpy(out, magic, 4);
	out[4] = SV_RESUME_VERSION;
	out[5] = out[6] = out[7] = 0;
	sv_put64(out + 8, rcv);
	sv_put64(out + 16, snd_end);
}

bool sv_stream_resume_start(struct sv_stream *s, int err)
{
	if (!resumable(s))
		return false;
	struct sv_proto *p = s->proto;
	if (s->fo.cause == SV_FO_NONE)
		s->fo.cause = SV_FO_QP_ERROR;
	sv_stream_set_state(s, SV_CONN_RESUMING);
	s->fo.started = true;
	sv_proto_abort(p, err < 0 ? err : -ECONNRESET); /* keeps the bytes in flight */
	/* No receive completes once the QP is in the error state: what the
	 * CQ holds now is all the QP delivered. The peer hears of it from
	 * rdma_cm, or from our record. */
	sv_stream_cm_disconnect(s);
	struct sv_clock clk = SV_CLOCK_INIT;
	for (int i = 0; i < 64 && s->qp && sv_qp_poll(s->qp, p, &clk) != 0; i++)
		;
	sv_proto_rx_lost_qp(p);
	uint64_t snd, rcv, read, kfrom, kend;
	sv_proto_offsets(p, &snd, &rcv, &read);
	sv_proto_kept(p, &kfrom, &kend);
	encode(s->fo.out, rcv, kend > snd ? kend : snd);
	s->fo.deadline_us = sv_clock_now(&clk) + SV_PEER_SILENCE_US;
	sv_info("fd %d: the QP is lost (%s): resuming over TCP; we hold %llu bytes of the peer's, "
		"keep ours from %llu to %llu",
		s->fd, sv_failover_name(s->fo.cause), (unsigned long long)rcv,
		(unsigned long long)kfrom, (unsigned long long)kend);
	sv_helper_watch(s); /* it moves the exchange on if nobody calls */
	sv_stream_resume_progress(s);
	sv_stream_wake(s);
	return true;
}

void sv_stream_resume_normal_end(struct sv_stream *s)
{
	if (s->state != SV_CONN_RDMA || s->fd < 0 || s->sw.echo_owed || s->fo.out_sent)
		return;
	uint64_t snd, rcv, read;
	sv_proto_offsets(s->proto, &snd, &rcv, &read);
	encode(s->fo.out, rcv, snd);
	s->fo.announce_due = true;
}

void sv_stream_resume_announce(struct sv_stream *s)
{
	if (!s->fo.announce_due || s->fd < 0)
		return;
	s->fo.announce_due = false;
	/* TCP's sending is quiet on RDMA: 24 bytes fit. A peer that closed
	 * answers with a reset, as TCP does to bytes after a close. */
	ssize_t n = SV_REAL(send)(s->fd, s->fo.out, SV_RESUME_SIZE, MSG_DONTWAIT | MSG_NOSIGNAL);
	s->fo.out_sent = n > 0 ? (uint32_t)n : SV_RESUME_SIZE;
	s->fo.announced = true;
	if (n > 0 && n < SV_RESUME_SIZE) {
		sv_stream_fail(s, -ECONNRESET); /* cannot happen on a quiet socket */
	} else if (s->fo.fin_owed) {
		/* Our stream ended at the record's offset: TCP says so. */
		s->fo.fin_owed = false;
		s->cl.shut_deferred = false;
		SV_REAL(shutdown)(s->fd, SHUT_WR);
	}
}

/* The exchange could not finish: the connection fails (a reset for both). */
static void resume_failed(struct sv_stream *s, int err, const char *why)
{
	sv_warn("fd %d: resuming over TCP failed: %s", s->fd, why);
	s->fo.outcome = err;
	sv_stream_set_state(s, SV_CONN_BROKEN);
	sv_stream_fail(s, err);
	sv_stream_wake(s);
}

/* The peer's TCP ended (or was reset) before its record: it exited or was
 * killed. What it sent over the QP is read, then TCP tells the end; our
 * kept bytes have nobody to go to, and our writes get what TCP says to a
 * closed peer. */
static void peer_gone(struct sv_stream *s, int err)
{
	sv_info("fd %d: the peer's TCP ended before it resumed (%s)", s->fd,
		err ? strerror(-err) : "end of stream");
	sv_proto_resume_drop(s->proto);
	sv_stream_set_state(s, SV_CONN_BROKEN);
	/* The error our watch took from the socket is the one that ended
	 * it: a write after it would only say EPIPE. */
	if (s->fo.tcp_error)
		err = s->fo.tcp_error;
	if (err && !s->error)
		s->error = err;
	sv_stream_wake(s);
}

/* The peer's record is in: our stream goes on from the bytes it holds. */
static int apply(struct sv_stream *s)
{
	const uint8_t *in = s->fo.in;
	if (memcmp(in, magic, 4) != 0 || in[4] != SV_RESUME_VERSION) {
		resume_failed(s, -ECONNRESET, "the peer's TCP bytes are no resume record");
		return -1;
	}
	uint64_t peer_rcv = sv_get64(in + 8), peer_end = sv_get64(in + 16);
	uint64_t snd, rcv, read;
	sv_proto_offsets(s->proto, &snd, &rcv, &read);
	if (rcv > peer_end) {
		resume_failed(s, -ECONNRESET, "the peer claims less than we received of it");
		return -1;
	}
	int r = sv_proto_resume_tx(s->proto, peer_rcv, &s->fo.fin);
	if (r < 0) {
		resume_failed(s, -ECONNRESET,
			      r == -EPROTO ? "the peer lacks bytes we no longer have"
					   : "our bytes in flight could not be kept");
		return -1;
	}
	return 0;
}

/* Our record out; false while it waits for room. */
static bool send_record(struct sv_stream *s)
{
	while (s->fo.out_sent < SV_RESUME_SIZE) {
		ssize_t n = SV_REAL(send)(s->fd, s->fo.out + s->fo.out_sent,
					  SV_RESUME_SIZE - s->fo.out_sent, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false;
		if (n < 0) {
			peer_gone(s, -errno);
			return false;
		}
		s->fo.out_sent += (uint32_t)n;
	}
	return true;
}

/* The peer's record in (never a byte past it); false while it is not all
 * here. */
static bool read_record(struct sv_stream *s)
{
	while (s->fo.in_got < SV_RESUME_SIZE) {
		ssize_t n = SV_REAL(recv)(s->fd, s->fo.in + s->fo.in_got,
					  SV_RESUME_SIZE - s->fo.in_got, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false;
		if (n <= 0) {
			peer_gone(s, n < 0 ? -errno : 0);
			return false;
		}
		s->fo.in_got += (uint32_t)n;
		if (s->fo.in_got == SV_RESUME_SIZE && apply(s) < 0)
			return false;
	}
	return true;
}

/* TCP carries both directions from here on. */
static void finish(struct sv_stream *s)
{
	sv_stream_set_state(s, SV_CONN_BROKEN);
	if (s->fo.fin) {
		/* Our FIN went over the QP: TCP ends after our last byte. */
		s->cl.shut_deferred = false;
		SV_REAL(shutdown)(s->fd, SHUT_WR);
	} else {
		sv_stream_kernel_shut(s);
	}
	sv_info("fd %d: resumed over TCP (%s), %llu of our bytes sent again", s->fd,
		sv_failover_name(s->fo.cause),
		(unsigned long long)sv_proto_stats(s->proto)->resent);
	sv_stream_wake(s);
}

/* The peer's stream reached us whole (its FIN came over the QP) and we
 * keep none of ours: nothing needs its record. A peer that had not got
 * our end resumes and sends one anyway; it is read before the close
 * (sv_stream_resume_settled), and meanwhile nothing waits. */
static bool nothing_to_hear(struct sv_stream *s)
{
	uint64_t kfrom, kend;
	sv_proto_kept(s->proto, &kfrom, &kend);
	if (!sv_proto_rx_fin(s->proto) || kend != kfrom || s->fo.in_got)
		return false;
	if (sv_proto_resume_tx(s->proto, kend, &s->fo.fin) < 0)
		return false;
	s->fo.announced = true;
	return true;
}

void sv_stream_resume_progress(struct sv_stream *s)
{
	if (s->state != SV_CONN_RESUMING || s->error)
		return;
	bool out = send_record(s);
	if (s->state != SV_CONN_RESUMING)
		return;
	if (out && nothing_to_hear(s)) {
		finish(s);
		return;
	}
	bool in = read_record(s);
	if (s->state != SV_CONN_RESUMING)
		return;
	if (!out || !in || !sv_stream_write_owed(s)) {
		if (s->error) {
			resume_failed(s, s->error, "writing on TCP failed");
		} else if (!in && sv_now_us() >= s->fo.deadline_us) {
			/* Only the peer's silence times out: owed bytes waiting
			 * for TCP's room wait as TCP's own would. */
			resume_failed(s, -ETIMEDOUT, "the peer did not answer");
		}
		return;
	}
	finish(s);
}

bool sv_stream_resume_settled(struct sv_stream *s)
{
	if (s->fo.announce_due && s->fd >= 0 && !s->error) {
		uint8_t b;
		ssize_t n = SV_REAL(recv)(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false; /* neither its record nor its end yet */
		if (n <= 0)
			return true; /* it closed: nobody resumes */
		sv_stream_resume_announce(s); /* it resumes: it waits for ours */
	}
	if (!s->fo.announced || s->fd < 0 || s->error)
		return true;
	while (s->fo.in_got < SV_RESUME_SIZE) {
		ssize_t n = SV_REAL(recv)(s->fd, s->fo.in + s->fo.in_got,
					  SV_RESUME_SIZE - s->fo.in_got, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false;
		if (n <= 0)
			return true; /* the peer is gone: no record will come */
		s->fo.in_got += (uint32_t)n;
	}
	return true;
}

bool sv_stream_resume_heard(const struct sv_stream *s)
{
	return s->fo.in_got == SV_RESUME_SIZE || s->state != SV_CONN_RESUMING;
}

/* On RDMA, TCP is watched for the peer's record. */
static bool watch_tcp(const struct sv_stream *s)
{
	if (s->state != SV_CONN_RDMA || s->fo.tcp_ended || s->error || s->fd < 0 ||
	    s->sw.echo_owed || !s->proto || sv_proto_peer_switch(s->proto, NULL))
		return false;
	/* After the QP's normal end: the peer's record, to answer. */
	if (s->fo.announce_due || (s->fo.announced && s->fo.in_got < SV_RESUME_SIZE))
		return true;
	/* After the QP's normal end our sending went to TCP: not resumable. */
	enum sv_tx_state t = sv_proto_tx_state(s->proto);
	return t == SV_TX_OPEN || t == SV_TX_FIN;
}

short sv_stream_resume_events(const struct sv_stream *s)
{
	if (watch_tcp(s))
		return POLLIN;
	if (s->state != SV_CONN_RESUMING || s->error)
		return 0;
	const void *buf;
	size_t owed = 0;
	sv_proto_owed(s->proto, &buf, &owed);
	short ev = 0;
	if (s->fo.in_got < SV_RESUME_SIZE)
		ev |= POLLIN;
	if (s->fo.out_sent < SV_RESUME_SIZE || owed)
		ev |= POLLOUT;
	return ev;
}

void sv_stream_resume_peek(struct sv_stream *s)
{
	if (!watch_tcp(s))
		return;
	uint8_t b;
	ssize_t n = SV_REAL(recv)(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		/* TCP's end or an error while the QP carries both directions:
		 * the QP tells what became of the peer; TCP is not watched
		 * again, or its end would wake every wait. The peek took the
		 * socket's pending error: it is kept for the stream. */
		s->fo.tcp_ended = true;
		if (n < 0)
			s->fo.tcp_error = -errno;
		return;
	}
	if (s->fo.announce_due || s->fo.announced) {
		/* The QP ended normally here, and the peer resumes: answer,
		 * and take its record out of the way. */
		if (sv_stream_resume_settled(s))
			s->fo.tcp_ended = true; /* nothing more to watch for */
		return;
	}
	if (s->fo.cause == SV_FO_NONE)
		s->fo.cause = SV_FO_PEER;
	sv_stream_break(s, -ECONNRESET);
}
