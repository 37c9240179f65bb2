/* The fd operations of libsovia's sockets: a TCP socket that may become a
 * stream (the kernel's calls, plus the hooks that open an RDMA listener at
 * listen() and make a stream at connect()), a listening socket with its
 * RDMA listener, and a stream. */
#ifndef SV_SOVIA_OPS_H
#define SV_SOVIA_OPS_H

#include "holders.h"
#include "preload.h"

/* A TCP socket: every call the kernel's (kernel_ops.c). */
extern const struct sv_fd_ops sv_kernel_ops;
/* A listening socket with an RDMA listener beside it (kernel_ops.c). */
extern const struct sv_fd_ops sv_listen_ops;
/* Their calls that other fd operations share (kernel_ops.c). */
int sv_kernel_setsockopt(struct sv_fd *f, int level, int name, const void *val, socklen_t len);
int sv_kernel_getsockopt(struct sv_fd *f, int level, int name, void *val, socklen_t *len);
int sv_kernel_close(struct sv_fd *f);
/* Their hooks (sovia_ops.c). */
void sv_socket_listened(struct sv_fd *f);
void sv_socket_connected(struct sv_fd *f, const struct sockaddr *to, socklen_t len,
			 bool in_progress);
void sv_listen_accepted(struct sv_fd *f, int nfd);
void sv_listen_will_accept(struct sv_fd *f);
void sv_listen_release(struct sv_fd *f);
/* An entry of ours in a fork's child: it becomes the kernel's. */
void sv_ours_atfork_child(struct sv_fd *f);
/* A listening socket in a fork's child: a listener of the child's, to
 * which the parent redirects the requests for what the child accepts. */
void sv_listen_atfork_child(struct sv_fd *f);

/* A connection handed to a fork's child, as each process holds it until
 * the child's upgrade (held.c). */
extern const struct sv_fd_ops sv_held_ops;
struct sv_held;
struct sv_held *sv_held_new(const struct sv_hand *hand, uint64_t tx, uint64_t rx);
/* The child takes it (held.c), or the image after an exec continues it
 * (exec_hand.c): fds[0..n-1] become one stream of its own, TCP having
 * carried tx and rx bytes; its upgrade starts at its first use. True when
 * they did (the stream releases the hand from then on). */
bool sv_stream_fd_adopt(const int *fds, int n, const struct sv_hand *hand, uint64_t tx,
			uint64_t rx);

/* A fork's child's copy of a connection the parent kept on RDMA
 * (foreign.c): its first use claims it from the parent. */
extern const struct sv_fd_ops sv_foreign_ops;
struct sv_share_ref;
struct sv_foreign;
struct sv_foreign *sv_foreign_new(const struct sv_share_ref *ref);
/* The interposed fork, around its detaching and the real fork: no copy is
 * adopted meanwhile (the new stream would be none of the fork's, the
 * child's copy a plain socket). Not from inside libsovia (a signal
 * handler's fork: it could be this thread's adoption it interrupted).
 * After the fork: unlock in the parent, reset in the child. */
void sv_foreign_fork_lock(void);
void sv_foreign_fork_unlock(pid_t pid);

/* fd's connection is plain TCP now: its entry (and its copies', the entries
 * with the same priv) become the kernel's. */
void sv_fd_make_plain_all(void *priv);
/* In a fork's child: every entry of ours becomes the kernel's (the child
 * has none of the parent's threads, RDMA listeners or queue pairs). */
void sv_ops_atfork_child(void);
/* At the start: the stream layer may make a connection back on TCP a new
 * stream (src/share/redo.c). */
void sv_ops_init(void);
/* A fork's child holds alone the copy f of a client connection its parent
 * handed on (foreign.c): f becomes a new stream that moves it to RDMA
 * again, from where it stood (redo); kc: f's calls in the kernel, which
 * the stream waits for and which go on to it later. False: it stays. */
struct sv_share_redo;
struct sv_kcalls;
bool sv_ops_adopt(struct sv_fd *f, const struct sv_share_redo *redo, struct sv_kcalls *kc);
/* In an exec'd image: fd, a client connection the image before continued
 * across the exec (exec_hand.c), becomes a stream from where it stands
 * (redo), which moves it to RDMA. False on ENOMEM. */
bool sv_ops_continue_client(int fd, const struct sv_share_redo *redo);
/* The process is exiting. */
void sv_on_exit(void);

#endif
