/* A connection handed to a fork's child (accept-then-fork servers:
 * inetd, PostgreSQL, ftpd), as each process's fd entry holds it between
 * the fork and the child's upgrade (src/upgrade/holders.h).
 *
 * In both processes the fd is the kernel's socket meanwhile: two processes
 * may read and write it, and only TCP can carry that. The entry keeps the
 * handed entry of the holders' table, and what each process does to its
 * copy goes there: the parent's close releases it (the child may then take
 * the connection to RDMA), while anything that makes the child's counts
 * wrong or adds a holder spoils it for good (TCP carries it to its end):
 * the parent's reads or writes, a dup, another fork, an exec or spawn
 * that keeps the fd, passing it in SCM_RIGHTS. */
#include "log.h"
#include "real.h"
#include "sovia_ops.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct sv_held {
	struct sv_hand hand;
	uint64_t tx, rx; /* what TCP carried each way before the fork */
	pid_t pid;       /* the process whose copy this entry is */
	bool child;      /* the adopting child's (else the parent's) */
	atomic_bool spoiled; /* told once (any thread may do I/O) */
	bool moved;      /* the child's stream has the entry now */
};

static struct sv_held *held_of(struct sv_fd *f)
{
	return f->priv;
}

static void spoil(struct sv_held *h, int fd, const char *why)
{
	if (atomic_exchange(&h->spoiled, true))
		return;
	sv_holders_spoil(&h->hand);
	sv_info("fd %d: %s a connection handed to a fork's child: it stays on TCP", fd, why);
}

static ssize_t h_recvmsg(struct sv_fd *f, struct msghdr *msg, int flags)
{
	ssize_t r = sv_real.recvmsg(f->fd, msg, flags);
	if (r < 0)
		return -errno;
	if (r > 0 && !(flags & MSG_PEEK) && !held_of(f)->child)
		spoil(held_of(f), f->fd, "the parent read from");
	return r;
}

static ssize_t h_sendmsg(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	ssize_t r = sv_real.sendmsg(f->fd, msg, flags);
	if (r < 0)
		return -errno;
	if (r > 0 && !held_of(f)->child)
		spoil(held_of(f), f->fd, "the parent wrote to");
	return r;
}

static int h_shutdown(struct sv_fd *f, int how)
{
	spoil(held_of(f), f->fd, "shutdown() of");
	return sv_real.shutdown(f->fd, how) < 0 ? -errno : 0;
}

/* The last reference of this process's copy. */
static void h_release(struct sv_fd *f)
{
	struct sv_held *h = held_of(f);
	if (h->pid == getpid() && !h->moved) {
		if (h->child)
			sv_holders_drop(&h->hand);
		else
			sv_holders_release_first(&h->hand);
	}
	free(h);
}

/* exec, posix_spawn, SCM_RIGHTS, another fork: a process we do not
 * follow gets the socket. The fd stays as it is: plain TCP. */
static int h_detach(struct sv_fd *f, const char *call)
{
	char why[64];
	snprintf(why, sizeof(why), "%s gives another process", call);
	spoil(held_of(f), f->fd, why);
	return 0;
}

/* A dup: a copy the parent's close would not release. */
static int h_share(struct sv_fd *f)
{
	spoil(held_of(f), f->fd, "dup of");
	return 1;
}

/* The first fork's child adopts the connection (h_after_fork makes it a
 * stream once the fork handlers ran); any later fork adds a holder. */
static void h_atfork_child(struct sv_fd *f)
{
	struct sv_held *h = held_of(f);
	if (!h->child && h->pid == getppid() && sv_holders_adopt(&h->hand)) {
		h->child = true;
		h->pid = getpid();
		return;
	}
	spoil(h, f->fd, "another fork of");
	h->pid = 0; /* not this process's copy */
	sv_ours_atfork_child(f);
}

/* In the child, after the fork handlers: the connection becomes a stream
 * of the child's, which takes over the entry, unless the kernel's epoll
 * watches the fd (a set inherited from the parent, which would not see
 * the bytes the QP brings). In the parent of a fork that failed: nobody
 * will adopt it; the entry goes, and the fd stays plain TCP. */
static void h_after_fork(struct sv_fd *f, pid_t pid)
{
	struct sv_held *h = held_of(f);
	if (h->moved || h->pid != getpid())
		return;
	if (pid < 0 && !h->child) {
		sv_holders_drop(&h->hand);
		h->moved = true; /* nothing left to release */
		return;
	}
	if (pid != 0 || !h->child)
		return;
	if (atomic_load(&f->in_epoll)) {
		spoil(h, f->fd, "an inherited epoll set watches");
		return;
	}
	h->moved = sv_stream_fd_adopt(&f->fd, 1, &h->hand, h->tx, h->rx);
}

/* The holders' table is left (creds.c): the port's owner, which stays
 * in it, must not wait for this hand, nor send it a client. */
static void h_leave_family(struct sv_fd *f)
{
	spoil(held_of(f), f->fd, "a change of credentials leaves the family of");
}

const struct sv_fd_ops sv_held_ops = {
	.name = "handed",
	.recvmsg = h_recvmsg,
	.sendmsg = h_sendmsg,
	.shutdown = h_shutdown,
	.setsockopt = sv_kernel_setsockopt,
	.getsockopt = sv_kernel_getsockopt,
	.close = sv_kernel_close,
	.release = h_release,
	.detach = h_detach,
	.share = h_share,
	.atfork_child = h_atfork_child,
	.after_fork = h_after_fork,
	.leave_family = h_leave_family,
	/* fdopen: glibc's FILE would read and write past h_recvmsg. */
	.stdio_cookie = true,
};

struct sv_held *sv_held_new(const struct sv_hand *hand, uint64_t tx, uint64_t rx)
{
	struct sv_held *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->hand = *hand;
	h->tx = tx;
	h->rx = rx;
	h->pid = getpid();
	return h;
}
