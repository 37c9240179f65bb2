#include "real.h"
#include "helper.h"

#include "guard.h"
#include "log.h"
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

atomic_bool sv_exiting;

/* A watched stream. */
struct watch {
	struct sv_stream *s;
	struct watch *next;
	uint64_t due;          /* idle watches: the next look (0 = none) */
	bool idle;             /* looked at only when due, fired or kicked */
	struct sv_watch_io io; /* io.chan: our copy of its completion channel */
	bool chan_in_epoll;
};

/* epoll data of the helper's own fds; any other value is a struct watch. */
#define EV_WAKE 1u
#define EV_CM 2u


/* Work that needs rdma_cm, queued until the helper has it ready. */
struct job {
	void (*fn)(void *arg, int rdma_err);
	void *arg;
	struct job *next;
};

static struct {
	pthread_once_t once;
	int err;            /* the thread could not start */
	atomic_int rdma;    /* 0 starting, 1 ready, -errno: no rdma_cm here */
	/* The process changed credentials while the helper ran: our RDMA
	 * files are no longer usable (preload/creds.c). */
	atomic_bool creds_stale;
	struct job *jobs;   /* under lock */
	pthread_t thread;
	pthread_mutex_t lock; /* the watch list */
	struct rdma_event_channel *ch;
	int epfd, wakefd;
	struct watch *watches;
	bool started; /* epfd and wakefd exist */
} h = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void wake_helper(void)
{
	uint64_t one = 1;
	ssize_t r = SV_REAL(write)(h.wakefd, &one, sizeof(one));
	(void)r;
}

void sv_helper_watch(struct sv_stream *s)
{
	if (sv_helper_start() < 0)
		return;
	pthread_mutex_lock(&h.lock);
	if (s->helper_watched) {
		/* Watched already (its watch may be out of the list while the
		 * helper services it): have it looked at now. */
		atomic_store(&s->helper_kick, true);
		pthread_mutex_unlock(&h.lock);
		wake_helper();
		return;
	}
	struct watch *w = calloc(1, sizeof(*w));
	if (w) {
		sv_stream_get(s);
		s->helper_watched = true;
		w->s = s;
		w->io.chan = w->io.chan_of = -1;
		w->next = h.watches;
		h.watches = w;
	}
	pthread_mutex_unlock(&h.lock);
	wake_helper();
}

/* Sleep on (or stop sleeping on) a watch's completion channel copy. */
static void chan_update(struct watch *w, int old_chan)
{
	if (old_chan >= 0 && old_chan != w->io.chan) {
		if (w->chan_in_epoll)
			SV_REAL(epoll_ctl)(h.epfd, EPOLL_CTL_DEL, old_chan, NULL);
		SV_REAL(close)(old_chan);
		w->chan_in_epoll = false;
	}
	if (!w->io.armed || w->io.chan < 0)
		return;
	/* One-shot: the application's own traffic wakes the helper at most
	 * once per arming; it arms again only when the stream is idle. */
	struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = w};
	if (SV_REAL(epoll_ctl)(h.epfd, w->chan_in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, w->io.chan, &e) == 0)
		w->chan_in_epoll = true;
	else
		sv_dbg("helper: epoll_ctl on a completion channel: %s", strerror(errno));
}

static void watch_free(struct watch *w)
{
	if (w->io.chan >= 0) {
		if (w->chan_in_epoll)
			SV_REAL(epoll_ctl)(h.epfd, EPOLL_CTL_DEL, w->io.chan, NULL);
		SV_REAL(close)(w->io.chan);
	}
	pthread_mutex_lock(&h.lock);
	w->s->helper_watched = false;
	pthread_mutex_unlock(&h.lock);
	sv_stream_put(w->s);
	free(w);
}

struct rdma_event_channel *sv_helper_channel(void)
{
	return h.ch;
}

/* Service every watched stream; drop those that are done. */
static uint64_t service_all(uint64_t now)
{
	uint64_t next = 0;
	pthread_mutex_lock(&h.lock);
	struct watch *list = h.watches;
	h.watches = NULL;
	pthread_mutex_unlock(&h.lock);

	struct watch *keep = NULL;
	while (list) {
		struct watch *w = list;
		list = list->next;
		bool kicked = atomic_exchange(&w->s->helper_kick, false);
		uint64_t d = w->due;
		if (!w->idle || kicked || w->io.fired || (w->due && w->due <= now)) {
			bool done;
			int old_chan = w->io.chan;
			w->io.kicked = kicked;
			d = sv_stream_service(w->s, now, &done, &w->io);
			w->io.fired = false;
			w->idle = w->io.idle;
			w->due = d;
			/* A stream that asked to be watched again while it was
			 * being serviced (it started its upgrade) stays. */
			if (done && atomic_exchange(&w->s->helper_kick, false)) {
				done = false;
				w->idle = false;
			}
			if (done) {
				w->io.armed = false;
				chan_update(w, old_chan);
				watch_free(w);
				continue;
			}
			chan_update(w, old_chan);
		}
		if (d && (!next || d < next))
			next = d;
		w->next = keep;
		keep = w;
	}
	pthread_mutex_lock(&h.lock);
	while (keep) {
		struct watch *w = keep;
		keep = keep->next;
		w->next = h.watches;
		h.watches = w;
	}
	pthread_mutex_unlock(&h.lock);
	return next;
}

static void run_jobs(void)
{
	pthread_mutex_lock(&h.lock);
	struct job *j = h.jobs;
	h.jobs = NULL;
	pthread_mutex_unlock(&h.lock);
	int st = sv_helper_rdma_state();
	while (j) {
		struct job *n = j->next;
		j->fn(j->arg, st < 0 ? st : 0);
		free(j);
		j = n;
	}
}

/* rdma_cm's first use loads the device providers: slow (seconds under
 * emulation), so it happens here and never in the application's calls. */
static void init_rdma(void)
{
	h.ch = rdma_create_event_channel();
	if (!h.ch) {
		int err = errno ? -errno : -ENODEV;
		sv_info("no rdma_cm (%s): connections stay on TCP", strerror(-err));
		atomic_store(&h.rdma, err);
		return;
	}
	int fl = SV_REAL(fcntl)(h.ch->fd, F_GETFL);
	SV_REAL(fcntl)(h.ch->fd, F_SETFL, fl | O_NONBLOCK);
	SV_REAL(fcntl)(h.ch->fd, F_SETFD, FD_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN, .data.u64 = EV_CM};
	SV_REAL(epoll_ctl)(h.epfd, EPOLL_CTL_ADD, h.ch->fd, &e);
	atomic_store(&h.rdma, 1);
}

int sv_helper_rdma_state(void)
{
	if (atomic_load(&h.creds_stale))
		return -EACCES;
	return atomic_load(&h.rdma);
}

void sv_helper_creds_changed(const char *call)
{
	pthread_mutex_lock(&h.lock);
	/* Before the helper thread exists nothing of RDMA is open yet: the
	 * thread and its files will share the new credentials. */
	bool stale = h.started && !atomic_load(&h.creds_stale);
	if (stale)
		atomic_store(&h.creds_stale, true);
	pthread_mutex_unlock(&h.lock);
	if (stale)
		sv_info("the process changed its credentials (%s) after libsovia opened RDMA: "
			"new connections stay on TCP", call);
}

enum sv_fallback sv_helper_no_rdma_reason(void)
{
	return atomic_load(&h.creds_stale) ? SV_FB_CREDENTIALS : SV_FB_DISABLED;
}

int sv_helper_when_ready(void (*fn)(void *arg, int rdma_err), void *arg)
{
	int st = sv_helper_rdma_state();
	if (st != 0)
		return st < 0 ? st : 1; /* the caller goes on at once */
	struct job *j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&h.lock);
	st = atomic_load(&h.rdma);
	if (st == 0) {
		j->next = h.jobs;
		h.jobs = j;
	}
	pthread_mutex_unlock(&h.lock);
	if (st != 0) {
		free(j);
		return st < 0 ? st : 1;
	}
	wake_helper();
	return 0;
}

static void *helper_main(void *arg)
{
	(void)arg;
	sv_enter(); /* everything this thread calls goes straight to libc */
	pthread_mutex_lock(&h.lock);
	init_rdma();
	pthread_mutex_unlock(&h.lock);
	run_jobs();
	for (;;) {
		uint64_t now = sv_now_us();
		uint64_t next = service_all(now);
		uint64_t up = sv_upgrade_timers(now);
		if (up && (!next || up < next))
			next = up;
		int timeout = -1;
		if (next) {
			now = sv_now_us();
			timeout = next > now ? (int)((next - now + 999) / 1000) : 0;
		}
		struct epoll_event evs[16];
		int n = SV_REAL(epoll_wait)(h.epfd, evs, 16, timeout);
		run_jobs();
		for (int i = 0; i < n; i++) {
			if (evs[i].data.u64 == EV_WAKE) {
				uint64_t v;
				ssize_t r = SV_REAL(read)(h.wakefd, &v, sizeof(v));
				(void)r;
			} else if (evs[i].data.u64 == EV_CM) {
				if (h.ch)
					sv_upgrade_events(h.ch);
			} else {
				/* A watch's channel: it is serviced next round (the
				 * watch is freed only there, after leaving epoll). */
				struct watch *w = evs[i].data.ptr;
				w->io.fired = true;
			}
		}
	}
	return NULL;
}

static void start_once(void)
{
	sv_enter();
	h.epfd = epoll_create1(EPOLL_CLOEXEC);
	h.wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (h.epfd < 0 || h.wakefd < 0) {
		h.err = -errno;
		goto out;
	}
	h.started = true;
	struct epoll_event e = {.events = EPOLLIN, .data.u64 = EV_WAKE};
	SV_REAL(epoll_ctl)(h.epfd, EPOLL_CTL_ADD, h.wakefd, &e);

	/* The helper must not take signals meant for the application. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int r = pthread_create(&h.thread, NULL, helper_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		h.err = -r;
		goto out;
	}
	pthread_detach(h.thread);
out:
	if (h.err)
		atomic_store(&h.rdma, h.err);
	sv_leave();
}

int sv_helper_start(void)
{
	pthread_once(&h.once, start_once);
	return h.err;
}

void sv_helper_exit_flush(void)
{
	atomic_store(&sv_exiting, true);
	sv_stream_exit_flush_all();
}

void sv_helper_atfork_child(void)
{
	/* The parent's thread, lists and rdma_cm channel are not ours: the
	 * lists are left (their streams belong to the parent), the channel's
	 * fd is closed (a shared channel would hand our events to the
	 * parent), and everything starts afresh on first use. */
	if (h.ch)
		SV_REAL(close)(h.ch->fd);
	for (struct watch *w = h.watches; w; w = w->next)
		if (w->io.chan >= 0)
			SV_REAL(close)(w->io.chan); /* the parent's copies */
	if (h.started) {
		SV_REAL(close)(h.epfd);
		SV_REAL(close)(h.wakefd);
	}
	h.started = false;
	pthread_mutex_init(&h.lock, NULL);
	h.once = (pthread_once_t)PTHREAD_ONCE_INIT;
	h.err = 0;
	atomic_store(&h.rdma, 0);
	atomic_store(&h.creds_stale, false); /* nothing of RDMA is open here yet */
	h.jobs = NULL;
	h.ch = NULL;
	h.epfd = h.wakefd = -1;
	h.watches = NULL;
}
