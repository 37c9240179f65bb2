/* epoll's edge-triggered and one-shot rules, applied to readiness libsovia
 * judges itself (a stream whose data travels over the QP has no kernel
 * wake-ups to be edge-triggered by).
 *
 * The kernel reports an EPOLLET entry when a wake-up of the socket finds it
 * ready: each arrival of data, each ack that frees room, each state change.
 * Here an entry's bits, once reported, are not reported again until one of
 * these moves:
 *   - the stream's activity mark (a message arrived, a state changed, TCP
 *     bytes arrived): everything is re-armed, as a kernel wake-up would;
 *   - the count of receive calls that returned EAGAIN: the input bits;
 *   - the count of send calls that returned EAGAIN: EPOLLOUT.
 * An application that uses EPOLLET correctly drains until EAGAIN, so it
 * always re-arms what it waits for. EPOLLONESHOT disables the entry after
 * one report until EPOLL_CTL_MOD. Level-triggered entries report whatever is
 * ready, every time. */
#ifndef SV_READINESS_H
#define SV_READINESS_H

#include <stdbool.h>
#include <stdint.h>

/* The stream's marks at one moment (see above). */
struct sv_marks {
	uint64_t activity, rx_eagain, tx_eagain;
};

struct sv_ep_rule {
	uint32_t events;   /* as given to epoll_ctl: readiness bits and flags */
	uint32_t reported; /* EPOLLET: bits reported and not re-armed since */
	bool disabled;     /* EPOLLONESHOT fired: nothing until EPOLL_CTL_MOD */
	struct sv_marks at; /* the marks at the last report */
};

/* EPOLL_CTL_ADD or _MOD: new events, everything armed. */
void sv_ep_rule_set(struct sv_ep_rule *r, uint32_t events);

/* Before waiting: re-arm what the marks say changed, and return the
 * readiness bits (poll's values, which are epoll's) worth waiting for. 0:
 * do not watch this entry now (disabled, or only bits that stay reported).
 * EPOLLERR and EPOLLHUP are in the result when they would be reported. */
uint32_t sv_ep_rule_watch(struct sv_ep_rule *r, const struct sv_marks *now);

/* `ready` was observed: the bits to report (0: nothing), recorded as
 * reported. */
uint32_t sv_ep_rule_report(struct sv_ep_rule *r, uint32_t ready, const struct sv_marks *now);

#endif
