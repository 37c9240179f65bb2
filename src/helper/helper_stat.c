/* The view sovia-stat(8) asks for: the helper thread answers on a unix
 * socket, SV_STAT_DIR.EUID/PID, with its process's connections, read from
 * the counters each stream keeps anyway. Nothing is added to the data
 * path; the cost is one listening socket per process and the helper's
 * work when someone asks.
 *
 * The directory is the user's alone (mode 0700): only the process's own
 * user and root can connect. An abstract name would let any user connect,
 * and so send the helper files in a message: closing such a connection
 * would release them here, and the last close of a lingering TCP socket
 * waits for its linger, the helper with it. A directory of that name made
 * by another user first gets the process no view (said once, at debug
 * level): a cost of visibility, never of service.
 *
 * The answer is a memfd passed with SCM_RIGHTS, so that a slow or stopped
 * reader never makes the helper wait: it writes the whole view, seals it
 * (no write, no growth: the reader trusts its size) and sends one small
 * message, then goes on. Only the process's own user and root get the
 * view (SO_PEERCRED); anyone else gets one byte, 'n', and no fd. A
 * connection closed with nothing (no memory for the view) is a view this
 * process could not give.
 *
 * The view's text, one line per connection after a header line:
 *   libsovia-stat 1 pid=PID version=VERSION
 *   fd=N role=client|server local=A:P peer=A:P tx=rdma|tcp rx=rdma|tcp
 *     state=NAME fallback=NAME rdma_tx_bytes=N rdma_rx_bytes=N
 *     tcp_tx_bytes=N tcp_rx_bytes=N credit_stalls=N time_to_rdma_us=N
 *     call=NAME|-  (since 0.1: fallback unsupported-call's call)
 * (one line in the answer, wrapped here). Words are added only at a line's
 * end, so a reader of version 1 keeps working. */
#include "addr.h"
#include "helper_int.h"
#include "fdpass.h"

#include "log.h"
#include "ownfd.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U /* Linux 6.3's; older headers lack it */
#endif

#ifndef SOVIA_VERSION_STRING
#define SOVIA_VERSION_STRING "?"
#endif

static const char *medium_name(enum sv_view_medium m)
{
	return m == SV_VIEW_RDMA ? "rdma" : m == SV_VIEW_TCP ? "tcp" : "none";
}

/* Our effective user's directory of views: made if missing; one that is
 * there must be a directory of that user's alone. 0, or -errno (-EPERM:
 * another user's, or open to others). */
static int own_dir(const char *dir)
{
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	struct stat st;
	if (lstat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
		return -EPERM;
	return 0;
}

/* Sockets of processes that are gone (their pid free or another's now:
 * one of ours of the same pid is bound anew) are removed as we come. */
static void prune(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) && n < 256; n++) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (pid > 0 && !*end && kill((pid_t)pid, 0) < 0 && errno == ESRCH)
			unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

int sv_stat_open(void)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	char dir[64];
	snprintf(dir, sizeof(dir), "%s.%u", SV_STAT_DIR, (unsigned)geteuid());
	int r = own_dir(dir);
	if (r < 0)
		return r;
	prune(dir);
	int n = snprintf(a.sun_path, sizeof(a.sun_path), "%s/%d", dir, (int)getpid());
	if (n < 0 || (size_t)n >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	unlink(a.sun_path); /* a former process's of our pid */
	int fd = SV_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (SV_REAL(bind)(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    SV_REAL(listen)(fd, 8) < 0) {
		int err = -errno;
		SV_REAL(close)(fd);
		return err;
	}
	return sv_ownfd_move(fd);
}

void sv_stat_listen_again(int lfd)
{
	if (SV_REAL(listen)(lfd, 8) < 0)
		sv_dbg("helper: sovia-stat's socket after a credential change: %s", strerror(errno));
}

static void write_line(const struct sv_conn_view *v, void *arg)
{
	int out = *(int *)arg;
	char local[64], peer[64];
	sv_addr_str(&v->local, local, sizeof(local));
	sv_addr_str(&v->peer, peer, sizeof(peer));
	dprintf(out,
		"fd=%d role=%s local=%s peer=%s tx=%s rx=%s state=%s fallback=%s "
		"rdma_tx_bytes=%llu rdma_rx_bytes=%llu tcp_tx_bytes=%llu tcp_rx_bytes=%llu "
		"credit_stalls=%llu time_to_rdma_us=%llu call=%s\n",
		v->fd, v->is_client ? "client" : "server", local, peer, medium_name(v->tx),
		medium_name(v->rx), v->state, v->fallback, (unsigned long long)v->rdma_tx_bytes,
		(unsigned long long)v->rdma_rx_bytes, (unsigned long long)v->tcp_tx_bytes,
		(unsigned long long)v->tcp_rx_bytes, (unsigned long long)v->credit_stalls,
		(unsigned long long)v->time_to_rdma_us, v->call ? v->call : "-");
}

static bool may_see(int conn)
{
	struct ucred c;
	socklen_t l = sizeof(c);
	if (SV_REAL(getsockopt)(conn, SOL_SOCKET, SO_PEERCRED, &c, &l) < 0)
		return false;
	return c.uid == 0 || c.uid == getuid() || c.uid == geteuid();
}

static void refuse(int conn)
{
	char no = 'n';
	ssize_t r = SV_REAL(send)(conn, &no, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)r; /* an asker that went away has nothing to be told */
}

/* The sealed view, to the asker. */
static void send_view(int conn, int view)
{
	ssize_t r = sv_fd_send(conn, "v", 1, view, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)r; /* an asker that went away has nothing to be told */
}

static void answer(int conn)
{
	/* Not executable where the kernel can say so (6.3 on: without it
	 * the kernel warns, and vm.memfd_noexec=2 refuses the memfd). */
	int view = memfd_create("libsovia-stat", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
	if (view < 0 && errno == EINVAL)
		view = memfd_create("libsovia-stat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (view < 0)
		return;
	dprintf(view, "libsovia-stat 1 pid=%d version=%s\n", (int)getpid(), SOVIA_VERSION_STRING);
	if (sv_helper_hooks.view_all)
		sv_helper_hooks.view_all(write_line, &view);
	if (SV_REAL(fcntl)(view, F_ADD_SEALS,
			   F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) == 0)
		send_view(conn, view);
	SV_REAL(close)(view);
}

void sv_stat_serve(int lfd)
{
	for (int i = 0; i < 16; i++) { /* a bound on one wake-up's work */
		int conn = SV_REAL(accept4)(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (conn < 0)
			return;
		if (may_see(conn))
			answer(conn);
		else
			refuse(conn);
		SV_REAL(close)(conn);
	}
}
