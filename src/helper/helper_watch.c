/* The streams the helper thread watches, and when it looks at each: the
 * policy of docs/design.md ("The helper thread"). A stream whose
 * application calls in (or sleeps inside libsovia) is left to it and only
 * looked at now and then, the interval doubling while it stays active; an
 * idle one is armed and slept on; one that only its clock moves (the
 * upgrade's steps, whose rdma_cm events kick it, a switch, a lingering
 * close) is looked at by its deadline or when kicked, so a burst of
 * hundreds of new connections costs each wake-up nothing per connection;
 * everything else is looked at on every wake-up and by its own deadline.
 * The mechanism of each look is the stream's (stream_service.c). */
#include "helper_int.h"

#include <poll.h>

#include "clock.h"
#include "hub.h"
#include "lock.h"
#include "log.h"

#include <stdatomic.h>
#include <stdlib.h>

/* The first look at a stream its active application drives comes after
 * SV_HELPER_LOOK_US; each look that finds it still active doubles the
 * interval, up to SV_HELPER_LOOK_MAX_US. Each look costs the process a
 * wake-up and the stream's lock. */
#define SV_HELPER_LOOK_US 1000u
#define SV_HELPER_LOOK_MAX_US 16000u

struct sv_watch {
	struct sv_stream *s;
	struct sv_watch *next;
	uint64_t due;        /* idle watches: the next look (0 = none) */
	bool idle;           /* looked at only when due, fired or kicked: driven by
			      * its application, or moved only by its clock */
	atomic_bool kick;    /* sv_helper_watch asked for a look now */
	uint32_t look_us;    /* the interval while the application stays active;
			      * 0 after it was found idle */
	/* On the stream's node (hub.h), attached at the first look. While
	 * cq_armed, the stream's next change or completion sets `fired` and
	 * wakes the helper (once per arming). */
	struct sv_hub_watch hw;
	atomic_bool cq_armed, fired;
	int tcp_fd; /* idle on RDMA: its TCP socket to watch (-1: none) */
};

static struct sv_lock watch_lock = SV_LOCK_INIT(SV_RANK_HELPER);
static struct sv_watch *watches; /* under watch_lock */

/* Watches let go of, whose streams' last references (their QPs' and
 * buffers' destruction: milliseconds each under emulation) wait for the
 * helper's next passes, SV_HELPER_BURY_US of them at a time: when
 * hundreds of connections close at once and as many open, the new ones'
 * rdma_cm events are handled between them rather than after them all.
 * The helper thread's own. */
static struct sv_watch *dying;
#define SV_HELPER_BURY_US 2000u

/* The helper is inside a look: the changes it makes itself (a look wakes
 * the stream's waiters) must not fire its own watch, or it would look
 * again at once, for ever. */
static __thread bool in_look __attribute__((tls_model("initial-exec")));

/* Under the hub's lock. */
static void watch_fn(struct sv_hub_watch *hw)
{
	struct sv_watch *w = hw->arg;
	if (in_look)
		return;
	if (!atomic_exchange(&w->cq_armed, false))
		return; /* the application drives it: its own calls see this */
	atomic_store(&w->fired, true);
	sv_helper_wake();
}

void sv_helper_watch(struct sv_stream *s)
{
	if (sv_helper_start() < 0)
		return;
	sv_lock(&watch_lock);
	struct sv_watch **slot = sv_helper_hooks.watch_slot(s);
	struct sv_watch *w = *slot;
	if (w) {
		/* Watched already (its watch may be out of the list while the
		 * helper services it): have it looked at now. */
		atomic_store(&w->kick, true);
	} else if ((w = calloc(1, sizeof(*w)))) {
		sv_helper_hooks.get(s);
		*slot = w;
		w->s = s;
		w->hw = (struct sv_hub_watch){.fn = watch_fn, .arg = w};
		w->tcp_fd = -1;
		w->next = watches;
		watches = w;
	}
	sv_unlock(&watch_lock);
	sv_helper_wake();
}

/* Let go of a watch the stream needs no more, unless sv_helper_watch asked
 * for it again meanwhile (judged under watch_lock, where it asks): then it
 * stays, and the kick makes the next round look. */
static bool watch_free(struct sv_watch *w)
{
	sv_lock(&watch_lock);
	bool again = atomic_load(&w->kick);
	if (!again)
		*sv_helper_hooks.watch_slot(w->s) = NULL;
	sv_unlock(&watch_lock);
	if (again)
		return false;
	sv_hub_detach(&w->hw);
	w->next = dying;
	dying = w;
	return true;
}

/* Drop the dying watches' references, for about SV_HELPER_BURY_US (at
 * least one); the rest wait for the next pass. */
static void bury(void)
{
	uint64_t until = sv_now_us() + SV_HELPER_BURY_US;
	while (dying) {
		struct sv_watch *w = dying;
		dying = w->next;
		sv_helper_hooks.put(w->s);
		free(w);
		if (sv_now_us() >= until)
			break;
	}
}

/* The next look at a stream whose active application drives it. Coalesced
 * bytes waiting for their timer keep it near that deadline (at least
 * SV_HELPER_LOOK_US away): should the application stop calling before it,
 * the helper flushes them. */
static uint64_t active_look(struct sv_watch *w, uint64_t now, uint64_t flush)
{
	uint32_t look = w->look_us ? w->look_us * 2 : SV_HELPER_LOOK_US;
	w->look_us = look < SV_HELPER_LOOK_MAX_US ? look : SV_HELPER_LOOK_MAX_US;
	uint64_t next = now + w->look_us;
	if (flush) {
		uint64_t soon = flush > now + SV_HELPER_LOOK_US ? flush : now + SV_HELPER_LOOK_US;
		if (soon < next)
			next = soon;
	}
	return next;
}

/* Look at one stream. Returns its next deadline; *done when it needs the
 * helper no more. */
static uint64_t look(struct sv_watch *w, uint64_t now, bool kicked, bool *done)
{
	if (!w->hw.node)
		sv_hub_attach(sv_helper_hooks.node(w->s), &w->hw);
	bool fired = atomic_exchange(&w->fired, false);
	struct sv_service sv = {
		.now = now,
		.fired = fired,
		.try_only = w->look_us && !fired && !kicked,
	};
	/* Set before the service may arm the CQ: its completion may come
	 * (and be drained by another thread) before the service returns. */
	atomic_store(&w->cq_armed, true);
	in_look = true;
	sv_helper_hooks.service(w->s, &sv);
	in_look = false;
	if (!sv.armed || sv.done)
		atomic_store(&w->cq_armed, false);
	w->idle = sv.driven || sv.timed;
	w->tcp_fd = sv.armed ? sv.tcp_fd : -1;
	uint64_t next = sv.next;
	if (sv.driven && sv.active) {
		next = active_look(w, now, sv.flush_deadline);
	} else if (sv.driven) {
		w->look_us = 0; /* when it calls in again, look often at first */
		if (!sv.armed && !next)
			next = now + SV_HELPER_LOOK_US; /* could not arm: look by the clock */
	}
	*done = sv.done;
	return next;
}

uint64_t sv_watch_service_all(uint64_t now, bool *on_hub)
{
	uint64_t next = 0;
	bury();
	sv_lock(&watch_lock);
	struct sv_watch *list = watches;
	watches = NULL;
	sv_unlock(&watch_lock);

	struct sv_watch *keep = NULL;
	while (list) {
		struct sv_watch *w = list;
		list = list->next;
		bool kicked = atomic_exchange(&w->kick, false);
		uint64_t d = w->due;
		if (!w->idle || kicked || atomic_load(&w->fired) || (w->due && w->due <= now)) {
			bool done;
			d = look(w, now, kicked, &done);
			w->due = d;
			/* A stream that asked to be watched again while it was
			 * being serviced (it started its upgrade) stays. */
			if (done && watch_free(w))
				continue;
			if (done)
				w->idle = false;
		}
		if (d && (!next || d < next))
			next = d;
		/* Fired while it was looked at: look again at once. */
		if (atomic_load(&w->fired))
			next = now;
		*on_hub = *on_hub || atomic_load(&w->cq_armed);
		w->next = keep;
		keep = w;
	}
	sv_lock(&watch_lock);
	while (keep) {
		struct sv_watch *w = keep;
		keep = keep->next;
		w->next = watches;
		watches = w;
	}
	sv_unlock(&watch_lock);
	if (dying)
		next = now; /* bury them after the events that came meanwhile */
	return next;
}

int sv_watch_tcp_fds(struct pollfd *out, int max)
{
	int n = 0;
	sv_lock(&watch_lock);
	for (struct sv_watch *w = watches; w && n < max; w = w->next)
		if (w->tcp_fd >= 0)
			out[n++] = (struct pollfd){.fd = w->tcp_fd, .events = POLLIN};
	sv_unlock(&watch_lock);
	return n;
}

void sv_watch_kick_fd(int fd)
{
	sv_lock(&watch_lock);
	for (struct sv_watch *w = watches; w; w = w->next)
		if (w->tcp_fd == fd)
			atomic_store(&w->kick, true);
	sv_unlock(&watch_lock);
}

void sv_watch_atfork_child(void)
{
	/* The parent's watches stay the parent's: the list is forgotten (its
	 * streams are the parent's, and so is the hub's state). */
	sv_lock_reinit(&watch_lock);
	watches = NULL;
	dying = NULL;
}
