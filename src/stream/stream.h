/* A SOVIA stream: one accelerated TCP connection, as the interposer and
 * the helper thread see it. Its state is private to the stream's files
 * (stream_int.h).
 *
 * The application's fd is always the real kernel TCP socket. Each direction
 * of the byte stream has a medium, TCP at first; once both ends agree over
 * rdma_cm, each direction moves to the RC queue pair at a byte offset the
 * sender announces (TO_RDMA), and can move back the same way (TO_TCP, or
 * BACK for the way back). Every call below takes the stream's lock itself;
 * results are >= 0 or -errno. */
#ifndef SV_STREAM_H
#define SV_STREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "helper.h"

struct sv_share_ref;
struct sv_share_redo;

struct sv_stream;
struct sv_listener;
struct sv_hand;
struct pollfd;
struct sv_marks;

/* ---- Life ----------------------------------------------------------------- */

/* The module's start: it gives the helper its hooks (helper.h), and the
 * upgrade starts too. Once, before any stream (again: nothing). */
void sv_stream_init(void);

/* A stream for a TCP socket: connected (client), accepted (server), or a
 * client whose non-blocking connect() is in progress. NULL on ENOMEM. */
struct sv_stream *sv_stream_new(int fd, bool is_client);
void sv_stream_get(struct sv_stream *s);
void sv_stream_put(struct sv_stream *s);

/* Start moving it to RDMA: a client once connect() returned (the helper
 * starts after SOVIA_UPGRADE_DELAY_MS), a client whose non-blocking connect
 * is in progress (once it completes), a server's accepted connection (a
 * request may match it). Without RDMA it stays on TCP, with the reason. */
/* From now on this process upgrades no connection (a call that reaches
 * sockets behind libsovia, like io_uring, was set up): new ones stay on
 * TCP, with the reason 'unsupported'. */
void sv_stream_upgrades_off(void);
void sv_stream_start_client(struct sv_stream *s);
void sv_stream_start_connecting(struct sv_stream *s, const struct sockaddr *to, socklen_t len);
void sv_stream_start_server(struct sv_stream *s, struct sv_listener *l);

/* ---- What a program or sovia-stat sees of it ---------------------------- */

/* One connection, as include/sovia.h and sovia-stat(8) report it: read
 * under the stream's lock from the counters it keeps anyway. */
void sv_stream_view(struct sv_stream *s, struct sv_conn_view *v);
/* Each live stream's view to fn (on the calling thread, no lock held
 * during fn), but those the application closed. */
void sv_stream_view_all(void (*fn)(const struct sv_conn_view *v, void *arg), void *arg);

/* ---- The application's calls ---------------------------------------------- */

long sv_stream_recvmsg(struct sv_stream *s, struct msghdr *msg, int flags);
long sv_stream_sendmsg(struct sv_stream *s, const struct msghdr *msg, int flags);
int sv_stream_shutdown(struct sv_stream *s, int how);
int sv_stream_setsockopt(struct sv_stream *s, int level, int name, const void *val,
			 socklen_t len);
/* FIONREAD: the bytes readable now (ours, and the kernel's when TCP carries
 * the receive side). */
long sv_stream_inq(struct sv_stream *s);
/* The fd's mode may have changed (fcntl F_SETFL, ioctl FIONBIO): the next
 * call looks at it again. */
void sv_stream_mode_changed(struct sv_stream *s);

/* What the calls that report the connection's state answer, where the
 * kernel's socket knows only TCP's part (stream_report.c). */
/* getsockopt(SO_ERROR): the connection's error (-errno), taken as the
 * kernel's pending error is: reported once, to this or to whichever call
 * comes first. 0: none of ours (the kernel's socket answers). */
int sv_stream_take_error(struct sv_stream *s);
/* ioctl(SIOCOUTQ): the bytes the application wrote that the peer is not
 * known to have: the kernel's for TCP, plus those coalesced, in flight on
 * the QP, or kept or owed after a lost QP or on the way back. */
long sv_stream_outq(struct sv_stream *s);
/* getsockopt(TCP_INFO): correct the kernel's struct tcp_info (the len
 * bytes it filled in) where the connection's state differs: its state
 * after an error or the FINs that went over the QP, and its byte counters
 * with the QP's bytes. */
void sv_stream_tcp_info(struct sv_stream *s, void *info, socklen_t len);

/* The application closed `appfd`, one of its fds for the stream. The last
 * one closed: the helper finishes the connection (lingering close). */
int sv_stream_close(struct sv_stream *s, int appfd);
/* dup: the application is about to have several fds for the stream; the
 * stream moves to a private copy of the socket, so any of them may be
 * closed first. Then sv_stream_opened for each new fd. */
int sv_stream_share(struct sv_stream *s);
void sv_stream_opened(struct sv_stream *s);

/* The way back: make the kernel's socket carry the whole connection again,
 * with nothing held by libsovia, for a call libsovia cannot serve (fork,
 * exec, SCM_RIGHTS, ...). Blocks, bounded by SOVIA_UPGRADE_TIMEOUT_MS, while
 * an upgrade in progress settles and the peer gives back what we sent and
 * it did not read. 0 when the fd is plain TCP now (also when it always
 * was); -EBUSY when bytes libsovia holds cannot be given back (the QP is
 * gone), -ETIMEDOUT, or the connection's error: the stream stays
 * libsovia's. */
int sv_stream_detach(struct sv_stream *s);
/* The same before a fork, except for a server connection whose upgrade has
 * not begun (no request matched yet): it is handed to the fork's child
 * (holders.h), which may take it to RDMA once it holds it alone. *hand
 * says so (hand->h NULL otherwise), with the bytes TCP carried each way.
 * 1: the fd stays the stream's, kept on RDMA (sv_stream_keep_for_fork) or
 * a client's shared with the child (sv_stream_share_for_fork). */
int sv_stream_detach_for_fork(struct sv_stream *s, struct sv_hand *hand, uint64_t *tx,
			      uint64_t *rx);
/* A fork keeps the parent's QP (shares.h): a connection settled on RDMA
 * is entered as kept, with a copy about to be given, instead of going
 * back to TCP (sv_stream_detach_for_fork's first step, which then returns
 * 1). Needs SOVIA_FORK_KEEP and a kernel that copies pinned pages at a
 * fork. Takes the lock. */
bool sv_stream_keep_for_fork(struct sv_stream *s);
/* A client's connection the fork took back to TCP instead (no kernel
 * support, bytes unread), DETACHED and parked: entered as shared, with a
 * copy about to be given, as after a child's claim. The parent moves it
 * to RDMA again once it holds it alone, or hands it to the child left
 * holding it when it lets go. True: the fd stays the stream's (then
 * sv_stream_keep_forked as above). With the lock. */
bool sv_stream_share_for_fork(struct sv_stream *s);
/* After that fork, in the parent: its outcome (the child's pid, or -1). */
void sv_stream_keep_forked(struct sv_stream *s, pid_t pid);
/* In the fork's child, for each of s's fds: true when the fork kept s,
 * whose copy here is then *ref's (the parent's entry). */
bool sv_stream_kept_for_child(const struct sv_stream *s, struct sv_share_ref *ref);
/* The helper's part: claims that came for this process's kept streams
 * start their way back, and shared ones it holds alone again move to RDMA
 * again. When to call it again (0: at the next wake-up). */
uint64_t sv_stream_keep_service(uint64_t now);
/* The owner lets go of a kept stream: its last fd closed, the process
 * exits, an exec replaces the image (every kept stream). A copy still
 * held elsewhere gets the connection back on plain TCP first. Without
 * the lock. */
void sv_stream_keep_close(struct sv_stream *s);
void sv_stream_keep_exit(struct sv_stream *s);
void sv_stream_keep_exec_all(void);
void sv_stream_keep_atfork_child(void);
/* In the fork's child: a server stream on fd for the connection handed to
 * it, TCP having carried tx and rx bytes. Start it with
 * sv_stream_start_adopted once it is fd's. NULL on ENOMEM. */
struct sv_stream *sv_stream_adopt(int fd, const struct sv_hand *hand, uint64_t tx, uint64_t rx);
/* An adopted stream whose upgrade has not started: its first use starts it
 * (sv_stream_start_adopted, once), so a child that only execs or closes it
 * starts no helper nor rdma_cm. Read without the lock. */
bool sv_stream_adopt_pending(const struct sv_stream *s);
void sv_stream_start_adopted(struct sv_stream *s);
/* The same for a client connection an exec'd image continues
 * (sv_stream_adopted): its first use starts its upgrade, not the
 * constructor. */
void sv_stream_start_at_use(struct sv_stream *s);
/* A copy of adopted stream s goes on fd 0, 1 or 2 (inetd's child before
 * its exec), where glibc's stdio reads and writes past the interposer.
 * True when s may take it: handed to us and untouched, it then never
 * upgrades in this image, and only an exec hands it on
 * (sv_stream_exec_hand). False: it must go back to plain TCP. */
bool sv_stream_expose_std(struct sv_stream *s);
/* An exec keeps an fd of s: true when s can be handed on to the new image
 * (an adopted connection still untouched, nothing of ours in it), with
 * *hand its entry in the holders' table. The kernel's counts say what TCP
 * carried (sv_tcp_app_counts); the new image adopts it. */
bool sv_stream_exec_hand(struct sv_stream *s, struct sv_hand *hand);
/* A client connection back on plain TCP (sv_stream_detach) that an exec'd
 * image may continue: no other process holds it, nothing of ours in it,
 * its offsets known (*dtx, *drx: what they exceed the kernel's counts by,
 * each way). The caller sees that one fd of the application's survives
 * the exec. */
bool sv_stream_exec_client(struct sv_stream *s, uint64_t *dtx, uint64_t *drx);
/* What the application of accepted socket fd has sent and received over
 * TCP in its life, from the kernel's counters; -ENOTCONN past
 * ESTABLISHED, where the kernel counts a FIN too. A connecting socket's
 * tx counts its SYN as well (one more); differences are exact for both. */
int sv_tcp_app_counts(int fd, uint64_t *tx, uint64_t *rx);
/* The application reads, writes, waits on or shuts down the connection
 * (each such call's first step). A server's upgrade request waits for it:
 * an accept-then-fork server's parent never uses its connection, which is
 * then still on TCP, free to hand to the child, at the fork. */
void sv_stream_app_uses(struct sv_stream *s);
bool sv_stream_app_used(const struct sv_stream *s);
/* Does the kernel's socket alone answer for the stream from now on (TCP for
 * good, nothing held by libsovia)? Then the fd may be the kernel's. */
bool sv_stream_kernel_only(struct sv_stream *s);
/* The same as last seen by the stream, without its lock: once true it
 * stays so; false may be late. */
bool sv_stream_kernel_only_seen(const struct sv_stream *s);

/* ---- A second life (stream_redo.c) --------------------------------------------- */

/* A connection back on plain TCP (the way back) whose application holds
 * one fd for it may move to RDMA again, as a new stream that takes that
 * fd: when this process holds it alone again after a fork's child used it
 * (stream_keep.c), or a server's when its client asks again. The preload
 * layer makes it (the hook, true when it did): the fd's entry becomes the
 * stream sv_stream_successor gives, started with sv_stream_start_revived
 * (l: the listener a request came to; NULL for a client).
 * sv_stream_revive: 1 when it did; 0: not now (a fork's child of ours may
 * still hold it, and we look again, or it is on its way back), ask again;
 * -1: it cannot. */
typedef bool (*sv_revive_fn)(struct sv_stream *s, int fd, struct sv_listener *l);
void sv_stream_set_revive(sv_revive_fn fn);
int sv_stream_revive(struct sv_stream *s, struct sv_listener *l);
/* s's successor, or NULL (s cannot have one: not back on TCP with its
 * counts known, closed, dup'd, or it has one already): a new stream for
 * s's fd. `entry` is the fd's entry for s, a reference the successor
 * keeps (dropped with put) until its switch is over, asking `idle` whether
 * a call is under way on it. Once the successor is the fd's entry,
 * sv_stream_successor_took: the calls that reach s from then on go on to
 * it. */
struct sv_stream *sv_stream_successor(struct sv_stream *s, void *entry, bool (*idle)(void *),
				      void (*put)(void *));
void sv_stream_successor_took(struct sv_stream *s, struct sv_stream *n);
/* The data calls of an fd entry that go to the kernel's socket while its
 * connection may get a successor: a successor takes its counts only once
 * none is under way (such a read could take a switch's echo for data),
 * and once it took the fd over, the calls that still reach the old entry
 * go on to it. sv_kcalls_enter: NULL, go to the kernel, then
 * sv_kcalls_leave; or the successor (a reference) serves the call.
 * sv_kcalls_forget drops the successor's reference. */
struct sv_kcalls {
	atomic_uint n;
	_Atomic(struct sv_stream *) next;
};
struct sv_stream *sv_kcalls_enter(struct sv_kcalls *k);
void sv_kcalls_leave(struct sv_kcalls *k);
void sv_kcalls_took(struct sv_kcalls *k, struct sv_stream *n);
void sv_kcalls_forget(struct sv_kcalls *k);
/* A fork's child holds alone a connection its parent handed to the copies
 * (sv_shares_adopt): a new stream for fd, from where the connection stood
 * then (redo), in the parent's role. `entry`, `idle`, `put` as for
 * sv_stream_successor; kc: the entry's kernel calls. NULL on ENOMEM, or
 * for a server's end without a holders' table. */
struct sv_stream *sv_stream_adopted(int fd, const struct sv_share_redo *redo, void *entry,
				    bool (*idle)(void *), void (*put)(void *),
				    struct sv_kcalls *kc);
void sv_stream_start_revived(struct sv_stream *s, struct sv_listener *l);
/* s gets no successor, and is not handed to a fork's children: the
 * application has another fd for its socket, which libsovia does not
 * follow (a dup of a connection back on TCP), or its fd became the
 * kernel's (a hand-over: exec, spawn, SCM_RIGHTS, ...; a fork that took
 * it back first). */
void sv_stream_unpark(struct sv_stream *s);
/* The helper, holding no lock: predecessors whose successors' switch is
 * over (or their upgrade) are let go. */
void sv_stream_redo_reap(void);
/* A server connection of this process for the four-tuple of a request (a
 * reference), one back on TCP (or on its way back) first, or NULL. */
struct sv_stream *sv_stream_find_parked(const struct sockaddr_storage *local,
					const struct sockaddr_storage *peer);
/* ... revived (sv_stream_revive) for the request that came to l; -1: none;
 * -2: it went back to TCP here and never moves again (its fd became the
 * kernel's, or it was closed): the request is refused at once. */
int sv_stream_revive_parked(const struct sockaddr_storage *local,
			    const struct sockaddr_storage *peer, struct sv_listener *l);

/* ---- Readiness: poll, select, epoll (stream_poll.c) -------------------------- */

/* Which of `events` libsovia answers for this stream (*own gets those that
 * are ready) and which the kernel's socket answers (*kernel); *gen marks the
 * state judged. */
void sv_stream_poll_split(struct sv_stream *s, short events, short *own, short *kernel,
			  uint64_t *gen);
/* After the kernel's poll reported the TCP socket readable, while the
 * kernel answered for reading: `rev` as it stands now. The bytes may be
 * only the peer's switch echo, and then libsovia answers instead. */
short sv_stream_poll_recheck(struct sv_stream *s, short events, short rev);
/* poll() found nothing ready: the application is about to wait, most
 * likely for an answer to what it wrote. Pushes out what it coalesced, as
 * a receive call does. */
void sv_stream_poll_waits(struct sv_stream *s);
/* Before sleeping in poll(): attach w (a watch that kicks the sleeping
 * thread, hub.h) so that any change of the stream wakes the sleep, arm the
 * CQ, and add the fds whose readiness also means a change (at most 1: the
 * TCP socket while a switch is pending). Sets *again when it changed
 * already since `gen`. Every call is paired with sv_stream_poll_done
 * after the sleep. */
struct sv_hub_watch;
struct sv_hub_node;
int sv_stream_poll_sources(struct sv_stream *s, struct sv_hub_watch *w, struct pollfd *out,
			   bool *again, uint64_t gen);
void sv_stream_poll_done(struct sv_stream *s, struct sv_hub_watch *w);
/* For a watch that stays attached (an epoll set's): arm before a sleep.
 * True when the stream changed since `gen` (judge it again); *tcp_events:
 * the TCP socket's events that also mean a change (0 or POLLIN). */
bool sv_stream_poll_arm(struct sv_stream *s, uint64_t gen, short *tcp_events);
/* The stream's node: epoll sets and the helper attach their watches. */
struct sv_hub_node *sv_stream_hub_node(struct sv_stream *s);
/* Adaptive spin: how long a wait on s polls before it sleeps (0: sleep at
 * once), and the length of a wait that ended with something for it. */
uint32_t sv_stream_spin_us(struct sv_stream *s);
void sv_stream_waited(struct sv_stream *s, uint64_t us);
/* epoll: the stream's marks for the edge-triggered rules (readiness.h). */
void sv_stream_marks(struct sv_stream *s, struct sv_marks *m);

/* ---- The helper's part ------------------------------------------------------- */

void sv_stream_service(struct sv_stream *s, struct sv_service *sv);

/* ---- Process events ------------------------------------------------------------ */

/* In a fork's child: the parent's streams are not the child's. */
void sv_stream_atfork_child(void);
/* Exit: push out everything held back and wait (bounded) for delivery,
 * for every live stream. Writes after it (stdio's last flush) complete
 * before they return. */
void sv_stream_exit_flush_all(void);

#endif
