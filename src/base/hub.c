/* Wake-ups without a descriptor per connection: see hub.h. */
#include "hub.h"

#include "lock.h"
#include "log.h"
#include "ownfd.h"
#include "real.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/eventfd.h>

static struct {
	struct sv_lock lock;
	struct sv_hub_chan *chans[SV_HUB_MAX_CHANS];
	int nchans;
	struct sv_hub_sleeper *sleepers;
	struct sv_hub_sleeper *leader;  /* NULL: the next to begin leads */
	struct sv_hub_sleeper *designee; /* kicked to begin again and lead */
} hub = {.lock = SV_LOCK_INIT(SV_RANK_HUB)};

void sv_hub_lock(void)
{
	sv_lock(&hub.lock);
}

void sv_hub_unlock(void)
{
	sv_unlock(&hub.lock);
}

static void kick(struct sv_hub_sleeper *sl);
static void designate(void);

int sv_hub_chan_add(struct sv_hub_chan *c)
{
	int r = -ENOSPC;
	sv_lock(&hub.lock);
	if (hub.nchans < SV_HUB_MAX_CHANS) {
		hub.chans[hub.nchans++] = c;
		r = 0;
	}
	if (!r)
		designate(); /* those asleep began with nothing to lead */
	sv_unlock(&hub.lock);
	return r;
}

/* ---- Nodes and watches -------------------------------------------------- */

void sv_hub_fire(struct sv_hub_node *n)
{
	sv_lock_assert_held(&hub.lock);
	/* A watch's function may not detach (it runs under the lock). */
	for (struct sv_hub_watch *w = n->head; w; w = w->next)
		w->fn(w);
}

void sv_hub_notify(struct sv_hub_node *n)
{
	/* An attach that this misses comes after it, and the attacher then
	 * judges the stream itself (hub.h). */
	if (!atomic_load(&n->n))
		return;
	sv_lock(&hub.lock);
	sv_hub_fire(n);
	sv_unlock(&hub.lock);
}

void sv_hub_attach(struct sv_hub_node *n, struct sv_hub_watch *w)
{
	sv_lock(&hub.lock);
	w->node = n;
	w->prev = NULL;
	w->next = n->head;
	if (n->head)
		n->head->prev = w;
	n->head = w;
	atomic_fetch_add(&n->n, 1);
	sv_unlock(&hub.lock);
}

void sv_hub_detach(struct sv_hub_watch *w)
{
	if (!w->node)
		return;
	sv_lock(&hub.lock);
	struct sv_hub_node *n = w->node;
	if (w->prev)
		w->prev->next = w->next;
	else
		n->head = w->next;
	if (w->next)
		w->next->prev = w->prev;
	atomic_fetch_sub(&n->n, 1);
	w->node = NULL;
	w->prev = w->next = NULL;
	sv_unlock(&hub.lock);
}

static void kick(struct sv_hub_sleeper *sl)
{
	if (!sl->sleeping || sl->kicked || sl->efd < 0)
		return;
	sl->kicked = true;
	uint64_t one = 1;
	ssize_t r = SV_REAL(write)(sl->efd, &one, sizeof(one));
	(void)r; /* EAGAIN: it is signalled already */
}

void sv_hub_kick_fn(struct sv_hub_watch *w)
{
	kick(w->arg);
}

void sv_hub_kick(struct sv_hub_sleeper *sl)
{
	sv_lock_assert_held(&hub.lock);
	kick(sl);
}

/* Nobody leads the sleepers: kick one of them, which then begins again
 * and leads (a sleeper kicked already begins again anyway). */
static void designate(void)
{
	if (hub.leader || hub.designee)
		return;
	for (struct sv_hub_sleeper *o = hub.sleepers; o; o = o->next) {
		if (!o->kicked && o->efd >= 0 && !o->helper) {
			kick(o);
			hub.designee = o;
			return;
		}
	}
}

/* ---- The thread's eventfd ------------------------------------------------ */

static __thread int tls_efd __attribute__((tls_model("initial-exec"))) = -1;
static pthread_key_t efd_key;
static pthread_once_t efd_once = PTHREAD_ONCE_INIT;

static void efd_close(void *unused)
{
	(void)unused;
	if (tls_efd >= 0)
		sv_ownfd_close(tls_efd);
	tls_efd = -1;
}

static void efd_key_make(void)
{
	if (pthread_key_create(&efd_key, efd_close) != 0)
		sv_warn("hub: no thread-exit hook: a thread's wake-up eventfd outlives it");
}

int sv_hub_thread_fd(void)
{
	if (tls_efd >= 0)
		return tls_efd;
	pthread_once(&efd_once, efd_key_make);
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0)
		return -1;
	tls_efd = sv_ownfd_move(fd);
	pthread_setspecific(efd_key, (void *)1); /* non-NULL: the hook runs */
	return tls_efd;
}

/* ---- Sleepers --------------------------------------------------------------- */

static void begin(struct sv_hub_sleeper *sl, int efd, bool helper)
{
	*sl = (struct sv_hub_sleeper){.efd = efd, .sleeping = true, .helper = helper};
	sv_lock(&hub.lock);
	sl->next = hub.sleepers;
	if (hub.sleepers)
		hub.sleepers->prev = sl;
	hub.sleepers = sl;
	if (hub.nchans && !helper && !hub.leader) {
		hub.leader = sl;
		sl->leader = true;
	}
	sv_unlock(&hub.lock);
}

void sv_hub_sleep_begin(struct sv_hub_sleeper *sl, int efd)
{
	begin(sl, efd, false);
}

void sv_hub_sleep_begin_helper(struct sv_hub_sleeper *sl, int efd)
{
	begin(sl, efd, true);
}

int sv_hub_sleep_fds(struct sv_hub_sleeper *sl, struct pollfd *pfd)
{
	int n = 0;
	if (sl->efd >= 0)
		pfd[n++] = (struct pollfd){.fd = sl->efd, .events = POLLIN};
	if (!sl->leader)
		return n;
	/* Channels are only ever added; a leader polls those there are now
	 * (a newer one's first event is taken by the next). */
	sv_lock(&hub.lock);
	for (int i = 0; i < hub.nchans; i++)
		pfd[n++] = (struct pollfd){.fd = hub.chans[i]->fd, .events = POLLIN};
	sv_unlock(&hub.lock);
	return n;
}

static void drain_locked(void)
{
	for (int i = 0; i < hub.nchans; i++)
		hub.chans[i]->drain(hub.chans[i]);
}

void sv_hub_drain_unled(void)
{
	sv_lock(&hub.lock);
	if (!hub.leader)
		drain_locked();
	sv_unlock(&hub.lock);
}

bool sv_hub_sleep_end(struct sv_hub_sleeper *sl, const struct pollfd *pfd, int n)
{
	bool woken = false, chan = false;
	for (int i = 0; i < n; i++) {
		if (!(pfd[i].revents & (POLLIN | POLLERR)))
			continue;
		woken = true;
		chan = chan || pfd[i].fd != sl->efd;
	}
	sv_lock(&hub.lock);
	if (chan)
		drain_locked();
	if (sl->prev)
		sl->prev->next = sl->next;
	else
		hub.sleepers = sl->next;
	if (sl->next)
		sl->next->prev = sl->prev;
	sl->sleeping = false;
	if (hub.leader == sl)
		hub.leader = NULL;
	if (hub.designee == sl)
		hub.designee = NULL;
	designate();
	bool reset = sl->kicked;
	sv_unlock(&hub.lock);
	if (reset) {
		uint64_t v;
		ssize_t r = SV_REAL(read)(sl->efd, &v, sizeof(v));
		(void)r;
	}
	return woken;
}

void sv_hub_atfork_child(void)
{
	/* The parent's channels share their open files with the parent: their
	 * owner closes them (verbs_pd.c); the fork's thread's eventfd is the
	 * parent thread's. */
	sv_lock_reinit(&hub.lock);
	hub.nchans = 0;
	hub.sleepers = hub.leader = hub.designee = NULL;
	if (tls_efd >= 0)
		sv_ownfd_close(tls_efd);
	tls_efd = -1;
}
