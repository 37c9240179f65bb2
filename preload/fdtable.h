/* The fd table: which application fds libsovia manages, and how.
 *
 * Each managed fd has a refcounted entry carrying an operations table (the
 * kernel's, or the SOVIA stream's). An fd without an entry is not ours and
 * every call on it passes straight to libc. Lookups of unmanaged fds take no
 * lock; managed ones take a striped lock just long enough to count a
 * reference, so an entry never disappears under a call that is using it. */
#ifndef SV_FDTABLE_H
#define SV_FDTABLE_H

#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>

struct sv_fd;

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
};

struct sv_fd {
	atomic_int refs;
	int fd;
	const struct sv_fd_ops *ops;
	void *priv; /* the ops' own state (e.g. the SOVIA stream) */
	/* The kernel's epoll watches this fd (added while it was a plain
	 * socket): it must stay the kernel's (it is never made a stream). */
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

/* Remove fd's entry from the table and return the table's reference to the
 * caller (who must sv_fd_put it), or NULL when fd was not managed. */
struct sv_fd *sv_fd_remove(int fd);

#endif
