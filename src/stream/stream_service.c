/* What the helper thread does for a stream when it looks at it: a
 * non-blocking connect's end, the delayed start of the upgrade, the
 * upgrade's timeouts, the switch (pumping TCP while the application does
 * not read), the timers of an idle application, lingering close and the
 * way back's end. When to look is the helper's policy (helper_watch.c);
 * this is the mechanism, run under the stream's lock. */
#include "stream_int.h"

#include "config.h"
#include "log.h"
#include "pinned.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <string.h>

/* A non-blocking connect that was in progress: the upgrade is scheduled
 * once it is done. Not told by POLLOUT (the application may have filled
 * the send buffer already, for a peer that does not read yet) nor by
 * SO_ERROR (reading it would take the outcome away from the application):
 * the TCP state tells. The local address was bound by connect() already;
 * the peer's is known now. Closed, broken or called off meanwhile: there
 * is nothing to upgrade. */
static void service_connecting(struct sv_stream *s, struct sv_service *sv)
{
	if (s->state != SV_CONN_TCP || s->cl.app_closed || s->error || s->fd < 0) {
		s->up.connect_pending = false;
		sv->done = true;
		return;
	}
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	if (SV_REAL(getsockopt)(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
	    ti.tcpi_state == TCP_SYN_SENT) {
		sv->next = sv->now + 5000; /* connects take round trips: look every 5 ms */
		sv->timed = true;
		return;
	}
	s->up.connect_pending = false;
	socklen_t pl = sizeof(s->tuple.peer);
	if (getpeername(s->fd, (struct sockaddr *)&s->tuple.peer, &pl) < 0) {
		/* Not connected: the connect failed, or the connection already
		 * carried its bytes and ended (after both FINs the kernel's
		 * socket is closed and names no peer; a slow rdma_cm start
		 * under emulation leaves that much time). Only the first may
		 * say "no RDMA route", which the peer table remembers. */
		bool ended = s->cl.tx_shut || s->st.tcp_tx_bytes || s->st.tcp_rx_bytes;
		sv_dbg("fd %d: %s", s->fd,
		       ended ? "the connection ended before its upgrade could start"
			     : "the non-blocking connect failed");
		sv_stream_fall_back(s, ended ? SV_FB_SHUTDOWN : SV_FB_NO_ROUTE);
		sv->done = true;
		return;
	}
	/* sv_now_us() is never 0: upgrade_at 0 would mean "not waiting". A
	 * peer known to speak libsovia: at once, and the first writes wait. */
	s->up.upgrade_at = sv->now;
	if (!s->hold.until)
		s->up.upgrade_at += (uint64_t)sv_cfg.upgrade_delay_ms * 1000u;
	sv->next = s->up.upgrade_at;
	sv->timed = true;
}

/* How often a successor looks whether its predecessor's calls are over,
 * besides the wake-up the last of them gives. */
#define SV_PRED_LOOK_US 1000000u

/* A client connection that waits out SOVIA_UPGRADE_DELAY_MS, or to ask
 * again after "no listener" (upgrade.c). A close, a fork or exec (which
 * call the upgrade off) or a broken connection meanwhile: no upgrade. True
 * when it let go of the lock. */
static bool service_upgrade_at(struct sv_stream *s, struct sv_service *sv)
{
	bool go = s->state == SV_CONN_TCP && !s->cl.app_closed && !s->error;
	if (go && sv->now < s->up.upgrade_at) {
		sv->next = s->up.upgrade_at;
		sv->timed = true;
		return false;
	}
	if (go && !sv_copies_may_upgrade(s)) {
		/* A successor (src/share/redo.c): its predecessor's calls in the
		 * kernel first. The last of them wakes the helper; a look now
		 * and then all the same. */
		go = s->state == SV_CONN_TCP;
		if (go) {
			sv->next = sv->now + SV_PRED_LOOK_US;
			sv->timed = true;
			return false;
		}
	}
	s->up.upgrade_at = 0;
	sv->done = true; /* the upgrade watches it again */
	if (!go)
		return false;
	sv_unlock(&s->lock);
	sv_stream_cm_connect_now(s);
	return true;
}

/* A client whose buffers wait for room in the locked-memory budget (its
 * route resolved): it asks again at every look, and is looked at at every
 * wake-up (a give-back wakes the helper: pinned.h), until its deadline.
 * True when it let go of the lock. */
static bool service_room(struct sv_stream *s, struct sv_service *sv)
{
	sv->next = s->up.deadline_us;
	if (sv_stream_holding_first(s) && s->hold.until < sv->next)
		sv->next = s->hold.until; /* its end is judged at each look */
	if (s->cl.app_closed || s->error || s->fd < 0) {
		s->up.room_wait = 0;
		sv_stream_fall_back(s, SV_FB_MEMLOCK);
		sv->done = true;
		return false;
	}
	sv_unlock(&s->lock);
	sv_stream_cm_retry_room(s);
	return true;
}

/* On RDMA with nothing in between (switch, echo, close) for the helper: the
 * application's own calls drive the stream. */
static bool app_drives(const struct sv_stream *s)
{
	return s->state == SV_CONN_RDMA && !s->sw.echo_owed &&
	       !sv_proto_peer_switch(s->proto, NULL) && s->qp && !s->error && !s->cl.app_closed;
}

/* A stream its application drives, found idle (no call since the last
 * look, nobody waiting in libsovia): arm the CQ, so the helper sleeps on
 * the hub (its watch on the stream fires at the completion) and the
 * core's deadline. An idle application's connection then still answers
 * BACK, sends its delayed ACKs and flushes its coalesced bytes. */
static void idle_watch(struct sv_stream *s, struct sv_service *sv, struct sv_clock *clk)
{
	if (sv_qp_arm(s->qp) < 0)
		return;
	/* Look once more: a completion before the arming would never signal. */
	int r = sv_stream_poll_cq(s, clk);
	if (r < 0) {
		sv->next = sv->now; /* the next look sees the new state */
		return;
	}
	if (r > 0) {
		sv_stream_progress(s, clk, SV_PROGRESS_DRAINED);
		sv_stream_wake(s);
		sv->next = sv->now;
		return;
	}
	sv->armed = true;
	sv->next = sv_proto_next_deadline(s->proto, clk);
	/* A peer that lost its QP while this one is idle tells it on TCP
	 * (stream_resume.c): the helper watches the socket for it. */
	sv_stream_resume_peek(s);
	if (s->state != SV_CONN_RDMA) {
		sv->next = sv->now; /* it resumes: look again at once */
		return;
	}
	if (sv_stream_resume_events(s) & POLLIN)
		sv->tcp_fd = s->fd;
}

/* Switching or on RDMA. */
static void service_on_qp(struct sv_stream *s, struct sv_service *sv, struct sv_clock *clk)
{
	/* Did the application call in since the last look, or does it wait
	 * inside libsovia now? */
	bool calls_since_look = s->wt.app_calls != s->wt.helper_seen;
	bool active = s->wt.waiters || calls_since_look;
	s->wt.helper_seen = s->wt.app_calls;
	if (active && !sv->fired && app_drives(s)) {
		/* Its calls poll the CQ and run the timers: the completions
		 * stay the application's. But a thread asleep in poll() runs
		 * no timer, and the core's may be due meanwhile (giving grown
		 * buffers back after an idle time, docs/protocol.md 5): they
		 * run here, and send what they send; completions stay the
		 * sleeper's. */
		if (s->wt.waiters && !calls_since_look) {
			uint64_t due = sv_proto_next_deadline(s->proto, clk);
			if (due && due <= sv->now)
				sv_proto_timers(s->proto, clk);
		}
		sv->driven = sv->active = true;
		sv->flush_deadline = sv_proto_flush_deadline(s->proto);
		return;
	}
	if (s->state == SV_CONN_RDMA && s->qp)
		s->st.helper_polls++;
	sv_stream_progress(s, clk, 0);
	/* What we took from the CQ may be what a waiter (or a spinning call
	 * between its looks) waits for; its poll may also have lost the
	 * channel's event to us. */
	sv_stream_wake(s);
	sv_stream_pump_tcp(s); /* the switch completes even if nobody reads */
	sv_stream_hold_check_peer(s, clk);
	uint64_t dl = s->up.deadline_us;
	if (s->sw.tx_held && dl && sv->now >= dl && !s->sw.echo_owed)
		sv_stream_unhold(s, "timeout", SV_FB_CHALLENGE);
	if (s->state == SV_CONN_SWITCHING && dl && sv->now >= dl && s->proto &&
	    !sv_proto_qp_used(s->proto)) {
		/* Connected, yet nothing moved: nothing in-band happened, so
		 * TCP can simply carry on. */
		sv_stream_fall_back(s, SV_FB_TIMEOUT);
		sv->done = true;
		return;
	}
	if (s->cl.app_closed) {
		sv->next = sv_stream_linger(s, sv->now, &sv->done);
		sv->timed = true;
		return;
	}
	if (app_drives(s)) {
		/* The helper stands in only while the application is idle; a
		 * wake-up that found it active does not arm. */
		sv->driven = true;
		sv->active = active;
		if (active)
			sv->flush_deadline = sv_proto_flush_deadline(s->proto);
		else
			idle_watch(s, sv, clk);
		return;
	}
	sv->next = s->proto ? sv_proto_next_deadline(s->proto, clk) : 0;
	/* A switch takes a few round trips whose completions do not wake the
	 * helper: look again every millisecond until it is over (bounded by
	 * the upgrade's deadline). */
	if (s->state == SV_CONN_SWITCHING) {
		if (!sv->next || sv->next > sv->now + 1000)
			sv->next = sv->now + 1000;
		sv->timed = true;
	}
}

static void service_detaching(struct sv_stream *s, struct sv_service *sv, struct sv_clock *clk)
{
	/* The peer asked, or our application did and went on: finish giving
	 * back (the bytes may wait for TCP's buffer space). */
	if (s->state == SV_CONN_DETACHING)
		sv_stream_progress(s, clk, 0);
	if (sv_stream_back_overdue(s, sv->now))
		sv_stream_wake(s);
	if (s->state == SV_CONN_DETACHING)
		sv->next = sv->now + 1000;
	else if (s->state == SV_CONN_DETACHED)
		sv->next = sv_stream_detached_service(s, sv->now, &sv->done);
	else if (s->cl.app_closed)
		sv->next = sv_stream_linger(s, sv->now, &sv->done);
	else
		sv->done = true;
}

void sv_stream_service(struct sv_stream *s, struct sv_service *sv)
{
	sv->done = sv->driven = sv->active = sv->armed = sv->timed = false;
	sv->next = sv->flush_deadline = 0;
	sv->tcp_fd = -1;
	if (sv->try_only) {
		/* It held the lock: it is inside libsovia (its waits let go of
		 * the lock) and runs the timers itself. Come back later rather
		 * than queue behind it and make it queue behind us. */
		if (!sv_trylock(&s->lock)) {
			sv->driven = sv->active = true;
			return;
		}
	} else {
		sv_lock(&s->lock);
	}
	s->st.helper_looks++;
	struct sv_clock clk = {.us = sv->now, .source = sv_now_us};
	/* A known peer's first writes: end the hold when its time is up. */
	sv_stream_hold_due(s, &clk);
	uint64_t hold = sv_stream_holding_first(s) ? s->hold.until : 0;
	if (s->up.connect_pending) {
		service_connecting(s, sv);
	} else if (s->up.upgrade_at) {
		if (service_upgrade_at(s, sv))
			return;
	} else {
		switch (s->state) {
		case SV_CONN_TCP:
		case SV_CONN_RESOLVING:
		case SV_CONN_REQUESTED:
			if (s->up.deadline_us && sv->now >= s->up.deadline_us) {
				bool room = s->up.room_wait;
				if (room)
					sv_pinned_tell(s->up.room_wait);
				sv_stream_fall_back(s, room ? SV_FB_MEMLOCK : SV_FB_TIMEOUT);
				s->up.room_wait = 0;
				sv->done = true;
			} else if (s->up.room_wait && s->state == SV_CONN_RESOLVING) {
				if (service_room(s, sv))
					return;
				break;
			}
			sv->next = s->up.deadline_us;
			/* rdma_cm's events move it on; a server's wait for room
			 * is the upgrade's (its requests are retried). */
			sv->timed = true;
			break;
		case SV_CONN_SWITCHING:
		case SV_CONN_RDMA:
			service_on_qp(s, sv, &clk);
			break;
		case SV_CONN_RESUMING:
			/* Rare and short: the exchange is looked at every
			 * millisecond until it is over (or its time is up). */
			sv_stream_progress(s, &clk, 0);
			sv_stream_wake(s);
			if (s->state == SV_CONN_RESUMING) {
				sv->next = sv->now + 1000;
				sv->timed = true;
				break;
			}
			/* fall through */
		case SV_CONN_FALLBACK:
		case SV_CONN_BROKEN:
			if (s->cl.app_closed)
				sv->next = sv_stream_linger(s, sv->now, &sv->done);
			else
				sv->done = true;
			sv->timed = true;
			break;
		case SV_CONN_DETACHING:
		case SV_CONN_DETACHED:
			service_detaching(s, sv, &clk);
			break;
		case SV_CONN_NSTATES:
			break;
		}
	}
	if (hold && sv_stream_holding_first(s) && (!sv->next || hold < sv->next)) {
		sv->next = hold;
		sv->done = false;
	}
	sv_unlock(&s->lock);
}
