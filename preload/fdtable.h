/* The fd table: which application fds libsovia manages, and how.
 *
 * Each managed fd has a refcounted entry carrying an operations table (the
 * kernel's for a TCP socket libsovia leaves alone, a listening socket's, a
 * stream's), as OpenOnload's fdinfo ops or Redis' ConnectionType: the
 * interposed calls dispatch through it and never compare tables. An fd
 * without an entry is not ours and every call on it passes straight to
 * libc. Lookups of unmanaged fds take no lock; managed ones take a striped
 * lock just long enough to count a reference, so an entry never disappears
 * under a call that is using it. */
#ifndef SV_FDTABLE_H
#define SV_FDTABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

struct sv_fd;
struct pollfd;
struct sv_marks;
struct sv_hub_watch;
struct sv_hub_node;
struct sv_hand;
struct sv_conn_view;

/* Readiness of an fd whose data libsovia may hold: poll, select and epoll
 * ask it instead of (or besides) the kernel. Each op is the stream's of the
 * same name (src/stream/stream.h). */
struct sv_fd_wait_ops {
	void (*split)(struct sv_fd *f, short events, short *own, short *kernel, uint64_t *gen);
	short (*recheck)(struct sv_fd *f, short events, short rev);
	void (*waits)(struct sv_fd *f);
	int (*sources)(struct sv_fd *f, struct sv_hub_watch *w, struct pollfd *out, bool *again,
		       uint64_t gen);
	void (*done)(struct sv_fd *f, struct sv_hub_watch *w);
	bool (*arm)(struct sv_fd *f, uint64_t gen, short *tcp_events);
	/* Where watches attach to learn of the stream's changes (hub.h). */
	struct sv_hub_node *(*node)(struct sv_fd *f);
	uint32_t (*spin_us)(struct sv_fd *f);
	void (*waited)(struct sv_fd *f, uint64_t us);
	void (*marks)(struct sv_fd *f, struct sv_marks *m);
	/* The kernel's socket alone answers from now on: an epoll set may
	 * watch the fd itself. */
	bool (*kernel_only)(struct sv_fd *f);
};

/* Operations on a managed fd. Every op returns >= 0 or -errno. */
struct sv_fd_ops {
	const char *name;
	/* read, readv, recv, recvfrom, recvmsg */
	ssize_t (*recvmsg)(struct sv_fd *f, struct msghdr *msg, int flags);
	/* write, writev, send, sendto, sendmsg */
	ssize_t (*sendmsg)(struct sv_fd *f, const struct msghdr *msg, int flags);
	int (*shutdown)(struct sv_fd *f, int how);
	int (*setsockopt)(struct sv_fd *f, int level, int name, const void *val, socklen_t len);
	int (*getsockopt)(struct sv_fd *f, int level, int name, void *val, socklen_t *len);
	/* The application closed this fd (already removed from the table). The
	 * op closes or hands over the kernel fd; the caller then drops its
	 * reference. */
	int (*close)(struct sv_fd *f);
	/* The entry's last reference is gone: release what the ops attached. */
	void (*release)(struct sv_fd *f);

	/* The rest is optional: NULL where the kernel's socket is all there
	 * is to it. */
	/* listen() succeeded on it. */
	void (*listened)(struct sv_fd *f);
	/* accept() on it returned nfd. */
	void (*accepted)(struct sv_fd *f, int nfd);
	/* The application is about to accept on it: accept() is called, or
	 * an epoll set takes it. */
	void (*will_accept)(struct sv_fd *f);
	/* connect() on it to `to` succeeded, or is in progress. */
	void (*connected)(struct sv_fd *f, const struct sockaddr *to, socklen_t len,
			  bool in_progress);
	/* The way back: make the kernel's socket carry everything, for
	 * `call`, one libsovia does not serve (its name, as the logs and
	 * sovia-stat give it). 0 when the fd is plain TCP now. */
	int (*detach)(struct sv_fd *f, const char *call);
	/* The same before a fork, where a connection may be handed to the
	 * child instead (holders.h); NULL: detach. */
	int (*detach_for_fork)(struct sv_fd *f);
	/* dup: the fd is about to get a copy. 0: the copy must become the
	 * same (add_copy); 1: the kernel's dup is all; -errno: it could not
	 * be shared (the caller takes the connection back first). */
	int (*share)(struct sv_fd *f);
	bool (*add_copy)(struct sv_fd *f, int nfd);
	/* FIONREAD: the bytes readable now. */
	long (*inq)(struct sv_fd *f);
	/* SIOCOUTQ: the bytes written that the peer is not known to have. */
	long (*outq)(struct sv_fd *f);
	/* fcntl(F_SETFL) or ioctl(FIONBIO) may have changed its mode. */
	void (*mode_changed)(struct sv_fd *f);
	/* In a fork's child: the entry is the parent's (never released here). */
	void (*atfork_child)(struct sv_fd *f);
	/* After the interposed fork: in the child (pid 0), once every fork
	 * handler ran; in the parent only when the fork failed (pid -1). */
	void (*after_fork)(struct sv_fd *f, pid_t pid);
	/* An exec keeps the fd: true when the connection can be handed on to
	 * the new image, which continues it (exec_hand.c), with *hand its
	 * entry in the holders' table; false: detach first. */
	bool (*exec_hand)(struct sv_fd *f, struct sv_hand *hand);
	/* Else, a client connection: taken back to plain TCP here; true when
	 * the new image may continue it (exec_hand.c), its offsets then the
	 * kernel's counts plus *dtx and *drx. */
	bool (*exec_client)(struct sv_fd *f, const char *call, uint64_t *dtx, uint64_t *drx);
	/* The process changed its user or group ids and leaves its family's
	 * shared tables (creds.c): what the entry has in them is settled
	 * first, while they are still shared. */
	void (*leave_family)(struct sv_fd *f);
	/* What include/sovia.h and sovia-stat report of it (a stream's). */
	void (*view)(struct sv_fd *f, struct sv_conn_view *v);
	/* Readiness of its own. */
	const struct sv_fd_wait_ops *wait;
	/* stdio (fdopen) must call back through libsovia for this fd. */
	bool stdio_cookie;
};

struct sv_fd {
	atomic_int refs;
	int fd;
	const struct sv_fd_ops *ops;
	void *priv; /* the ops' own state (e.g. the SOVIA stream) */
	/* An epoll set watches this fd (never cleared): the kernel's, added
	 * while it was a plain socket (it must stay the kernel's: it is never
	 * made a stream), or, for a stream, any (a successor would not be
	 * watched there: src/share/redo.c). */
	atomic_bool in_epoll;
};

/* Size the table from RLIMIT_NOFILE. Returns 0 or -errno. Idempotent. */
int sv_fdtable_init(void);

/* Number of slots; fds at or above it are never managed. */
int sv_fdtable_size(void);

/* A new entry with one reference (the caller's). NULL on ENOMEM. */
struct sv_fd *sv_fd_new(int fd, const struct sv_fd_ops *ops, void *priv);

/* Take a reference on fd's entry, or NULL when fd is not managed. */
struct sv_fd *sv_fd_get(int fd);

/* Drop a reference; the last one calls ops->release and frees the entry. */
void sv_fd_put(struct sv_fd *f);

/* Make f the entry of its fd; the table takes its own reference. An entry
 * already there (a stale one) is dropped. Returns 0, or -EMFILE when the fd
 * is beyond the table. */
int sv_fd_install(struct sv_fd *f);

/* Make f the entry of its fd in old's place, only if old is still that
 * entry (not closed, nor replaced meanwhile): 0, or -ESTALE. */
int sv_fd_swap(struct sv_fd *old, struct sv_fd *f);

/* Remove fd's entry from the table and return the table's reference to the
 * caller (who must sv_fd_put it), or NULL when fd was not managed. */
struct sv_fd *sv_fd_remove(int fd);

/* In a fork's child: the stripes as new. */
void sv_fdtable_atfork_child(void);

/* ---- Without a lock -------------------------------------------------------
 *
 * A call that reaches a wrapper while its thread is inside libsovia
 * (guard.h) can only come from a signal handler that interrupted it: the
 * libraries libsovia calls never touch the application's sockets. It must
 * not take a lock (the thread it interrupted may hold it), so it learns
 * what libsovia answers for at fd from these marks, read and written
 * atomically, async-signal-safe. */
enum {
	/* An accelerated connection whose bytes libsovia may hold: the entry
	 * has a detach op (a stream), until the connection is known to be
	 * the kernel's socket alone (sv_fd_unserve). Kept by the table. */
	SV_MARK_SERVED = 1,
	/* An epoll set with entries libsovia answers for (preload/epoll.c). */
	SV_MARK_EPOLL = 2,
	/* fd has an entry (any ops): set by sv_fd_marks from the slot. */
	SV_MARK_MANAGED = 4,
};
unsigned sv_fd_marks(int fd);
/* Set (value has the bit) or clear the bits `mark` of fd's marks. */
void sv_fd_set_mark(int fd, unsigned mark, unsigned value);
/* f's connection is plain TCP for good, nothing of it held by libsovia:
 * if f is still fd's entry, its fd is not SERVED any more. */
void sv_fd_unserve(struct sv_fd *f);

/* Tests only: called inside every lookup of a managed fd, with the fd's
 * stripe held (a signal raised there interrupts a lookup). NULL in use. */
extern void (*sv_fdtable_test_held)(int fd);

#endif
