/* The switch of a connection to the QP (docs/protocol.md, section 3, steps
 * 4 and 5): TO_RDMA over the QP, the challenges echoed on TCP, and the
 * checks that prove the RDMA peer is the TCP peer. */
#include "stream_int.h"

#include "cm.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "peers.h"
#include "real.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int send_to_rdma(struct sv_stream *s, struct sv_clock *clk);

void sv_stream_maybe_rdma(struct sv_stream *s)
{
	if ((s->state == SV_CONN_SWITCHING || s->state == SV_CONN_REQUESTED) && s->proto &&
	    sv_proto_rx_on_qp(s->proto) && !s->sw.tx_held && !s->sw.echo_owed) {
		sv_stream_set_state(s, SV_CONN_RDMA);
		sv_info("fd %d: on RDMA", s->fd);
		struct sv_clock clk = SV_CLOCK_INIT;
		uint64_t took = sv_clock_now(&clk) - s->st.born_us;
		sv_peers_learn(&s->tuple.peer, s->is_client,
			       took > UINT32_MAX ? UINT32_MAX : (uint32_t)took);
	}
}

/* ---- A known peer's first writes ------------------------------------------------ */

/* How long a hold lasts: what this host's connections took to reach RDMA
 * with that peer, four times over (a fresh process starts rdma_cm first)
 * plus 50 ms, within SOVIA_PEER_HOLD_MS. A server's first contact with a
 * client on an RDMA link (nothing known of its host) holds too, for four
 * times the longest rdma_cm start-up of this host plus 50 ms: a client
 * that speaks libsovia asks for its QP once its rdma_cm started, and a
 * server's first writes (an HTTP response, a banner) are then all on RDMA
 * from the first connection on. A plain client pays that hold once a day
 * per host (sv_peers_plain_client). */
bool sv_stream_hold_first(struct sv_stream *s)
{
	uint32_t setup;
	/* Not a successor (src/share/redo.c): the connection moved bytes. */
	if (!sv_cfg.peer_hold_ms || s->tcp_tx || s->cl.tx_shut || s->revived)
		return false;
	bool first = false;
	if (!sv_peers_expect(&s->tuple.peer, s->is_client, &setup)) {
		first = !s->is_client && sv_peers_first_contact(&s->tuple.peer) &&
			sv_cm->on_rdma_link(&s->tuple.local, &s->tuple.peer);
		if (!first)
			return false;
		setup = sv_peers_startup();
	}
	uint64_t cap = (uint64_t)sv_cfg.peer_hold_ms * 1000u, want = 50000u + 4u * (uint64_t)setup;
	uint64_t now = sv_now_us();
	s->hold.span_us = want < cap ? want : cap;
	s->hold.until = now + s->hold.span_us;
	s->hold.cap_at = now + cap;
	s->hold.first_contact = first;
	sv_dbg("fd %d: %s: its first writes wait up to %llu ms for RDMA", s->fd,
	       first ? "a first contact on an RDMA link" : "the peer speaks libsovia",
	       (unsigned long long)((want < cap ? want : cap) / 1000));
	return true;
}

bool sv_stream_holding_first(const struct sv_stream *s)
{
	return s->hold.until && !s->tcp_tx && !s->cl.tx_shut && sv_stream_may_switch(s) &&
	       (!s->proto || sv_proto_tx_state(s->proto) == SV_TX_TCP);
}

void sv_stream_hold_due(struct sv_stream *s, struct sv_clock *clk)
{
	if (s->hold.until)
		sv_stream_end_hold(s, sv_stream_holding_first(s) ? sv_clock_now(clk) : 0);
}

/* A hold runs out while the peer could not have asked yet: our rdma_cm
 * was still starting (a fresh process: no RDMA listener of ours, no route
 * resolved), so the hold counts from when it was ready instead, within
 * SOVIA_PEER_HOLD_MS. A session process that listens for its first data
 * connection (ftpd's PASV) has its RDMA listener only then. */
static bool hold_moved_on(struct sv_stream *s, uint64_t now)
{
	if (now >= s->hold.cap_at || sv_helper_rdma_state() < 0)
		return false;
	uint64_t ready = sv_helper_rdma_ready_us();
	uint64_t until = (ready ? ready : now) + s->hold.span_us;
	if (until > s->hold.cap_at)
		until = s->hold.cap_at;
	if (now >= until)
		return false;
	if (!ready)
		sv_dbg("fd %d: rdma_cm is still starting: the hold goes on", s->fd);
	s->hold.until = until;
	return true;
}

void sv_stream_hold_past(struct sv_stream *s, uint64_t at)
{
	if (!sv_stream_holding_first(s))
		return;
	uint64_t until = at + s->hold.span_us;
	if (until > s->hold.cap_at)
		until = s->hold.cap_at;
	if (until > s->hold.until)
		s->hold.until = until;
}

void sv_stream_end_hold(struct sv_stream *s, uint64_t now)
{
	if (!s->hold.until)
		return;
	bool holding = sv_stream_holding_first(s);
	if (holding && now < s->hold.until)
		return;
	if (holding && now != UINT64_MAX && hold_moved_on(s, now))
		return;
	s->hold.until = 0;
	if (holding && s->hold.first_contact && s->state == SV_CONN_TCP)
		sv_peers_plain_client(&s->tuple.peer); /* it never asked */
	s->hold.first_contact = false;
	if (holding) {
		sv_info("fd %d: RDMA is not ready: the first writes go on TCP", s->fd);
		sv_stream_wake(s);
	}
}

/* The server's sending ended on TCP: its FIN arrived (whether or not our
 * application has read up to it), so no echo of it can follow. */
static bool peer_tcp_done(const struct sv_stream *s)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	if (s->fd < 0 || SV_REAL(getsockopt)(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
		return false;
	switch (ti.tcpi_state) {
	case TCP_CLOSE_WAIT:
	case TCP_LAST_ACK:
	case TCP_CLOSING:
	case TCP_TIME_WAIT:
	case TCP_CLOSE:
		return true;
	default:
		return false;
	}
}

void sv_stream_established(struct sv_stream *s)
{
	if (s->state == SV_CONN_FALLBACK || s->state == SV_CONN_BROKEN ||
	    s->state == SV_CONN_RESUMING || s->error)
		return;
	if (s->is_client && (s->cl.tx_shut || peer_tcp_done(s))) {
		/* Either end finished sending on TCP before the QP came up: an
		 * echo can no longer follow its TCP FIN (ours, or the server's
		 * that would prove it), so this connection stays on TCP
		 * (nothing in-band happened yet). */
		sv_stream_cm_disconnect(s);
		s->fallback = SV_FB_SHUTDOWN;
		sv_stream_fall_back(s, SV_FB_SHUTDOWN);
		return;
	}
	if (s->state == SV_CONN_RDMA || s->state == SV_CONN_SWITCHING)
		return; /* the server's QP works from its accept on: the switch
			 * can be under way or done before ESTABLISHED reaches us */
	sv_stream_set_state(s, SV_CONN_SWITCHING);
	struct sv_clock clk = SV_CLOCK_INIT;
	s->up.deadline_us = sv_upgrade_deadline(sv_clock_now(&clk));
	if (s->is_client) {
		/* The client moves first: TCP carried [0, tcp_tx); its data then
		 * waits until the server proves it is the TCP peer. */
		if (send_to_rdma(s, &clk) < 0) {
			sv_stream_fall_back(s, SV_FB_RESOURCES);
			return;
		}
		s->sw.tx_held = true;
		s->sw.echo_owed = true;
		s->sw.echo_sent = 0;
	}
	sv_stream_progress(s, &clk, 0);
}

/* The server's reply to a verified client: move our sending as well. */
static void server_switch_tx(struct sv_stream *s)
{
	if (s->cl.tx_shut)
		return; /* finished on TCP: our direction simply stays there */
	struct sv_clock clk = SV_CLOCK_INIT;
	int r = send_to_rdma(s, &clk);
	if (r < 0) {
		sv_stream_break(s, r);
		return;
	}
	s->sw.echo_owed = true;
	s->sw.echo_sent = 0;
	s->st.switches_to_rdma++;
}

/* A client's sending, held since its TO_RDMA for the server's proof, is
 * TCP's again. Held writes never reach the core, so nothing of ours went
 * over the QP after the TO_RDMA: TCP carries on from the same byte, and
 * ends there if the application shut its sending down meanwhile (its FIN
 * went over the QP, TCP's waited). Call after the state left the switch. */
static void held_to_tcp(struct sv_stream *s)
{
	if (!s->sw.tx_held)
		return;
	s->sw.tx_held = false;
	if (sv_proto_tx_retract(s->proto) < 0) {
		sv_stream_fail(s, -ECONNRESET); /* bytes on the QP: a gap on TCP */
		return;
	}
	s->st.switches_to_tcp++;
	sv_stream_kernel_shut(s);
}

void sv_stream_unhold(struct sv_stream *s, const char *why, enum sv_fallback fb)
{
	if (!s->sw.tx_held || s->state != SV_CONN_SWITCHING)
		return; /* broken meanwhile: the connection failed */
	/* The server cannot prove itself any more: our sending goes back to
	 * TCP with TO_TCP (it carries no data, so even an impostor learns
	 * nothing) and the connection carries on there. After our FIN over
	 * the QP there is nothing more to announce. */
	sv_info("fd %d: the server did not prove itself (%s): sending stays on TCP", s->fd, why);
	struct sv_clock clk = SV_CLOCK_INIT;
	if (sv_proto_tx_state(s->proto) == SV_TX_OPEN && sv_proto_send_to_tcp(s->proto, &clk) < 0) {
		sv_stream_break(s, -ECONNRESET);
		return;
	}
	s->fallback = fb;
	sv_stream_set_state(s, SV_CONN_FALLBACK);
	held_to_tcp(s);
	sv_stream_wake(s);
}

void sv_stream_hold_check_peer(struct sv_stream *s, struct sv_clock *clk)
{
	if (!s->sw.tx_held || s->sw.echo_owed || s->error || !s->proto ||
	    sv_proto_peer_switch(s->proto, NULL) || !peer_tcp_done(s))
		return;
	/* TCP first, then the CQ: a server that switched wrote its echo, and
	 * any FIN after it, only once its TO_RDMA had completed (protocol.md,
	 * section 3, step 5). Its TO_RDMA not there now: it never switched. */
	sv_stream_progress(s, clk, 0);
	if (s->sw.tx_held && !s->error && !sv_proto_peer_switch(s->proto, NULL))
		sv_stream_unhold(s, "its sending ended on TCP", SV_FB_SHUTDOWN);
}

/* A verified challenge moved the peer's sending to the QP. */
static void rx_switched(struct sv_stream *s)
{
	s->st.switches_to_rdma++;
	if (s->is_client)
		s->sw.tx_held = false; /* the server proved itself: our data may go */
	else if (sv_proto_tx_state(s->proto) == SV_TX_TCP)
		server_switch_tx(s);
	if (s->state == SV_CONN_REQUESTED)
		sv_stream_set_state(s, SV_CONN_SWITCHING); /* ESTABLISHED is on its way */
	sv_stream_maybe_rdma(s);
	sv_stream_wake(s);
}

void sv_stream_challenge_failed(struct sv_stream *s, const char *why)
{
	sv_warn("fd %d: the RDMA peer failed the challenge (%s); the connection stays on TCP",
		s->fd, why);
	sv_proto_send_reset(s->proto);
	sv_proto_rx_refuse(s->proto);
	s->fallback = SV_FB_CHALLENGE;
	sv_stream_set_state(s, SV_CONN_FALLBACK);
	/* An echo of ours not written yet never will be (a peer that answers
	 * our TO_RDMA before its completion came is not the TCP peer): TCP
	 * carries the application's bytes, and its FIN, without it. */
	s->sw.echo_owed = false;
	/* A client's writes waited for this proof: they go on TCP. The RESET
	 * is all the QP says (a TO_TCP after it could not go): a real server
	 * that verified our echo reads TCP again from our switch point. */
	held_to_tcp(s);
	/* What we took for an echo is the TCP peer's data: it goes in front. */
	if (sv_stream_tcpbuf_append(s, s->sw.chal_got, s->sw.chal_len) < 0)
		sv_stream_break(s, -ENOMEM);
	s->sw.chal_len = 0;
	sv_stream_wake(s);
}

/* What the kernel lets one socket buffer at most, read once: a send
 * buffer (tcp_wmem's maximum, or twice net.core.wmem_max for one set with
 * SO_SNDBUF). */
static uint64_t sndbuf_max(void)
{
	static _Atomic uint64_t cached;
	uint64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
	if (v)
		return v;
	unsigned long a = 0, b = 0, c = 0, w = 0;
	FILE *f = fopen("/proc/sys/net/ipv4/tcp_wmem", "re");
	if (f) {
		if (fscanf(f, "%lu %lu %lu", &a, &b, &c) != 3)
			c = 0;
		fclose(f);
	}
	f = fopen("/proc/sys/net/core/wmem_max", "re");
	if (f) {
		if (fscanf(f, "%lu", &w) != 1)
			w = 0;
		fclose(f);
	}
	v = c > 2 * (uint64_t)w ? c : 2 * (uint64_t)w;
	if (!v)
		v = 64u << 20; /* no /proc: a generous guess */
	atomic_store_explicit(&cached, v, memory_order_relaxed);
	return v;
}

/* The most of one direction's bytes TCP can hold between a writer and a
 * reader that has not read them: the peer's send buffer and our receive
 * buffer, twice, and some. */
static uint64_t tcp_ahead(struct sv_stream *s)
{
	int rcv = 0;
	socklen_t len = sizeof(rcv);
	if (SV_REAL(getsockopt)(s->fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len) < 0 || rcv < 0)
		rcv = 0;
	return 2 * ((uint64_t)rcv + sndbuf_max()) + (16u << 20);
}

/* Our TO_RDMA: TCP carried [0, tcp_tx). The peer's reads ahead can hold
 * only so much of it unread (what a BACK may give back). */
static int send_to_rdma(struct sv_stream *s, struct sv_clock *clk)
{
	sv_proto_set_tcp_ahead(s->proto, tcp_ahead(s));
	return sv_proto_send_to_rdma(s->proto, s->tcp_tx, clk);
}

bool sv_stream_switch_point_ok(struct sv_stream *s, uint64_t seq)
{
	if (seq < s->tcp_rx) {
		/* The real peer cannot have sent fewer bytes than we read. */
		sv_stream_challenge_failed(s, "switch point behind the TCP stream");
		return false;
	}
	/* Bytes the real peer wrote on TCP before its TO_RDMA and we have not
	 * read sit in its send buffer or our receive buffer. Twice what the
	 * two can hold, and some: a peer whose point lies beyond would have
	 * us read (and hold, when nobody reads) TCP for ever. Judged once per
	 * point: every read during the switch asks, and the distance only
	 * shrinks as TCP is read. */
	if (s->sw.point_near && s->sw.point_seq == seq)
		return true;
	if (seq - s->tcp_rx > tcp_ahead(s)) {
		sv_stream_challenge_failed(s, "switch point beyond what TCP can hold");
		return false;
	}
	s->sw.point_near = true;
	s->sw.point_seq = seq;
	return true;
}

void sv_stream_check_echo(struct sv_stream *s)
{
	if (memcmp(s->sw.chal_got, s->sw.my_challenge, SV_CHALLENGE_SIZE) != 0) {
		sv_stream_challenge_failed(s, "wrong echo");
		return;
	}
	s->sw.chal_len = 0;
	if (s->sw.qp_lost) {
		/* A real echo, but its QP is gone: TCP carries on after it. */
		sv_proto_rx_refuse(s->proto);
		s->fallback = SV_FB_QP_LOST;
		sv_stream_set_state(s, SV_CONN_FALLBACK);
		sv_stream_wake(s);
		return;
	}
	if (sv_proto_rx_accept(s->proto) < 0) {
		sv_stream_break(s, -ECONNRESET);
		return;
	}
	rx_switched(s);
}

int sv_stream_write_echo(struct sv_stream *s)
{
	if (!s->sw.echo_owed || sv_proto_to_rdma_pending(s->proto))
		return -EAGAIN;
	while (s->sw.echo_sent < SV_CHALLENGE_SIZE) {
		ssize_t r = SV_REAL(send)(s->fd, s->sw.peer_challenge + s->sw.echo_sent,
					  SV_CHALLENGE_SIZE - s->sw.echo_sent,
					  MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r < 0)
			return -errno;
		s->sw.echo_sent += (uint32_t)r;
	}
	s->sw.echo_owed = false;
	sv_stream_kernel_shut(s); /* TCP's FIN after the echo, if it is due */
	sv_stream_maybe_rdma(s);
	return 1;
}

void sv_stream_pump_tcp(struct sv_stream *s)
{
	uint64_t seq;
	if (!s->proto || !sv_proto_peer_switch(s->proto, &seq) || s->error ||
	    !sv_stream_switch_point_ok(s, seq) || !sv_copies_may_pump(s))
		return;
	/* Only while a switch waits for its point: a buffer of the moment,
	 * not 64 KiB in every thread of every process. */
	enum { CHUNK = 65536 };
	uint8_t *chunk = malloc(CHUNK);
	if (!chunk) {
		sv_stream_break(s, -ENOMEM);
		return;
	}
	for (;;) {
		struct iovec iov = {chunk, CHUNK};
		size_t before = s->tcpbuf.len;
		long n = sv_stream_tcp_read(s, &iov, 1, 0);
		if (n <= 0)
			break;
		/* A failed challenge may have queued the would-be echo, which
		 * comes after these bytes in the stream. */
		size_t echo = s->tcpbuf.len - before;
		uint8_t held[SV_CHALLENGE_SIZE];
		if (echo)
			memcpy(held, s->tcpbuf.buf + before, echo);
		s->tcpbuf.len = before;
		if (sv_stream_tcpbuf_append(s, chunk, (size_t)n) < 0 ||
		    sv_stream_tcpbuf_append(s, held, echo) < 0) {
			sv_stream_break(s, -ENOMEM);
			break;
		}
		sv_stream_wake(s);
	}
	free(chunk);
}
