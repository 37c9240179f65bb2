/* A fork's child's copy of a connection its parent kept on RDMA
 * (src/share/shares.h): the parent's QP carries the connection, so the kernel's
 * socket here has none of its bytes. The first call that would read,
 * write, wait on or pass on the socket claims it: the parent takes the
 * connection back to plain TCP, and the entry then becomes the kernel's,
 * unless the parent still holds its own copy: then this entry stays, its
 * calls the kernel's, so that the parent, which takes the connection to
 * RDMA again once it holds it alone, knows who else holds it (forks here,
 * dups, and hand-overs it cannot follow). A close does not claim (most
 * children never use what they inherited). The copy stays the parent's
 * entry meanwhile: a fork here lists the new child as another holder.
 * When the parent lets go of a client connection it shares so, it hands
 * it on (sv_shares_hand): the last holder, alone with it on one fd, makes
 * it a stream of its own at its next read, write or wait (maybe_adopt),
 * which moves it to RDMA again.
 *
 * When the parent cannot give it back (it died, or the connection failed),
 * the copy's calls fail with ECONNRESET: the bytes the parent's QP brought
 * are gone, and the socket would give the rest without them. Its dups are
 * lost copies too. A hand-over (exec, spawn, SCM_RIGHTS, io_uring) passes
 * the bare socket on, gap and all (docs/design.md: a limit). */
#include "log.h"
#include "real.h"
#include "sovia_ops.h"

#include "shares.h"
#include "stream.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct sv_foreign {
	struct sv_share_ref ref;
	pid_t pid;       /* the process whose copy this entry is */
	unsigned forking; /* forks under way that the owner's entry follows */
	atomic_bool lost; /* the claim found it lost */
	/* Released, but the parent still follows the copies, to take the
	 * connection to RDMA again once it holds it alone: this entry stays,
	 * so that a fork here lists the new holder (a close leaves the
	 * listing to the parent's look into /proc). */
	atomic_bool shared;
	/* Handed on by a parent that let go of it: this process takes it to
	 * RDMA again once it holds it alone (sv_ops_adopt). Looked at on
	 * its calls, soon, then less and less often (each look reads
	 * /proc). */
	atomic_flag looking;
	uint64_t look_at_us, look_us;
	struct sv_kcalls kc; /* our calls in the kernel meanwhile */
};

#define SV_ADOPT_LOOK_US 2000u
#define SV_ADOPT_LOOK_MAX_US 1000000u

/* An adoption, from the look that takes the entry to the fd table's swap,
 * against the interposed fork (sv_foreign_fork_lock). */
static pthread_rwlock_t adopting = PTHREAD_RWLOCK_INITIALIZER;
static __thread bool fork_locked;

void sv_foreign_fork_lock(void)
{
	fork_locked = !sv_reentered() && pthread_rwlock_wrlock(&adopting) == 0;
}

void sv_foreign_fork_unlock(pid_t pid)
{
	if (!fork_locked)
		return;
	fork_locked = false;
	if (pid == 0) /* the child's only thread: a free lock */
		pthread_rwlock_init(&adopting, NULL);
	else
		pthread_rwlock_unlock(&adopting);
}

static struct sv_foreign *foreign_of(struct sv_fd *f)
{
	return f->priv;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A connection the parent handed on: alone with it, this process takes it
 * to RDMA again; the calls that reach this entry from then on go on to
 * the new stream (sv_kcalls_enter). */
static void maybe_adopt(struct sv_fd *f)
{
	struct sv_foreign *c = foreign_of(f);
	if (atomic_load(&f->in_epoll) || c->pid != getpid() || !sv_shares_handed(&c->ref) ||
	    atomic_flag_test_and_set(&c->looking))
		return;
	uint64_t now = now_us();
	if (now >= c->look_at_us && pthread_rwlock_tryrdlock(&adopting) == 0) {
		struct sv_share_redo redo;
		int r = sv_shares_adopt(&c->ref, &redo);
		bool adopted = r == 1 && sv_ops_adopt(f, &redo, &c->kc);
		pthread_rwlock_unlock(&adopting);
		if (adopted)
			sv_info("fd %d: the parent that used it let go, and no one else holds "
				"it: it moves to RDMA again", f->fd);
		c->look_us = c->look_us ? c->look_us * 2 : SV_ADOPT_LOOK_US;
		if (c->look_us > SV_ADOPT_LOOK_MAX_US)
			c->look_us = SV_ADOPT_LOOK_MAX_US;
		c->look_at_us = now + c->look_us;
	}
	atomic_flag_clear(&c->looking);
}

/* 0: the kernel's socket is the whole connection now (the entry, and any
 * dup of it here, became the kernel's); -ECONNRESET: lost. */
static int claim(struct sv_fd *f)
{
	struct sv_foreign *c = foreign_of(f);
	if (atomic_load(&c->lost))
		return -ECONNRESET;
	if (atomic_load_explicit(&c->shared, memory_order_relaxed))
		return 0;
	sv_dbg("fd %d: claiming the copy of a connection the parent keeps on RDMA", f->fd);
	int saved = errno;
	int r = sv_shares_claim(&c->ref);
	errno = saved;
	if (r < 0) {
		if (!atomic_exchange(&c->lost, true))
			sv_warn("fd %d: the parent that kept this connection on RDMA could not give "
				"it back: it is reset here", f->fd);
		return r;
	}
	if (r == 1)
		atomic_store(&c->shared, true);
	else
		sv_fd_make_plain_all(c);
	return 0;
}

/* For a read, a write or a wait (not a dup or a hand-over, which would
 * leave another holder of the kernel's socket): claimed, then adopted if
 * it may be. */
static int claim_to_use(struct sv_fd *f)
{
	int r = claim(f);
	if (r == 0 && atomic_load_explicit(&foreign_of(f)->shared, memory_order_relaxed))
		maybe_adopt(f);
	return r;
}

static ssize_t c_recvmsg(struct sv_fd *f, struct msghdr *msg, int flags)
{
	int r = claim_to_use(f);
	if (r < 0)
		return r;
	struct sv_kcalls *kc = &foreign_of(f)->kc;
	struct sv_stream *next = sv_kcalls_enter(kc);
	if (next) {
		sv_enter();
		long got = sv_stream_recvmsg(next, msg, flags);
		sv_stream_put(next);
		sv_leave();
		return got;
	}
	ssize_t n = sv_real.recvmsg(f->fd, msg, flags);
	int err = errno;
	sv_kcalls_leave(kc);
	return n < 0 ? -err : n;
}

static ssize_t c_sendmsg(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	int r = claim_to_use(f);
	if (r < 0)
		return r;
	struct sv_kcalls *kc = &foreign_of(f)->kc;
	struct sv_stream *next = sv_kcalls_enter(kc);
	if (next) {
		sv_enter();
		long sent = sv_stream_sendmsg(next, msg, flags);
		sv_stream_put(next);
		sv_leave();
		return sent;
	}
	ssize_t n = sv_real.sendmsg(f->fd, msg, flags);
	int err = errno;
	sv_kcalls_leave(kc);
	return n < 0 ? -err : n;
}

static int c_shutdown(struct sv_fd *f, int how)
{
	int r = claim(f);
	if (r < 0)
		return r;
	return sv_real.shutdown(f->fd, how) < 0 ? -errno : 0;
}

static int c_close(struct sv_fd *f)
{
	/* Shared, this process may hold the socket on another fd still (a
	 * dup): the owner's look into /proc tells. */
	struct sv_foreign *c = foreign_of(f);
	if (c->pid == getpid() && !atomic_load(&c->shared))
		sv_shares_left(&c->ref);
	return sv_kernel_close(f);
}

/* The owner's table is about to be left (creds.c), after which a claim
 * reads lost: claim now, while it is shared (the owner then takes the
 * connection back to TCP for us), and if the owner still holds its copy,
 * count ours as one it cannot follow, so that it never takes the
 * connection to RDMA again under us. */
static void c_leave_family(struct sv_fd *f)
{
	if (claim(f) == 0 && atomic_load(&foreign_of(f)->shared))
		sv_shares_unlist(&foreign_of(f)->ref);
}

static void c_release(struct sv_fd *f)
{
	sv_kcalls_forget(&foreign_of(f)->kc);
	free(foreign_of(f));
}

/* exec, spawn, SCM_RIGHTS, io_uring: whoever gets the socket next uses
 * the kernel's. */
static int c_detach(struct sv_fd *f, const char *call)
{
	(void)call;
	if (claim(f) == 0 && atomic_load(&foreign_of(f)->shared))
		sv_shares_unlist(&foreign_of(f)->ref); /* passed where we cannot follow */
	return 0;
}

/* A fork here: one more holder of a copy, listed in the parent's table
 * once the fork's outcome is known (c_after_fork). */
static int c_detach_for_fork(struct sv_fd *f)
{
	struct sv_foreign *c = foreign_of(f);
	if (c->pid == getpid() && sv_shares_fork_begin(&c->ref))
		c->forking++;
	return 0;
}

/* In a fork's child of this process: the copy is the new process's now. */
static void c_atfork_child(struct sv_fd *f)
{
	foreign_of(f)->pid = getpid();
	foreign_of(f)->forking = 0;
}

static void c_after_fork(struct sv_fd *f, pid_t pid)
{
	struct sv_foreign *c = foreign_of(f);
	if (pid != 0 && c->pid == getpid() && c->forking) {
		c->forking--;
		sv_shares_fork_end(&c->ref, pid);
	}
}

/* dup: the copies would have to claim together; the kernel's socket it is,
 * but for a lost copy, whose dup is a lost copy too, and a shared one,
 * whose dup the owner must follow as well (its forks): c_add_copy. */
static int c_share(struct sv_fd *f)
{
	return claim(f) < 0 || atomic_load(&foreign_of(f)->shared) ? 0 : 1;
}

static bool c_add_copy(struct sv_fd *f, int nfd)
{
	struct sv_foreign *c = sv_foreign_new(&foreign_of(f)->ref);
	struct sv_fd *nf = c ? sv_fd_new(nfd, &sv_foreign_ops, c) : NULL;
	if (!nf) {
		free(c);
		return false;
	}
	atomic_store(&c->lost, atomic_load(&foreign_of(f)->lost));
	atomic_store(&c->shared, atomic_load(&foreign_of(f)->shared));
	bool ok = sv_fd_install(nf) == 0;
	sv_fd_put(nf);
	return ok;
}

/* Readiness: claimed first, then the kernel's, but for a lost connection,
 * which reads as an error. */
static void w_split(struct sv_fd *f, short events, short *own, short *kernel, uint64_t *gen)
{
	*gen = 0;
	if (claim_to_use(f) < 0) {
		*own = (short)((events & (POLLIN | POLLRDNORM | POLLOUT)) | POLLERR | POLLHUP);
		*kernel = 0;
		return;
	}
	*own = 0;
	*kernel = events;
}

static short w_recheck(struct sv_fd *f, short events, short rev)
{
	(void)f;
	(void)events;
	return rev;
}

static void w_nothing(struct sv_fd *f)
{
	(void)f;
}

static int w_sources(struct sv_fd *f, struct sv_hub_watch *w, struct pollfd *out, bool *again,
		     uint64_t gen)
{
	(void)f;
	(void)w;
	(void)out;
	(void)again;
	(void)gen;
	return 0;
}

static void w_done(struct sv_fd *f, struct sv_hub_watch *w)
{
	(void)f;
	(void)w;
}

static uint32_t w_spin_us(struct sv_fd *f)
{
	(void)f;
	return 0;
}

static void w_waited(struct sv_fd *f, uint64_t us)
{
	(void)f;
	(void)us;
}

/* epoll: the set watches the kernel's socket, once it is the whole
 * connection. */
static bool w_kernel_only(struct sv_fd *f)
{
	(void)claim(f);
	return true;
}

static const struct sv_fd_wait_ops foreign_wait_ops = {
	.split = w_split,
	.recheck = w_recheck,
	.waits = w_nothing,
	.sources = w_sources,
	.done = w_done,
	.spin_us = w_spin_us,
	.waited = w_waited,
	.kernel_only = w_kernel_only,
};

const struct sv_fd_ops sv_foreign_ops = {
	.name = "kept by the parent",
	.recvmsg = c_recvmsg,
	.sendmsg = c_sendmsg,
	.shutdown = c_shutdown,
	.setsockopt = sv_kernel_setsockopt,
	.getsockopt = sv_kernel_getsockopt,
	.close = c_close,
	.release = c_release,
	.detach = c_detach,
	.detach_for_fork = c_detach_for_fork,
	.atfork_child = c_atfork_child,
	.after_fork = c_after_fork,
	.leave_family = c_leave_family,
	.share = c_share,
	.add_copy = c_add_copy,
	.wait = &foreign_wait_ops,
	/* fdopen: glibc's FILE must read and write through c_recvmsg. */
	.stdio_cookie = true,
};

struct sv_foreign *sv_foreign_new(const struct sv_share_ref *ref)
{
	struct sv_foreign *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->ref = *ref;
	c->pid = getpid();
	atomic_flag_clear(&c->looking);
	return c;
}
