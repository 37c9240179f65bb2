/* An in-process fake of rdma_cm and of RC queue pairs, for the stream-layer
 * tests: the connection manager's operations table (src/cm.h) and the
 * queue pairs it creates (src/qp.h), with no RDMA device.
 *
 * rdma_cm: every address resolves (tests use loopback), a connect request
 * goes to the listener bound to its destination (REJECTED with the IB CM's
 * "invalid service ID" when there is none), and the events come on the
 * channel in the order rdma_cm gives them. A disconnect gives both ends
 * DISCONNECTED.
 *
 * Queue pairs: a send is delivered at once into the oldest receive buffer
 * the peer posted, and completes then (completion on RC means delivered).
 * It enforces what the hardware would: no send before the QP is connected,
 * no send into a peer that posted no buffer (counted in fake_net_violations;
 * the protocol's credits must prevent it), no message larger than the
 * buffer. A QP in the error state flushes everything posted. A test may
 * hold one side's sends in flight (they are neither delivered nor
 * completed) and break the connection at any moment: the sends in flight
 * are then lost, as on a real link, and come back flushed. */
#ifndef SV_FAKE_NET_H
#define SV_FAKE_NET_H

#include "cm.h"
#include "qp.h"

#include <stdbool.h>
#include <stdint.h>

/* Install the fake as the library's connection manager and reset it. */
void fake_net_use(void);

/* Work requests the hardware would have refused (see above): 0 in a test
 * that passes. The first one is described in fake_net_why(). */
unsigned fake_net_violations(void);
const char *fake_net_why(void);

/* rdma_cm's first use in the process (the helper's start-up, which loads
 * the device providers: slow on a real host) waits until
 * fake_net_start_now(). */
void fake_net_slow_start(void);
void fake_net_start_now(void);
/* Is it held so (fake_net_slow_start, no fake_net_start_now since)? */
bool fake_net_start_held(void);
/* The process changes credentials (preload/creds.c's call included). As
 * the kernel does, every rdma_cm call on a channel opened before fails
 * with EACCES (its events stay queued, its fd readable), and a channel
 * opened after it serves only the thread that opened it. */
void fake_net_creds_change(void);
/* The kernel's part of a change comes while the helper moves its ids, before
 * the library hears of it (preload/creds.c tells it once the call returned,
 * and glibc changed every thread's credentials before): the move is
 * refused. The test tells the library later (sv_helper_creds_changed). */
void fake_net_creds_change_in_next_move(void);
/* rdma_cm calls since fake_net_use that the kernel refused because another
 * thread than the channel's opener made them after a change (not those the
 * helper made on a channel a newer change made stale: a race it retries). */
unsigned fake_net_cm_refused(void);
/* rdma_cm ids not destroyed. */
unsigned fake_net_live_ids(void);
/* Moving ids to another channel fails (EACCES). */
void fake_net_refuse_moves(bool on);
/* Every connection runs over an RDMA device's link (links.h); by default
 * none does, as on loopback. */
void fake_net_rdma_links(bool on);
/* A fork keeps the parent's connections on their QPs (sv_cm_ops'
 * fork_keeps_qp); by default it does not, and they go back to TCP. */
void fake_net_fork_keeps(bool on);
/* The next connect requests find no route (ADDR_ERROR). */
void fake_net_no_route(bool on);
/* Accepts hand the client its own challenge back (a rogue listener that
 * hopes a TCP peer which echoes its input will echo it). */
void fake_net_reflect_challenge(bool on);
/* Sends completed (delivered) so far, on every QP. */
uint64_t fake_net_delivered(void);

/* Break every connected pair after `n` more delivered messages (counted
 * over all QPs; 0 breaks at the next send; -1 never). */
void fake_net_break_after(long n);
/* After `n` more delivered messages, every post of a send fails with
 * EACCES and sends nothing, the QP staying as it is (a kernel that refuses
 * the doorbell after a credential change, a registration that fails). */
void fake_net_refuse_posts_after(long n);
/* Hold the sends of one side's QPs, those alive and those created from
 * now on: they stay in flight, neither delivered nor completed, until a
 * break loses them. */
enum fake_side { FAKE_NONE, FAKE_CLIENT, FAKE_SERVER };
void fake_net_hold(enum fake_side side);
/* Deliver what is held, in order, and hold nothing from now on. */
void fake_net_release(void);
/* Sends held in flight now, on every QP. */
unsigned fake_net_in_flight(void);
/* Break every connected pair now: both QPs go to the error state (what
 * was in flight is lost), both ends get DISCONNECTED. */
void fake_net_break_all(void);
/* One side's RDMA device goes away: its QPs go to the error state (what
 * they had in flight is lost), only it gets DEVICE_REMOVAL, and its
 * disconnects reach nobody: the other side's QP stays up, idle. */
void fake_net_lose_device(enum fake_side side);
void fake_net_qp_error_quiet(enum fake_side side);
/* Queue pairs created so far. */
unsigned fake_net_qps_created(void);

/* Buffer growths (grow calls) the fake QPs have taken since the start. */
unsigned fake_net_grows(void);
/* shrink calls (buffers back to their start size), since the start. */
unsigned fake_net_shrinks(void);

#endif
