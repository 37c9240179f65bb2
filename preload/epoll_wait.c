/* epoll_wait served by libsovia: judge what is on the set's ready list
 * (and its TCP list), report it by the entries' rules, and sleep on the
 * kernel's set, the TCP sockets that count and the hub (epoll.c). */
#include "epoll_int.h"

#include "clock.h"
#include "guard.h"
#include "preload.h"
#include "real.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static int64_t now_ms(void)
{
	return (int64_t)(sv_now_us() / 1000);
}

#define ALWAYS_BITS (EPOLLERR | EPOLLHUP)

/* One entry judged in a round. */
struct judged {
	struct ep_entry *e; /* a reference */
	uint32_t want;      /* what its rule watches for (0: nothing now) */
	short own, kernel;  /* libsovia's ready bits; what the kernel answers */
	uint64_t gen;
	int at;             /* its TCP socket in the round's poll set, or -1 */
};

/* One round of a wait: the entries to judge, and the poll set of their
 * TCP sockets. */
struct round {
	struct judged *j;
	unsigned nj, cap;
	struct pollfd *pfd;
	unsigned np;
};

static void round_free(struct round *r)
{
	for (unsigned i = 0; i < r->nj; i++)
		sv_ep_entry_put(r->j[i].e);
	free(r->j);
	free(r->pfd);
	*r = (struct round){0};
}

static int round_add(struct round *r, struct ep_entry *e)
{
	if (r->nj == r->cap) {
		unsigned cap = r->cap ? r->cap * 2 : 16;
		struct judged *j = realloc(r->j, cap * sizeof(*j));
		if (!j)
			return -ENOMEM;
		r->j = j;
		r->cap = cap;
	}
	r->j[r->nj++] = (struct judged){.e = e, .at = -1};
	return 0;
}

/* Gather the round's entries: the ready list's and the TCP list's, each
 * once, with a reference. Under ep->lock. 0 or -ENOMEM. */
static int round_gather(struct sv_ep *ep, struct round *r)
{
	unsigned round = ++ep->round;
	int err = 0;
	for (struct ep_entry *e = sv_ep_ready_take(ep), *next; e; e = next) {
		next = e->taken_next;
		if (e->dead || e->round == round || err) {
			sv_ep_entry_put(e); /* the list's reference */
			continue;
		}
		e->round = round;
		err = round_add(r, e); /* takes over the list's reference */
		if (err)
			sv_ep_entry_put(e);
	}
	for (struct ep_entry *e = ep->tcp; e && !err; e = e->tnext) {
		if (e->round == round)
			continue;
		e->round = round;
		atomic_fetch_add(&e->refs, 1);
		err = round_add(r, e);
		if (err)
			sv_ep_entry_put(e);
	}
	if (!err) {
		r->pfd = calloc(r->nj ? r->nj : 1, sizeof(*r->pfd));
		err = r->pfd ? 0 : -ENOMEM;
	}
	if (err) {
		/* Judged by no one now: back on the list for the next wait. */
		for (unsigned i = 0; i < r->nj; i++)
			sv_ep_ready_push(ep, r->j[i].e);
	}
	return err;
}

/* Judge each entry (libsovia's part now; the kernel's TCP sockets polled
 * once, without sleeping). Under ep->lock. */
static void round_judge(struct sv_ep *ep, struct round *r)
{
	r->np = 0;
	for (unsigned i = 0; i < r->nj; i++) {
		struct judged *j = &r->j[i];
		struct ep_entry *e = j->e;
		if (e->dead)
			continue;
		if (sv_ep_kernel_only(e)) {
			sv_ep_migrate(ep, e);
			continue;
		}
		struct sv_marks m;
		sv_ep_marks_of(e, &m);
		j->want = sv_ep_rule_watch(&e->rule, &m);
		if (!j->want)
			continue;
		short ev = (short)(j->want & ~ALWAYS_BITS);
		e->f->ops->wait->split(e->f, ev, &j->own, &j->kernel, &j->gen);
		if (j->kernel) {
			j->at = (int)r->np;
			r->pfd[r->np++] = (struct pollfd){.fd = e->fd, .events = j->kernel};
		}
	}
	if (r->np)
		sv_real.poll(r->pfd, r->np, 0);
}

/* One entry's ready bits after the judgement, as poll.c's collect. */
static short judged_rev(struct round *r, struct judged *j)
{
	struct ep_entry *e = j->e;
	short ev = (short)(j->want & ~ALWAYS_BITS), rev = j->own;
	if (j->at < 0)
		return rev;
	short k = r->pfd[j->at].revents;
	rev |= k;
	short mine = (short)(ev & ~j->kernel);
	/* The kernel's hang-up while libsovia answers for reading: read. */
	if ((mine & POLLIN) && (k & (POLLHUP | POLLRDHUP)))
		rev |= ev & (POLLIN | POLLRDNORM);
	/* TCP bytes that may be only a completed switch's echo. */
	if ((j->kernel & POLLIN) && (k & (POLLIN | POLLRDNORM)))
		rev = e->f->ops->wait->recheck(e->f, ev, rev);
	return rev;
}

/* Report the round's entries by their rules into evs (up to max), put
 * back the level-triggered ones still ready, and arm the others' CQs
 * (with `spin`, put them back instead: the next round looks again
 * without sleeping). Under ep->lock. Returns the count reported. */
static int round_report(struct sv_ep *ep, struct round *r, struct epoll_event *evs, int max,
			bool spin)
{
	int count = 0;
	for (unsigned i = 0; i < r->nj; i++) {
		struct judged *j = &r->j[i];
		struct ep_entry *e = j->e;
		if (e->dead)
			continue;
		uint32_t bits = 0;
		if (j->want) {
			if (count == max) {
				sv_ep_ready_push(ep, e); /* no room: the next wait */
				continue;
			}
			struct sv_marks m;
			sv_ep_marks_of(e, &m);
			bits = sv_ep_rule_report(&e->rule, (uint16_t)judged_rev(r, j), &m);
		}
		if (bits) {
			evs[count++] = (struct epoll_event){.events = bits, .data = e->data};
			if (!(e->rule.events & (EPOLLET | EPOLLONESHOT))) {
				sv_ep_ready_push(ep, e); /* level-triggered: judged again next time */
				continue;
			}
		}
		/* Coalesced bytes go out before the application waits. */
		if (!bits)
			e->f->ops->wait->waits(e->f);
		if (spin) {
			sv_ep_ready_push(ep, e);
			continue;
		}
		short tcp = 0;
		if (e->f->ops->wait->arm(e->f, j->gen, &tcp))
			sv_ep_ready_push(ep, e); /* changed meanwhile */
		sv_ep_tcp_update(ep, e, (short)(j->kernel | tcp));
	}
	return count;
}

/* Poll without sleeping first, as long as the longest spin of the
 * round's streams (sv_stream_spin_us); 0: none. */
static uint64_t round_spin(struct round *r)
{
	uint32_t spin = 0;
	for (unsigned i = 0; i < r->nj; i++) {
		struct ep_entry *e = r->j[i].e;
		uint32_t us = e->dead ? 0 : e->f->ops->wait->spin_us(e->f);
		spin = us > spin ? us : spin;
	}
	return spin;
}

/* Sleep until something may have changed: the kernel's set, a TCP
 * socket on the TCP list, or a kick (an entry went on the ready list).
 * 0 or -errno. */
static int ep_sleep(struct sv_ep *ep, int timeout_ms, const sigset_t *mask)
{
	sv_lock(&ep->lock);
	unsigned n = 1 + ep->ntcp;
	struct pollfd *pfd = calloc(n + 1 + SV_HUB_MAX_CHANS, sizeof(*pfd));
	if (!pfd) {
		sv_unlock(&ep->lock);
		return -ENOMEM;
	}
	pfd[0] = (struct pollfd){.fd = ep->epfd, .events = POLLIN};
	n = 1;
	for (struct ep_entry *e = ep->tcp; e; e = e->tnext)
		pfd[n++] = (struct pollfd){.fd = e->fd, .events = e->tcp_events};
	sv_unlock(&ep->lock);

	struct ep_sleeper z;
	sv_hub_sleep_begin(&z.sl, sv_hub_thread_fd());
	sv_lock(&ep->rlock);
	bool ready = ep->ready != NULL;
	if (!ready) {
		z.next = ep->sleepers;
		ep->sleepers = &z;
	}
	sv_unlock(&ep->rlock);
	int nhub = 0, r = 0, err = 0;
	if (!ready) {
		nhub = sv_hub_sleep_fds(&z.sl, &pfd[n]);
		if (z.sl.efd < 0 && (timeout_ms < 0 || timeout_ms > SV_HUB_TICK_MS))
			timeout_ms = SV_HUB_TICK_MS; /* nothing can kick us */
		nfds_t all = (nfds_t)(n + (unsigned)nhub);
		if (!mask) {
			r = sv_real.poll(pfd, all, timeout_ms);
		} else {
			struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
			r = sv_real.ppoll(pfd, all, timeout_ms < 0 ? NULL : &ts, mask);
		}
		err = errno;
		sv_lock(&ep->rlock);
		for (struct ep_sleeper **pp = &ep->sleepers; *pp; pp = &(*pp)->next) {
			if (*pp == &z) {
				*pp = z.next;
				break;
			}
		}
		sv_unlock(&ep->rlock);
	}
	sv_hub_sleep_end(&z.sl, &pfd[n], nhub);
	bool nval = pfd[0].revents & POLLNVAL;
	free(pfd);
	if (r < 0)
		return -err;
	return nval ? -EBADF : 0;
}

/* The count, 0 on timeout, or -errno; *empty when the shadow has no entry
 * (left) and the kernel's epoll_wait is the call. */
static int ep_wait(struct sv_ep *ep, struct epoll_event *evs, int max, int timeout_ms,
		   const sigset_t *mask, bool *empty)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	uint64_t spin_until = 0;
	bool first = true;
	*empty = false;
	for (;;) {
		struct round r = {0};
		sv_lock(&ep->lock);
		*empty = ep->n == 0;
		int err = *empty ? 0 : round_gather(ep, &r);
		if (*empty || err < 0) {
			sv_unlock(&ep->lock);
			return err;
		}
		round_judge(ep, &r);
		if (first) {
			first = false;
			uint64_t spin = round_spin(&r);
			spin_until = spin ? sv_now_us() + spin : 0;
		}
		bool spinning = spin_until && sv_now_us() < spin_until;
		int count = round_report(ep, &r, evs, max, spinning);
		sv_unlock(&ep->lock);
		round_free(&r);
		if (count < max) {
			int kr = sv_real.epoll_wait(ep->epfd, evs + count, max - count, 0);
			if (kr > 0)
				count += kr;
			else if (kr < 0 && errno == EBADF)
				return -EBADF;
		}
		int t = -1;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			t = left > 0 ? (int)left : 0;
		}
		if (count || t == 0)
			return count;
		if (spinning) {
			sched_yield();
			continue;
		}
		err = ep_sleep(ep, t, mask);
		if (err < 0)
			return err;
	}
}

/* The served wait, or -1 with *served false when the kernel's is right. */
static int wait_common(int epfd, struct epoll_event *evs, int max, int timeout_ms,
		       const sigset_t *mask, bool *served)
{
	*served = false;
	if (sv_reentered() && sv_fd_claimed(epfd, SV_MARK_EPOLL)) {
		*served = true; /* its entries cannot be judged from there (reentry.c) */
		return sv_refuse(epfd, "epoll_wait", EBUSY);
	}
	if (sv_passthrough())
		return -1;
	int saved = errno;
	sv_enter(); /* the shadows' locks: a signal handler must not wait for them */
	struct sv_ep *ep = sv_ep_get(epfd, false);
	int r = -EINVAL;
	bool empty = !ep;
	if (ep && max > 0)
		r = ep_wait(ep, evs, max, timeout_ms, mask, &empty);
	sv_ep_put(ep);
	sv_leave();
	if (empty)
		return -1;
	*served = true;
	return (int)sv_ret(r, saved);
}

SV_EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	bool served;
	int r = wait_common(epfd, evs, max, timeout, NULL, &served);
	return served ? r : SV_REAL(epoll_wait)(epfd, evs, max, timeout);
}

SV_EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout,
			  const sigset_t *mask)
{
	bool served;
	int r = wait_common(epfd, evs, max, timeout, mask, &served);
	return served ? r : SV_REAL(epoll_pwait)(epfd, evs, max, timeout, mask);
}

SV_EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max,
			   const struct timespec *ts, const sigset_t *mask)
{
	int timeout = -1;
	if (ts) {
		int64_t ms = (int64_t)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000;
		timeout = ms > INT32_MAX ? INT32_MAX : (int)ms;
	}
	bool served;
	int r = wait_common(epfd, evs, max, timeout, mask, &served);
	return served ? r : SV_REAL(epoll_pwait2)(epfd, evs, max, ts, mask);
}
