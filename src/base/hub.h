/* Wake-ups without a descriptor per connection.
 *
 * Every CQ on a device reports its armed completions to one completion
 * channel per process (verbs_pd.c); a thread that sleeps inside libsovia
 * is woken through one eventfd of its own. So libsovia's descriptors grow
 * with the devices and the threads, never with the connections.
 *
 * A node stands for one stream: the watches to run when the stream
 * changes (sv_hub_notify, from sv_stream_wake) or when its CQ's armed
 * completion arrives (sv_hub_fire, from a channel's drain). A watch kicks
 * a sleeping thread, marks an epoll set's entry ready, or wakes the
 * helper.
 *
 * Sleepers are threads about to sleep in the kernel. One of them, the
 * leader, also polls the channels; when it wakes it takes their events and
 * runs the watches of the nodes that fired. When a leader stops sleeping,
 * the lead goes to the next sleeper to begin, and one sleeper not kicked
 * yet is kicked so that one begins soon. (A channel polled by every
 * sleeper would wake them all at each completion.)
 *
 * One lock (SV_RANK_HUB) covers the nodes' watch lists, the sleepers and
 * the channels. It is taken under a stream's lock, never the other way:
 * a watch's function runs under it and must not take a stream's lock. */
#ifndef SV_HUB_H
#define SV_HUB_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>

/* How often a sleep that nothing can kick (no eventfd could be made)
 * looks again, in milliseconds. */
#define SV_HUB_TICK_MS 10

/* At most this many channels (devices) per process. */
#define SV_HUB_MAX_CHANS 4

struct sv_hub_node;

struct sv_hub_watch {
	void (*fn)(struct sv_hub_watch *w); /* under the hub's lock */
	void *arg;
	struct sv_hub_node *node; /* attached to, or NULL */
	struct sv_hub_watch *prev, *next;
};

struct sv_hub_node {
	struct sv_hub_watch *head;
	atomic_uint n; /* watches attached: a notify with none takes no lock */
};

struct sv_hub_sleeper {
	int efd;       /* what kicks it; -1: nothing (it looks by a tick) */
	bool sleeping; /* between sv_hub_sleep_begin and _end */
	bool kicked;   /* efd written since it began */
	bool leader;   /* it polls the channels */
	bool helper;   /* the helper thread's sleep */
	struct sv_hub_sleeper *prev, *next;
};

struct sv_hub_chan {
	int fd; /* readable when events wait */
	/* Take every waiting event without blocking; sv_hub_fire each node
	 * whose CQ fired. Under the hub's lock. */
	void (*drain)(struct sv_hub_chan *c);
};

void sv_hub_lock(void);
void sv_hub_unlock(void);

/* A device's channel joins (0, or -ENOSPC past SV_HUB_MAX_CHANS). */
int sv_hub_chan_add(struct sv_hub_chan *c);

/* Under the hub's lock: run n's watches. */
void sv_hub_fire(struct sv_hub_node *n);
/* Run n's watches (takes the lock only when some are attached). */
void sv_hub_notify(struct sv_hub_node *n);

/* Attach w (fn and arg set) to n; detach it (safe when not attached). */
void sv_hub_attach(struct sv_hub_node *n, struct sv_hub_watch *w);
void sv_hub_detach(struct sv_hub_watch *w);
/* A watch's function that kicks the sleeper in its arg. */
void sv_hub_kick_fn(struct sv_hub_watch *w);
/* Under the hub's lock (a watch's function): kick sl if it sleeps. */
void sv_hub_kick(struct sv_hub_sleeper *sl);

/* This thread's eventfd, made at its first sleep and closed when the
 * thread ends; -1 when none can be made. */
int sv_hub_thread_fd(void);

/* Begin a sleep: from here on a kick writes efd. Begin before attaching
 * the watches and arming the CQs, or a wake-up in between is lost. */
void sv_hub_sleep_begin(struct sv_hub_sleeper *sl, int efd);
/* The helper's sleep (while it stands in for idle connections): it never
 * leads. Woken by the channel, it would run ahead of the application at
 * every completion and take the streams' locks first (in the test bed,
 * redis GET with 50 clients ran at 67 requests/s so, 4,825 without). It
 * looks every SV_HUB_HELPER_TICK_MS instead, and takes the channels'
 * events then if no application thread leads (sv_hub_drain_unled). */
void sv_hub_sleep_begin_helper(struct sv_hub_sleeper *sl, int efd);
#define SV_HUB_HELPER_TICK_MS 20
/* The fds to poll for it: its efd, then the channels when it leads.
 * Returns how many (at most 1 + SV_HUB_MAX_CHANS). */
int sv_hub_sleep_fds(struct sv_hub_sleeper *sl, struct pollfd *pfd);
/* After the poll, with what it returned in pfd (n from sleep_fds): take
 * the channels' events when it led, reset its efd, hand on the lead.
 * Returns true when its efd or a channel was readable. */
bool sv_hub_sleep_end(struct sv_hub_sleeper *sl, const struct pollfd *pfd, int n);

/* Take the channels' events now, unless a thread leads (the helper
 * standing in for an application that stopped calling). */
void sv_hub_drain_unled(void);

/* In a fork's child: the parent's channels and sleepers are not ours. */
void sv_hub_atfork_child(void);

#endif
