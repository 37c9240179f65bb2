/* epoll's edge-triggered and one-shot rules (see readiness.h). */
#include "readiness.h"

#include <sys/epoll.h>

/* The readiness bits of an entry; the rest of epoll_event.events are flags. */
#define EV_BITS (EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDNORM | EPOLLRDBAND | EPOLLWRNORM | \
		 EPOLLWRBAND | EPOLLMSG | EPOLLRDHUP)
#define IN_BITS (EPOLLIN | EPOLLPRI | EPOLLRDNORM | EPOLLRDBAND | EPOLLRDHUP)
#define OUT_BITS (EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND)
/* Reported whether asked for or not. */
#define ALWAYS (EPOLLERR | EPOLLHUP)

void sv_ep_rule_set(struct sv_ep_rule *r, uint32_t events)
{
	r->events = events;
	r->reported = 0;
	r->disabled = false;
}

static void rearm(struct sv_ep_rule *r, const struct sv_marks *now)
{
	if (!(r->events & EPOLLET))
		return;
	if (now->activity != r->at.activity)
		r->reported = 0;
	if (now->rx_eagain != r->at.rx_eagain)
		r->reported &= ~(uint32_t)IN_BITS;
	if (now->tx_eagain != r->at.tx_eagain)
		r->reported &= ~(uint32_t)OUT_BITS;
}

uint32_t sv_ep_rule_watch(struct sv_ep_rule *r, const struct sv_marks *now)
{
	if (r->disabled)
		return 0;
	rearm(r, now);
	/* A reported error or hang-up is still there for the kernel's poll,
	 * which cannot be told not to report it: wait on other entries. */
	if (r->reported & ALWAYS)
		return 0;
	return ((r->events & EV_BITS) | ALWAYS) & ~r->reported;
}

uint32_t sv_ep_rule_report(struct sv_ep_rule *r, uint32_t ready, const struct sv_marks *now)
{
	if (r->disabled)
		return 0;
	rearm(r, now);
	uint32_t bits = ready & ((r->events & EV_BITS) | ALWAYS);
	if (r->events & EPOLLET)
		bits &= ~r->reported;
	if (!bits)
		return 0;
	if (r->events & EPOLLET) {
		r->reported |= bits;
		r->at = *now;
	}
	if (r->events & EPOLLONESHOT)
		r->disabled = true;
	return bits;
}
