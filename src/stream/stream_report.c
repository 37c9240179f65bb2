/* What the calls that report a connection's state answer for a stream:
 * getsockopt SO_ERROR and TCP_INFO, ioctl SIOCOUTQ (FIONREAD is
 * sv_stream_inq). The kernel's TCP socket knows only TCP's part of the
 * connection; the bytes the QP carries, the FINs that went over it and
 * the errors libsovia found are the stream's, read here under its lock. */
#include "stream_int.h"

#include "real.h"

#include <errno.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <string.h>
#include <sys/ioctl.h>

/* tcpi_state's values, the kernel's. glibc's <netinet/tcp.h> names them
 * too, but its struct tcp_info ends before the byte counters. */
enum {
	SV_TCPS_ESTABLISHED = 1,
	SV_TCPS_FIN_WAIT1 = 4,
	SV_TCPS_FIN_WAIT2 = 5,
	SV_TCPS_CLOSE = 7,
	SV_TCPS_CLOSE_WAIT = 8,
	SV_TCPS_LAST_ACK = 9,
};

int sv_stream_take_error(struct sv_stream *s)
{
	sv_lock(&s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->proto && !s->error)
		sv_stream_progress(s, &clk, 0); /* a break the CQ holds is found now */
	int err = 0;
	if (s->error && !s->error_told) {
		s->error_told = true;
		err = s->error;
		/* The kernel's own pending error, if any, is the same event
		 * (the reset that failed the connection): it goes too, or the
		 * next SO_ERROR would report it again. */
		int k;
		socklen_t kl = sizeof(k);
		SV_REAL(getsockopt)(s->fd, SOL_SOCKET, SO_ERROR, &k, &kl);
	}
	sv_unlock(&s->lock);
	return err;
}

/* DATA posted and not completed. Once the core broke, what may be lost is
 * counted as kept or owed instead (qp_unacked). */
static uint64_t qp_in_flight(const struct sv_stream *s)
{
	if (!s->qp || !s->qp->ops->data_in_flight || sv_proto_error(s->proto))
		return 0;
	return s->qp->ops->data_in_flight(s->qp);
}

/* Taken from the application by the core and not posted: coalesced, or
 * collected while the window was closed. */
static uint64_t qp_unsent(const struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	enum sv_tx_state t = sv_proto_tx_state(p);
	if (sv_proto_error(p) || (t != SV_TX_OPEN && t != SV_TX_FIN))
		return 0; /* flushed at a switch, owed at the way back, kept at a break */
	return s->st.qp_taken - sv_proto_stats(p)->tx_bytes;
}

/* Our bytes the QP's side of the connection holds that the peer is not
 * known to have: coalesced, in flight, kept at a break until the peer's
 * record says what arrived, or owed to TCP (the way back, a resume). */
static uint64_t qp_unacked(const struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	if (!p)
		return 0;
	uint64_t n = qp_unsent(s) + qp_in_flight(s);
	if (s->state == SV_CONN_RESUMING && s->fo.in_got < SV_RESUME_SIZE) {
		uint64_t from, end;
		sv_proto_kept(p, &from, &end);
		n += end - from;
	}
	const void *buf;
	size_t owed;
	sv_proto_owed(p, &buf, &owed);
	return n + owed;
}

long sv_stream_outq(struct sv_stream *s)
{
	sv_stream_app_uses(s);
	sv_lock(&s->lock);
	struct sv_clock clk = SV_CLOCK_INIT;
	if (s->proto && !s->error)
		sv_stream_progress(s, &clk, 0); /* completions the CQ holds count */
	int k = 0;
	long n = SV_REAL(ioctl)(s->fd, SIOCOUTQ, &k) < 0 ? -errno : k + (long)qp_unacked(s);
	sv_unlock(&s->lock);
	return n;
}

/* The state TCP would be in after the FINs that went over the QP, while
 * the kernel's socket, which saw none of them, says "established". */
static uint8_t fin_state(const struct sv_stream *s)
{
	struct sv_proto *p = s->proto;
	bool ours = s->cl.tx_shut, theirs = sv_proto_rx_fin(p);
	bool acked = sv_proto_tx_state(p) == SV_TX_FIN && sv_proto_sends_done(p);
	if (ours && theirs)
		return acked ? SV_TCPS_CLOSE : SV_TCPS_LAST_ACK;
	if (ours)
		return acked ? SV_TCPS_FIN_WAIT2 : SV_TCPS_FIN_WAIT1;
	return theirs ? SV_TCPS_CLOSE_WAIT : SV_TCPS_ESTABLISHED;
}

void sv_stream_tcp_info(struct sv_stream *s, void *info, socklen_t len)
{
	struct tcp_info ti;
	size_t n = len < sizeof(ti) ? (size_t)len : sizeof(ti);
	memset(&ti, 0, sizeof(ti));
	memcpy(&ti, info, n);
	sv_lock(&s->lock);
	struct sv_proto *p = s->proto;
	if (s->error)
		ti.tcpi_state = SV_TCPS_CLOSE;
	else if (p && ti.tcpi_state == SV_TCPS_ESTABLISHED)
		ti.tcpi_state = fin_state(s);
	if (p) {
		/* The connection's bytes, both media: the QP's DATA posted,
		 * delivered (less what went again over TCP after a lost QP,
		 * which the kernel counts), received, and not sent yet. */
		const struct sv_proto_stats *st = sv_proto_stats(p);
		ti.tcpi_bytes_sent += st->tx_bytes;
		ti.tcpi_bytes_acked += st->tx_bytes - st->resent - qp_in_flight(s);
		ti.tcpi_bytes_received += st->rx_bytes;
		ti.tcpi_notsent_bytes += (uint32_t)qp_unsent(s);
	}
	sv_unlock(&s->lock);
	memcpy(info, &ti, n);
}

/* What the application of a passive (accepted) socket has sent and
 * received over its life, from the kernel's counts: every byte written is
 * acknowledged or still queued, every byte that arrived was read or still
 * waits. Past ESTABLISHED a FIN counts in the kernel's numbers (and on the
 * connecting side the SYN does): -ENOTCONN, as the caller cannot tell
 * them from data. The counters and the queues are read apart, so the
 * queues are read on both sides of TCP_INFO until they agree. */
int sv_tcp_app_counts(int fd, uint64_t *tx, uint64_t *rx)
{
	for (int tries = 0; tries < 100; tries++) {
		int outq, inq, outq2, inq2;
		struct tcp_info ti = {0};
		socklen_t len = sizeof(ti);
		if (SV_REAL(ioctl)(fd, SIOCOUTQ, &outq) < 0 || SV_REAL(ioctl)(fd, SIOCINQ, &inq) < 0 ||
		    SV_REAL(getsockopt)(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
		    SV_REAL(ioctl)(fd, SIOCOUTQ, &outq2) < 0 || SV_REAL(ioctl)(fd, SIOCINQ, &inq2) < 0)
			return -errno;
		if (len < offsetof(struct tcp_info, tcpi_bytes_received) +
				  sizeof(ti.tcpi_bytes_received))
			return -EOPNOTSUPP; /* a kernel older than 4.2 */
		if (ti.tcpi_state != SV_TCPS_ESTABLISHED)
			return -ENOTCONN;
		if (outq != outq2 || inq != inq2 || outq < 0 || inq < 0 ||
		    ti.tcpi_bytes_received < (uint64_t)inq)
			continue; /* moved while we looked */
		*tx = ti.tcpi_bytes_acked + (uint64_t)outq;
		*rx = ti.tcpi_bytes_received - (uint64_t)inq;
		return 0;
	}
	return -EAGAIN;
}
