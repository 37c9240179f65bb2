/* The operations of fds libsovia accelerates, and the hooks that make a
 * socket libsovia's. Every op runs libsovia's code under the re-entry
 * guard: the libraries it calls (libibverbs, librdmacm) read and write
 * their own fds, and those calls go straight to libc. */
#include "share.h"
#include "sovia_ops.h"

#include "shares.h"

#include "guard.h"
#include "log.h"
#include "peers.h"
#include "readiness.h"
#include "stream.h"
#include "upgrade.h"
#include "wait.h"

#include <errno.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <unistd.h>

/* The stream, as the calls that end, copy or hand over the fd see it. */
static struct sv_stream *raw_stream(struct sv_fd *f)
{
	return f->priv;
}

/* The stream, as the application's use of it sees it: a connection a
 * fork's child adopted starts its upgrade at its first use, so that a
 * child that only execs (inetd) or closes it starts no RDMA. */
static struct sv_stream *stream_of(struct sv_fd *f)
{
	struct sv_stream *s = f->priv;
	if (sv_stream_start_pending(s)) {
		sv_enter();
		sv_share_start_at_first_use(s);
		sv_leave();
	}
	return s;
}

/* ---- Connected streams -------------------------------------------------- */

/* A connection that became the kernel's socket alone (a fallback) is not
 * SERVED any more: a signal handler's call on it, from inside libsovia,
 * then goes to the kernel (reentry.c). Told by the calls that see it. */
static void note_plain(struct sv_fd *f)
{
	if (sv_stream_kernel_only_seen(stream_of(f)))
		sv_fd_unserve(f);
}

static ssize_t st_recvmsg(struct sv_fd *f, struct msghdr *msg, int flags)
{
	note_plain(f);
	sv_enter();
	long r = sv_stream_recvmsg(stream_of(f), msg, flags);
	sv_leave();
	note_plain(f);
	return r;
}

static ssize_t st_sendmsg(struct sv_fd *f, const struct msghdr *msg, int flags)
{
	note_plain(f);
	sv_enter();
	long r = sv_stream_sendmsg(stream_of(f), msg, flags);
	sv_leave();
	note_plain(f);
	return r;
}

static int st_shutdown(struct sv_fd *f, int how)
{
	sv_enter();
	int r = sv_stream_shutdown(stream_of(f), how);
	sv_leave();
	return r;
}

static int st_setsockopt(struct sv_fd *f, int level, int name, const void *val, socklen_t len)
{
	sv_enter();
	int r = sv_stream_setsockopt(stream_of(f), level, name, val, len);
	sv_leave();
	return r;
}

static int st_getsockopt(struct sv_fd *f, int level, int name, void *val, socklen_t *len)
{
	/* The connection's error: libsovia's first (a reset over the QP, a
	 * failed resume), as the kernel reports a pending one, then the
	 * kernel's. */
	if (level == SOL_SOCKET && name == SO_ERROR && val && len &&
	    *len >= (socklen_t)sizeof(int)) {
		sv_enter();
		int err = -sv_stream_take_error(stream_of(f));
		sv_leave();
		if (err) {
			memcpy(val, &err, sizeof(err));
			*len = sizeof(err);
			return 0;
		}
	}
	/* Options are read from the kernel's socket, which gets every one;
	 * TCP_INFO is corrected where the QP carries the connection. */
	int r = sv_kernel_ops.getsockopt(f, level, name, val, len);
	if (r == 0 && level == IPPROTO_TCP && name == TCP_INFO && val && len) {
		sv_enter();
		sv_stream_tcp_info(stream_of(f), val, *len);
		sv_leave();
	}
	return r;
}

static int st_close(struct sv_fd *f)
{
	sv_enter();
	int r = sv_stream_close(raw_stream(f), f->fd);
	sv_leave();
	return r;
}

static void st_release(struct sv_fd *f)
{
	sv_enter();
	sv_stream_put(raw_stream(f));
	sv_leave();
}

static int st_detach(struct sv_fd *f, const char *call)
{
	sv_enter();
	sv_dbg("fd %d: going back to plain TCP for %s", f->fd, call);
	int r = sv_stream_detach(raw_stream(f), call);
	if (r == 0) {
		sv_share_unpark(raw_stream(f)); /* whoever gets it is not followed */
		sv_fd_make_plain_all(f->priv);
	}
	sv_leave();
	return r;
}

static bool replace_entry(int fd, const struct sv_fd_ops *ops, void *priv);

/* Before a fork: a connection handed to the child becomes a held entry in
 * the parent (held.c); the child's copy of that entry adopts it. */
static int st_detach_for_fork(struct sv_fd *f)
{
	sv_enter();
	struct sv_hand hand;
	uint64_t tx, rx;
	int r = sv_share_detach_for_fork(raw_stream(f), &hand, &tx, &rx);
	if (r == 0) {
		struct sv_held *h = hand.h ? sv_held_new(&hand, tx, rx) : NULL;
		if (hand.h && !h)
			sv_holders_spoil(&hand); /* our copy could not be followed */
		sv_share_unpark(raw_stream(f)); /* the child's copy is not followed */
		if (h && replace_entry(f->fd, &sv_held_ops, h))
			sv_epoll_fd_plain(f->fd);
		else
			sv_fd_make_plain_all(f->priv);
	}
	sv_leave();
	return r;
}

/* After the fork, in the parent: a kept connection learns its child. */
static void st_after_fork(struct sv_fd *f, pid_t pid)
{
	if (pid == 0)
		return;
	sv_enter();
	sv_share_forked(raw_stream(f), pid);
	sv_leave();
}

/* In the fork's child: a connection the parent kept on RDMA is its copy
 * (foreign.c); any other is the kernel's. */
static void st_atfork_child(struct sv_fd *f)
{
	struct sv_share_ref ref;
	if (!sv_share_kept_for_child(raw_stream(f), &ref)) {
		sv_ours_atfork_child(f);
		return;
	}
	struct sv_foreign *c = sv_foreign_new(&ref);
	struct sv_fd *nf = c ? sv_fd_new(f->fd, &sv_foreign_ops, c) : NULL;
	if (!nf) {
		/* Its calls would go to a socket whose bytes the parent's QP
		 * carries: they fail instead (the entry stays the parent's). */
		sv_err("fd %d: no memory for the copy of a connection the parent keeps on RDMA",
		       f->fd);
		free(c);
		return;
	}
	/* An epoll set the child inherits watches it: no successor. */
	atomic_store(&nf->in_epoll, atomic_load(&f->in_epoll));
	(void)sv_fd_remove(f->fd); /* the parent's: leaked on purpose */
	sv_fd_install(nf);
	sv_fd_put(nf);
}

static int st_share(struct sv_fd *f)
{
	sv_enter();
	struct sv_stream *s = raw_stream(f);
	int r = 1;
	if (sv_stream_kernel_only(s))
		sv_share_unpark(s); /* the new fd is the kernel's: no second life */
	else
		r = sv_stream_share(s);
	sv_leave();
	return r;
}

static const struct sv_fd_ops sv_stream_ops;

/* Make (ops, priv) fd's entry. On failure priv is released and the fd
 * stays as it was: the caller must not go on with priv. */
static bool replace_entry(int fd, const struct sv_fd_ops *ops, void *priv)
{
	struct sv_fd *f = sv_fd_new(fd, ops, priv);
	if (!f) {
		struct sv_fd tmp = {.fd = fd, .priv = priv};
		if (ops->release)
			ops->release(&tmp);
		return false;
	}
	bool ok = sv_fd_install(f) == 0;
	if (!ok)
		sv_dbg("fd %d is beyond the fd table: it stays on the kernel", fd);
	sv_fd_put(f);
	return ok;
}

/* glibc's stdin, stdout and stderr read and write fds 0-2 with its
 * internal calls, past the interposer, and a program dup2()s a socket
 * there to use them: ftpd -D's child puts its control connection on 0 and
 * 1, then reads commands with getc(stdin) and answers with printf(). So
 * libsovia's own FILE takes that fd's place (sv_stdio_take_std), if
 * nothing used glibc's yet, and the copy is a stream like any other.
 * Otherwise the copy is refused (the connection goes back to plain TCP),
 * unless the connection was handed to us untouched: inetd's child puts it
 * on 0-2 only to exec the service, which continues it (exec_hand.c);
 * until then it stays TCP. */
static bool std_copy_ok(struct sv_stream *s, int ofd, int nfd)
{
	if (sv_stdio_ours(nfd))
		return true;
	int r = sv_stdio_take_std(nfd);
	if (r == 0) {
		sv_dbg("fd %d: a copy on %d: libsovia's FILE replaces glibc's %s", ofd, nfd,
		       nfd == 0 ? "stdin" : nfd == 1 ? "stdout" : "stderr");
		return true;
	}
	if (sv_share_expose_std(s))
		return true;
	sv_info("fd %d: a copy on %d, whose stdio FILE libsovia cannot replace (%s): back to TCP",
		ofd, nfd, r == -EBUSY ? "used already" : strerror(-r));
	return false;
}

static bool st_add_copy(struct sv_fd *f, int nfd)
{
	sv_enter();
	struct sv_stream *s = raw_stream(f);
	if (nfd <= STDERR_FILENO && !std_copy_ok(s, f->fd, nfd)) {
		sv_leave();
		return false;
	}
	sv_stream_get(s); /* the new entry's; released by replace_entry on failure */
	bool ok = replace_entry(nfd, &sv_stream_ops, s);
	if (ok)
		sv_stream_opened(s);
	sv_leave();
	return ok;
}

static bool st_exec_hand(struct sv_fd *f, struct sv_hand *hand)
{
	sv_enter();
	bool r = sv_share_exec_hand(raw_stream(f), hand);
	sv_leave();
	return r;
}

static bool st_exec_client(struct sv_fd *f, const char *call, uint64_t *dtx, uint64_t *drx)
{
	sv_enter();
	struct sv_stream *s = raw_stream(f);
	int r = sv_stream_detach(s, call);
	bool ok = r == 0 && sv_share_exec_client(s, dtx, drx);
	if (r == 0)
		sv_fd_make_plain_all(f->priv); /* the new image's, or plain TCP */
	sv_leave();
	return ok;
}

bool sv_ops_continue_client(int fd, const struct sv_share_redo *redo)
{
	sv_enter();
	struct sv_stream *n = sv_share_adopted(fd, redo, NULL, NULL, NULL, NULL);
	bool ok = false;
	if (n) {
		sv_stream_start_at_use(n); /* not from the constructor */
		ok = replace_entry(fd, &sv_stream_ops, n);
	}
	sv_leave();
	return ok;
}

static long st_inq(struct sv_fd *f)
{
	sv_enter();
	long r = sv_stream_inq(stream_of(f));
	sv_leave();
	return r;
}

static long st_outq(struct sv_fd *f)
{
	sv_enter();
	long r = sv_stream_outq(stream_of(f));
	sv_leave();
	return r;
}

static void st_mode_changed(struct sv_fd *f)
{
	sv_stream_mode_changed(stream_of(f));
}

/* The parent's objects stay the parent's: the entry is never released
 * here (its release would touch the parent's QP). */
void sv_ours_atfork_child(struct sv_fd *f)
{
	struct sv_fd *nf = sv_fd_new(f->fd, &sv_kernel_ops, NULL);
	if (!nf)
		return;
	(void)sv_fd_remove(f->fd); /* leaked on purpose */
	sv_fd_install(nf);
	sv_fd_put(nf);
}

/* ---- Readiness ---------------------------------------------------------------- */

static void w_split(struct sv_fd *f, short events, short *own, short *kernel, uint64_t *gen)
{
	sv_stream_poll_split(stream_of(f), events, own, kernel, gen);
	note_plain(f);
}

static short w_recheck(struct sv_fd *f, short events, short rev)
{
	return sv_stream_poll_recheck(stream_of(f), events, rev);
}

static void w_waits(struct sv_fd *f)
{
	sv_stream_poll_waits(stream_of(f));
}

static int w_sources(struct sv_fd *f, struct sv_hub_watch *w, struct pollfd *out, bool *again,
		     uint64_t gen)
{
	return sv_stream_poll_sources(stream_of(f), w, out, again, gen);
}

static void w_done(struct sv_fd *f, struct sv_hub_watch *w)
{
	sv_stream_poll_done(stream_of(f), w);
}

static bool w_arm(struct sv_fd *f, uint64_t gen, short *tcp_events)
{
	return sv_stream_poll_arm(stream_of(f), gen, tcp_events);
}

/* epoll's watch: the application waits on it. */
static struct sv_hub_node *w_node(struct sv_fd *f)
{
	struct sv_stream *s = stream_of(f);
	sv_stream_app_uses(s);
	return sv_stream_hub_node(s);
}

static uint32_t w_spin_us(struct sv_fd *f)
{
	return sv_stream_spin_us(stream_of(f));
}

static void w_waited(struct sv_fd *f, uint64_t us)
{
	sv_stream_waited(stream_of(f), us);
}

static void w_marks(struct sv_fd *f, struct sv_marks *m)
{
	sv_stream_marks(stream_of(f), m);
}

static bool w_kernel_only(struct sv_fd *f)
{
	sv_enter();
	bool r = sv_stream_kernel_only(stream_of(f));
	sv_leave();
	note_plain(f);
	return r;
}

/* The view reads counters only: an adopted connection's upgrade still
 * waits for the application's first use (stream_of). */
static void st_view(struct sv_fd *f, struct sv_conn_view *v)
{
	sv_stream_view(raw_stream(f), v);
	v->fd = f->fd; /* the fd asked about, which may be a dup */
}

static void st_leave_family(struct sv_fd *f)
{
	sv_share_leave_family(raw_stream(f));
}

static const struct sv_fd_wait_ops stream_wait_ops = {
	.split = w_split,
	.recheck = w_recheck,
	.waits = w_waits,
	.sources = w_sources,
	.done = w_done,
	.arm = w_arm,
	.node = w_node,
	.spin_us = w_spin_us,
	.waited = w_waited,
	.marks = w_marks,
	.kernel_only = w_kernel_only,
};

static const struct sv_fd_ops sv_stream_ops = {
	.name = "stream",
	.recvmsg = st_recvmsg,
	.sendmsg = st_sendmsg,
	.shutdown = st_shutdown,
	.setsockopt = st_setsockopt,
	.getsockopt = st_getsockopt,
	.close = st_close,
	.release = st_release,
	.detach = st_detach,
	.detach_for_fork = st_detach_for_fork,
	.share = st_share,
	.add_copy = st_add_copy,
	.exec_hand = st_exec_hand,
	.exec_client = st_exec_client,
	.inq = st_inq,
	.outq = st_outq,
	.mode_changed = st_mode_changed,
	.atfork_child = st_atfork_child,
	.after_fork = st_after_fork,
	.leave_family = st_leave_family,
	.view = st_view,
	.wait = &stream_wait_ops,
	.stdio_cookie = true,
};

/* ---- Hooks of the kernel's sockets ------------------------------------------------ */

void sv_listen_release(struct sv_fd *f)
{
	sv_enter();
	sv_upgrade_unlisten(f->priv);
	sv_leave();
}

void sv_listen_atfork_child(struct sv_fd *f)
{
	struct sv_listener *l = sv_upgrade_listen_inherited(f->priv, f->fd);
	if (!l) {
		sv_ours_atfork_child(f);
		return;
	}
	struct sv_fd *nf = sv_fd_new(f->fd, &sv_listen_ops, l);
	if (!nf) {
		/* l is leaked: the upgrade's lock is not the child's yet. */
		sv_ours_atfork_child(f);
		return;
	}
	/* An epoll set the child inherits watches it: no successor. */
	atomic_store(&nf->in_epoll, atomic_load(&f->in_epoll));
	(void)sv_fd_remove(f->fd); /* the parent's: leaked on purpose */
	sv_fd_install(nf);
	sv_fd_put(nf);
}

void sv_socket_listened(struct sv_fd *f)
{
	sv_enter();
	struct sv_listener *l = sv_upgrade_listen(f->fd);
	sv_leave();
	if (l)
		(void)replace_entry(f->fd, &sv_listen_ops, l);
}

void sv_listen_will_accept(struct sv_fd *f)
{
	sv_enter();
	sv_upgrade_will_accept(f->priv);
	sv_leave();
}

void sv_listen_accepted(struct sv_fd *lf, int fd)
{
	sv_enter();
	/* The listener entry (and so its priv) lives while the caller holds lf. */
	if (sv_upgrade_listener_usable(lf->priv)) {
		struct sv_stream *s = sv_stream_new(fd, false);
		if (s) {
			sv_stream_get(s); /* for the upgrade, past the entry's reference */
			if (replace_entry(fd, &sv_stream_ops, s))
				sv_stream_start_server(s, lf->priv);
			sv_stream_put(s);
		}
	}
	sv_leave();
}

bool sv_stream_fd_adopt(const int *fds, int n, const struct sv_hand *hand, uint64_t tx,
			uint64_t rx)
{
	sv_enter();
	struct sv_stream *s = sv_share_adopt(fds[0], hand, tx, rx);
	bool ok = s != NULL;
	if (ok && n > 1)
		ok = sv_stream_share(s) == 0; /* any of the fds may be closed first */
	for (int i = 0; ok && i < n; i++) {
		if (i > 0)
			sv_stream_opened(s);
		sv_stream_get(s); /* the entry's; released by replace_entry on failure */
		ok = replace_entry(fds[i], &sv_stream_ops, s); /* started at its first use */
	}
	if (!ok && s)
		sv_fd_make_plain_all(s); /* the entries made go; the last put drops the hand */
	sv_stream_put(s);
	sv_leave();
	return ok;
}

/* ---- A second life (src/share/redo.c) ------------------------------------------ */

/* No call of any kind is under way on the predecessor's entry: the
 * successor holds the only reference left (the table's went at the swap;
 * an epoll set's would stay, but a stream in one gets no successor). */
static bool entry_idle(void *e)
{
	return atomic_load(&((struct sv_fd *)e)->refs) == 1;
}

static void entry_put(void *e)
{
	sv_fd_put(e);
}

/* The application's fd of s, back on plain TCP, becomes a new stream that
 * moves to RDMA again; not an fd an epoll set watches (the set would not
 * see the successor). */
static bool revive(struct sv_stream *s, int fd, struct sv_listener *l)
{
	sv_enter();
	struct sv_fd *f = sv_fd_get(fd);
	struct sv_stream *n = f && f->priv == s && !atomic_load(&f->in_epoll)
				      ? sv_share_successor(s, f, entry_idle, entry_put)
				      : NULL;
	if (!n)
		sv_fd_put(f);
	/* f's reference is n's from here on. */
	struct sv_fd *nf = n ? sv_fd_new(fd, &sv_stream_ops, n) : NULL;
	bool ok = nf && sv_fd_swap(f, nf) == 0; /* not if closed meanwhile */
	if (ok) {
		sv_share_successor_took(s, n);
		sv_stream_start_revived(n, l);
	}
	if (nf)
		sv_fd_put(nf); /* the table's now, or n goes with it */
	else if (n)
		sv_stream_put(n);
	sv_leave();
	return ok;
}

bool sv_ops_adopt(struct sv_fd *f, const struct sv_share_redo *redo, struct sv_kcalls *kc)
{
	sv_enter();
	struct sv_fd *g = sv_fd_get(f->fd);
	struct sv_stream *n = g == f ? sv_share_adopted(f->fd, redo, g, entry_idle, entry_put, kc)
				     : NULL;
	if (!n)
		sv_fd_put(g);
	/* g's reference is n's from here on. */
	struct sv_fd *nf = n ? sv_fd_new(f->fd, &sv_stream_ops, n) : NULL;
	bool ok = nf && sv_fd_swap(f, nf) == 0; /* not if closed meanwhile */
	if (ok) {
		sv_kcalls_took(kc, n);
		sv_stream_start_revived(n, NULL);
	}
	if (nf)
		sv_fd_put(nf);
	else if (n)
		sv_stream_put(n);
	sv_leave();
	return ok;
}

void sv_ops_init(void)
{
	sv_share_init();
	sv_share_set_revive(revive);
}

void sv_ops_after_fork(pid_t pid)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (f && f->ops->after_fork)
			f->ops->after_fork(f, pid);
		sv_fd_put(f);
	}
}

void sv_socket_connected(struct sv_fd *f, const struct sockaddr *to, socklen_t len,
			 bool in_progress)
{
	if (atomic_load(&f->in_epoll)) {
		/* The kernel's epoll watches the fd already and would not see
		 * data that moved to the QP. */
		sv_info("fd %d: in an epoll set before its connect(): stays on TCP", f->fd);
		return;
	}
	struct sockaddr_storage dst = {0};
	if (to && len <= sizeof(dst))
		memcpy(&dst, to, len);
	if (sv_peers_plain(&dst)) {
		/* Lately no libsovia listened there, or no RDMA route led
		 * there: the kernel keeps the connection, at its own cost. */
		sv_dbg("fd %d: its peer is known to be plain: stays on the kernel", f->fd);
		return;
	}
	sv_enter();
	struct sv_stream *s = sv_stream_new(f->fd, true);
	if (s) {
		sv_stream_get(s);
		if (replace_entry(f->fd, &sv_stream_ops, s)) {
			if (in_progress)
				sv_stream_start_connecting(s, to, len);
			else
				sv_stream_start_client(s);
		}
		sv_stream_put(s);
	}
	sv_leave();
}

/* ---- Process-wide ------------------------------------------------------------------ */

void sv_on_exit(void)
{
	sv_enter();
	sv_stream_exit_flush_all();
	sv_leave();
}

void sv_fd_make_plain_all(void *priv)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool copy = f->priv == priv;
		sv_fd_put(f);
		if (copy) {
			(void)replace_entry(fd, &sv_kernel_ops, NULL);
			sv_epoll_fd_plain(fd);
		}
	}
}

void sv_ops_atfork_child(void)
{
	sv_fdtable_atfork_child();
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		if (f->ops->atfork_child)
			f->ops->atfork_child(f);
		sv_fd_put(f);
	}
	sv_epoll_atfork_child();
	sv_stdio_atfork_child();
	sv_share_atfork_child();
}
