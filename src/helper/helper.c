/* The helper thread: its start, its loop, rdma_cm's set-up and the work
 * that waits for it. The streams it watches are in helper_watch.c. */
#include "helper.h"
#include "helper_int.h"

#include "clock.h"
#include "cm.h"
#include "guard.h"
#include "hub.h"
#include "lock.h"
#include "log.h"
#include "ownfd.h"
#include "peers.h"
#include "pinned.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>

/* Idle streams on RDMA whose TCP sockets the helper's sleep watches for a
 * peer's resume record; more are looked at when their own calls come. */
#define SV_HELPER_TCP_WATCH 64
#include <sys/eventfd.h>

struct sv_helper_hooks sv_helper_hooks;

/* The modules above: rdma_cm's events and their lock (sv_helper_serve_cm),
 * each round's work (sv_helper_each_round). Set at their start, before
 * the thread runs; read-only after. */
static struct {
	void (*events)(struct rdma_event_channel *ch);
	void (*lock)(void), (*unlock)(void);
} cm_hooks;
#define SV_HELPER_ROUND_FNS 4
static uint64_t (*round_fn[2][SV_HELPER_ROUND_FNS])(uint64_t now);
static unsigned nround[2];

void sv_helper_serve_streams(const struct sv_helper_hooks *hooks)
{
	sv_helper_hooks = *hooks;
}

void sv_helper_serve_cm(void (*events)(struct rdma_event_channel *ch), void (*lock)(void),
			void (*unlock)(void))
{
	cm_hooks.events = events;
	cm_hooks.lock = lock;
	cm_hooks.unlock = unlock;
}

void sv_helper_each_round(enum sv_helper_phase phase, uint64_t (*fn)(uint64_t now))
{
	for (unsigned i = 0; i < nround[phase]; i++)
		if (round_fn[phase][i] == fn)
			return; /* a module's start, again */
	if (nround[phase] < SV_HELPER_ROUND_FNS)
		round_fn[phase][nround[phase]++] = fn;
	else
		sv_fatal("sv_helper_each_round: more than %d functions", SV_HELPER_ROUND_FNS);
}

static void cm_lock(void)
{
	if (cm_hooks.lock)
		cm_hooks.lock();
}

static void cm_unlock(void)
{
	if (cm_hooks.unlock)
		cm_hooks.unlock();
}

/* Work that needs rdma_cm, queued until the helper has it ready. */
struct job {
	void (*fn)(void *arg, int rdma_err);
	void *arg;
	struct job *next;
};

/* Channels opened before the current one whose ids could not all be moved
 * yet (the credentials changed again meanwhile): kept until they are. */
#define SV_OLD_CHANNELS 8

static struct {
	pthread_once_t once;
	int err;            /* the thread could not start */
	atomic_int rdma;    /* 0 starting, 1 ready, -errno: no rdma_cm here */
	_Atomic uint64_t ready_us; /* when rdma became 1 */
	/* Credential changes since the thread started (preload/creds.c). */
	atomic_uint cred_gen;
	/* Our rdma_cm files cannot follow the credentials (a new channel, or
	 * moving the ids to it, failed): RDMA is over for new connections. */
	atomic_bool creds_stale;
	struct sv_lock lock; /* jobs, started */
	struct job *jobs, **jobs_tail;
	pthread_t thread;
	/* Read by other threads (sv_helper_channel) until the first change,
	 * when the helper may replace it: atomic. */
	struct rdma_event_channel *_Atomic ch;
	unsigned ch_gen; /* the change h.ch was opened after (the helper's) */
	struct rdma_event_channel *old_ch[SV_OLD_CHANNELS];
	int nold;
	int wakefd;
	bool started; /* wakefd exists */
	int statfd;   /* sovia-stat's socket (helper_stat.c), -1: none */
	unsigned stat_gen; /* the credentials (cred_gen) it listens with */
} h = {.once = PTHREAD_ONCE_INIT, .lock = SV_LOCK_INIT(SV_RANK_HELPER), .jobs_tail = &h.jobs,
     .statfd = -1};

static __thread bool on_helper __attribute__((tls_model("initial-exec")));

void sv_helper_wake(void)
{
	uint64_t one = 1;
	ssize_t r = SV_REAL(write)(h.wakefd, &one, sizeof(one));
	(void)r;
}

int sv_helper_wake_fd(void)
{
	return h.started ? h.wakefd : -1;
}

struct rdma_event_channel *sv_helper_channel(void)
{
	return h.ch;
}

static void run_jobs(void)
{
	sv_lock(&h.lock);
	struct job *j = h.jobs;
	h.jobs = NULL;
	h.jobs_tail = &h.jobs;
	sv_unlock(&h.lock);
	int st = sv_helper_rdma_state();
	while (j) {
		struct job *n = j->next;
		j->fn(j->arg, st < 0 ? st : 0);
		free(j);
		j = n;
	}
}

/* A new rdma_cm event channel, non-blocking, libsovia's (ownfd.h); NULL
 * with errno set. */
static struct rdma_event_channel *open_channel(void)
{
	struct rdma_event_channel *ch = sv_cm->create_event_channel();
	if (!ch)
		return NULL;
	ch->fd = sv_ownfd_move(ch->fd); /* rdma_cm reads and closes it by this field */
	int fl = SV_REAL(fcntl)(ch->fd, F_GETFL);
	SV_REAL(fcntl)(ch->fd, F_SETFL, fl | O_NONBLOCK);
	SV_REAL(fcntl)(ch->fd, F_SETFD, FD_CLOEXEC);
	return ch;
}

/* rdma_cm's first use loads the device providers: slow (seconds under
 * emulation), so it happens here and never in the application's calls. */
static void init_rdma(void)
{
	h.ch_gen = atomic_load(&h.cred_gen);
	h.ch = open_channel(); /* a fork waits for it (cm_rdma.c) */
	if (!h.ch) {
		int err = errno ? -errno : -ENODEV;
		sv_info("no rdma_cm (%s): connections stay on TCP", strerror(-err));
		atomic_store(&h.rdma, err);
		return;
	}
	atomic_store(&h.ready_us, sv_now_us());
	atomic_store(&h.rdma, 1);
}

/* The kernel lets only the very credentials that opened an rdma_cm file
 * write to it, and every rdma_cm call is a write: after each credential
 * change (ftpd's seteuid around a data connection's bind) this thread
 * opens a new channel, which only it may use, and moves every id to it
 * (the move is a write to the new channel: the old one need not be
 * usable), listeners and connections alike, with their queued events.
 * The old channel is closed once it has no id left. Until then it is not
 * watched: the kernel reports it readable while events wait, yet refuses
 * to hand them over. */
static void follow_credentials(void)
{
	unsigned gen;
	bool again = false;
	while (h.ch && !atomic_load(&h.creds_stale) &&
	       ((gen = atomic_load(&h.cred_gen)) != h.ch_gen || again)) {
		again = false;
		struct rdma_event_channel *ch = open_channel();
		if (!ch || h.nold == SV_OLD_CHANNELS) {
			sv_info("rdma_cm cannot follow the credential change (%s): "
				"new connections stay on TCP",
				ch ? "too many changes in a row" : strerror(errno));
			if (ch)
				sv_cm->destroy_event_channel(ch);
			atomic_store(&h.creds_stale, true);
			return;
		}
		h.old_ch[h.nold++] = h.ch;
		h.ch = ch;
		h.ch_gen = gen;
		cm_lock(); /* no event of an id is in a hand meanwhile */
		int r = sv_cm->move_ids(ch);
		int err = errno;
		cm_unlock();
		if (r < 0 && err != EACCES) {
			sv_info("rdma_cm: moving to a new channel after a credential change: %s: "
				"new connections stay on TCP",
				strerror(err));
			atomic_store(&h.creds_stale, true);
			return;
		}
		if (r < 0) {
			/* The credentials changed again while we moved. The count
			 * may not say so yet: creds.c counts a change once the
			 * call returned, and glibc changed this thread's before. */
			again = true;
			continue;
		}
		while (h.nold > 0)
			sv_cm->destroy_event_channel(h.old_ch[--h.nold]);
		sv_dbg("rdma_cm: a new channel after credential change %u", gen);
	}
}

/* sovia-stat believes a view only from root or one of the process's
 * users, and the user SO_PEERCRED gives is the listener's euid at its last
 * listen(): after the process changed its credentials (a program that
 * became another user for good), listen again, as what the process is
 * now. The socket stays (no moment without the name, no asker dropped). */
static void follow_stat_credentials(void)
{
	unsigned gen = atomic_load(&h.cred_gen);
	if (gen == h.stat_gen || h.statfd < 0)
		return;
	h.stat_gen = gen;
	sv_stat_listen_again(h.statfd);
}

uint64_t sv_helper_rdma_ready_us(void)
{
	return atomic_load(&h.rdma) > 0 ? atomic_load(&h.ready_us) : 0;
}

int sv_helper_rdma_state(void)
{
	if (atomic_load(&h.creds_stale))
		return -EACCES;
	return atomic_load(&h.rdma);
}

bool sv_helper_creds_stale(void)
{
	return atomic_load(&h.creds_stale);
}

void sv_helper_creds_changed(const char *call)
{
	sv_lock(&h.lock);
	/* Before the helper thread exists nothing of RDMA is open yet: the
	 * thread and its files will share the new credentials. */
	bool counts = h.started;
	if (counts)
		atomic_fetch_add(&h.cred_gen, 1);
	sv_unlock(&h.lock);
	if (counts) {
		sv_dbg("the process changed its credentials (%s): rdma_cm follows", call);
		sv_helper_wake();
	}
}

bool sv_helper_may_call_cm(void)
{
	return on_helper || atomic_load(&h.cred_gen) == 0;
}

static struct job *new_job(void (*fn)(void *arg, int rdma_err), void *arg)
{
	struct job *j = malloc(sizeof(*j));
	if (j)
		*j = (struct job){.fn = fn, .arg = arg};
	return j;
}

/* At the end of the queue: jobs run in order. With h.lock. */
static void push_job(struct job *j)
{
	*h.jobs_tail = j;
	h.jobs_tail = &j->next;
}

int sv_helper_defer(void (*fn)(void *arg, int rdma_err), void *arg)
{
	struct job *j = new_job(fn, arg);
	if (!j)
		return -ENOMEM;
	sv_lock(&h.lock);
	bool ok = h.started;
	if (ok)
		push_job(j);
	sv_unlock(&h.lock);
	if (!ok) {
		free(j);
		return -ESRCH;
	}
	sv_helper_wake();
	return 0;
}

int sv_helper_when_ready(void (*fn)(void *arg, int rdma_err), void *arg)
{
	int st = sv_helper_rdma_state();
	/* After a credential change only the helper may call rdma_cm. */
	bool here = sv_helper_may_call_cm();
	if (st < 0 || (st > 0 && here))
		return st < 0 ? st : 1; /* the caller goes on at once */
	struct job *j = new_job(fn, arg);
	if (!j)
		return -ENOMEM;
	sv_lock(&h.lock);
	st = atomic_load(&h.rdma);
	if (st == 0 || (st > 0 && !here)) {
		push_job(j);
		st = 0;
	}
	sv_unlock(&h.lock);
	if (st != 0) {
		free(j);
		return st < 0 ? st : 1;
	}
	sv_helper_wake();
	return 0;
}

/* One sleep of the thread: on its wake fd, rdma_cm's channel and, while
 * a watched stream's CQ is armed for it, the hub (whose kicks and whose
 * watches' wake-ups come on the same wake fd). */
static void sleep_once(int timeout, bool on_hub)
{
	struct pollfd pfd[3 + SV_HUB_MAX_CHANS + SV_HELPER_TCP_WATCH];
	struct sv_hub_sleeper sl;
	int n = 0, nhub = 0;
	if (on_hub) {
		sv_hub_sleep_begin_helper(&sl, h.wakefd);
		nhub = sv_hub_sleep_fds(&sl, pfd);
		n = nhub;
		if (timeout < 0 || timeout > SV_HUB_HELPER_TICK_MS)
			timeout = SV_HUB_HELPER_TICK_MS;
	} else {
		pfd[n++] = (struct pollfd){.fd = h.wakefd, .events = POLLIN};
	}
	int cm = -1;
	/* After a credential change the kernel refuses the channel's events
	 * (ucma's write check) yet reports it readable while they are queued:
	 * watched, it would wake us at once, for ever. */
	if (h.ch && !atomic_load(&h.creds_stale) && h.ch_gen == atomic_load(&h.cred_gen)) {
		cm = n;
		pfd[n++] = (struct pollfd){.fd = h.ch->fd, .events = POLLIN};
	}
	int stat = -1;
	if (h.statfd >= 0) {
		stat = n;
		pfd[n++] = (struct pollfd){.fd = h.statfd, .events = POLLIN};
	}
	int tcp_at = n;
	n += sv_watch_tcp_fds(&pfd[n], SV_HELPER_TCP_WATCH);
	int r = SV_REAL(poll)(pfd, (nfds_t)n, timeout);
	for (int i = tcp_at; r > 0 && i < n; i++)
		if (pfd[i].revents)
			sv_watch_kick_fd(pfd[i].fd);
	if (on_hub) {
		sv_hub_sleep_end(&sl, pfd, nhub);
		sv_hub_drain_unled(); /* nobody else will: it stands in */
	}
	follow_credentials();
	run_jobs();
	if (r <= 0)
		return;
	if (pfd[0].revents & POLLIN) {
		uint64_t v;
		ssize_t rr = SV_REAL(read)(h.wakefd, &v, sizeof(v));
		(void)rr;
	}
	if (cm >= 0 && (pfd[cm].revents & POLLIN) && cm_hooks.events)
		cm_hooks.events(h.ch);
	if (stat >= 0 && (pfd[stat].revents & POLLIN))
		sv_stat_serve(h.statfd);
}

/* The round's work of one phase (sv_helper_each_round): the earliest
 * deadline it gave, 0: none. */
static uint64_t rounds(enum sv_helper_phase phase, uint64_t now)
{
	uint64_t next = 0;
	for (unsigned i = 0; i < nround[phase]; i++) {
		uint64_t d = round_fn[phase][i](now);
		if (d && (!next || d < next))
			next = d;
	}
	return next;
}

static void *helper_main(void *arg)
{
	(void)arg;
	sv_enter(); /* the libraries this thread calls go straight to libc */
	on_helper = true;
	sv_lock_go_first(); /* lock.h: the application's calls give way to it */
	/* rdma_cm's start and the note of how long it took are one step for
	 * a fork (cm.h): a child forked in between (a prefork server forks
	 * while we start) would judge a first contact by its own start-up,
	 * a few ms with its parent's libraries loaded (stream_switch.c), and
	 * open a peer table of its own instead of sharing its parent's. */
	sv_cm_calls_enter();
	/* Before rdma_cm: a process without RDMA has connections to show too
	 * (each with its fallback reason). Inside the step a fork waits for,
	 * so that a child never gets the socket before h.statfd names it
	 * (its atfork handler closes it). */
	h.statfd = sv_stat_open();
	h.stat_gen = atomic_load(&h.cred_gen);
	if (h.statfd < 0)
		sv_dbg("helper: no view for sovia-stat (%s)", strerror(-h.statfd));
	uint64_t t0 = sv_now_us();
	init_rdma();
	uint64_t took = sv_now_us() - t0;
	if (atomic_load(&h.rdma) > 0)
		sv_peers_note_startup(took > UINT32_MAX ? UINT32_MAX : (uint32_t)took);
	sv_cm_calls_leave();
	sv_dbg("helper: rdma_cm %s after %llu ms", atomic_load(&h.rdma) > 0 ? "ready" : "unusable",
	       (unsigned long long)(took / 1000));
	follow_credentials();
	run_jobs();
	for (;;) {
		follow_credentials(); /* before any rdma_cm call of this round */
		follow_stat_credentials();
		uint64_t now = sv_now_us();
		bool on_hub = false;
		uint64_t first = rounds(SV_HELPER_BEFORE_LOOKS, now);
		uint64_t next = sv_watch_service_all(now, &on_hub);
		uint64_t last = rounds(SV_HELPER_AFTER_LOOKS, now);
		if (last && (!next || last < next))
			next = last;
		if (first && (!next || first < next))
			next = first;
		int timeout = -1;
		if (next) {
			now = sv_now_us();
			timeout = next > now ? (int)((next - now + 999) / 1000) : 0;
		}
		sleep_once(timeout, on_hub);
	}
	return NULL;
}

static void start_once(void)
{
	sv_enter();
	h.wakefd = sv_ownfd_move(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	if (h.wakefd < 0) {
		h.err = -errno;
		goto out;
	}
	sv_pinned_on_room(sv_helper_wake); /* connections waiting for room ask again */
	sv_lock(&h.lock);
	h.started = true;
	sv_unlock(&h.lock);

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

void sv_helper_atfork_child(void)
{
	/* The parent's thread, lists and rdma_cm channel are not ours: the
	 * channel's fd is closed (a shared channel would hand our events to
	 * the parent), and everything starts afresh on first use. */
	if (h.ch)
		sv_ownfd_close(h.ch->fd);
	sv_watch_atfork_child();
	if (h.started)
		sv_ownfd_close(h.wakefd);
	if (h.statfd >= 0)
		sv_ownfd_close(h.statfd); /* answered for the parent's pid */
	h.statfd = -1;
	h.started = false;
	sv_lock_reinit(&h.lock);
	h.once = (pthread_once_t)PTHREAD_ONCE_INIT;
	h.err = 0;
	atomic_store(&h.rdma, 0);
	atomic_store(&h.ready_us, 0);
	atomic_store(&h.creds_stale, false); /* nothing of RDMA is open here yet */
	atomic_store(&h.cred_gen, 0);
	for (int i = 0; i < h.nold; i++)
		sv_ownfd_close(h.old_ch[i]->fd);
	h.nold = 0;
	h.ch_gen = 0;
	on_helper = false; /* the thread that forked may have been the helper: no */
	h.jobs = NULL;
	h.jobs_tail = &h.jobs;
	h.ch = NULL;
	h.wakefd = -1;
}
