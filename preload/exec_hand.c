/* A connection handed to this process survives an exec that keeps its
 * fds: the new image continues it, and may take it to RDMA.
 *
 * inetd's child gets the connection handed by inetd's fork (held.c), puts
 * it on fds 0, 1 and 2, closes the rest and execs the service. Before the
 * exec the connection is still plain TCP, untouched (sv_share_exec_hand);
 * the exec passes it on in the environment, with the holders' table that
 * says who holds it (holders.h: a memfd, which survives the exec):
 *
 *   SOVIA_HANDED=<pid>:<table fd>:<conn>[,<conn>...]
 *   <conn> = <slot>.<gen>.<socket inode>.<fd>[+<fd>...][~<dtx>.<drx>]
 *
 * The pid binds it to this process (exec keeps the pid; the program's own
 * children ignore it). The new image's constructor checks every part
 * against the kernel (the fds are the same sockets, the table is ours and
 * still has the entry as this process's), takes glibc's stdin, stdout and
 * stderr over where they are the connection (stdio_std.c), and makes the
 * fds one stream, which starts its upgrade at its first use, as a fork's
 * child does. What TCP carried so far comes from the kernel's counters
 * (sv_tcp_app_counts), so bytes the images moved past libsovia (glibc's
 * stdio before the exec, a program between that ignored LD_PRELOAD) are
 * counted too, plus what the connection's QP carried before a fork handed
 * it (dtx, drx: struct sv_hand). What such a program between could do that libsovia cannot
 * see is leave a child holding the connection (README, Limitations).
 *
 * A client connection of this image (no table: the client asks) goes on
 * the same way, back on plain TCP first, and the new image's stream
 * upgrades it again (the server's end, back on TCP too, matches it as a
 * second life: src/share/redo.c):
 *
 *   SOVIA_CONTINUED=<pid>:<client>[,<client>...]
 *   <client> = <socket inode>.<fd>.<dtx>.<drx>
 *
 * dtx and drx: what its offsets exceed the kernel's counts by (the QP's
 * bytes, modulo 2^64). One fd each (a dup would be the kernel's there).
 *
 * The table goes only where the environment passed to exec preloads
 * libsovia, and only if the process's ids are the table's creator's (a
 * service inetd runs as another user stays TCP: it must not be able to
 * write the table, where a forged entry would redirect another client's
 * upgrade); the new image makes its copy close-on-exec at once. Every
 * other connection goes back to plain TCP first, as before (unserved.c). */
#include "share.h"
#include "config.h"
#include "log.h"
#include "ownfd.h"
#include "preload.h"
#include "real.h"
#include "shares.h"
#include "sovia_ops.h"
#include "stream.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#define HANDED_VAR "SOVIA_HANDED"
#define CLIENTS_VAR "SOVIA_CONTINUED"
#define MAX_CONNS 8
#define MAX_FDS 8

struct handed {
	struct sv_hand hand;
	uint64_t ino;
	int nfds;
	int fds[MAX_FDS];
};

struct client {
	uint64_t ino, dtx, drx;
	int fd;
};

/* The table the image before handed on, and our copy of its fd (set in
 * the constructor, read only after): an exec of ours hands it on again. */
static struct sv_holders *inherited;
static int inherited_fd = -1;

/* ---- Before the exec ------------------------------------------------------- */

/* Does the environment the exec passes preload libsovia (this module)?
 * Asked only when a connection could be handed on. */
static bool preloads_us(char *const envp[])
{
	static const char *name; /* this module's file name, once known */
	Dl_info info;
	if (!name && dladdr((void *)preloads_us, &info) && info.dli_fname) {
		const char *slash = strrchr(info.dli_fname, '/');
		name = slash ? slash + 1 : info.dli_fname;
	}
	if (!envp || !name)
		return false;
	for (char *const *e = envp; *e; e++) {
		if (strncmp(*e, "LD_PRELOAD=", 11) == 0)
			return *name && strstr(*e + 11, name) != NULL;
	}
	return false;
}

/* The table fd a new image of ours may have: the creator's ids are ours. */
static int table_fd_for_exec(const struct sv_holders *h)
{
	int fd = h == inherited ? inherited_fd : sv_holders_fd(h);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_uid != geteuid() || getuid() != geteuid() ||
	    getgid() != getegid())
		return -1;
	return fd;
}

/* Add fd of the connection `hand` to the list. False: it cannot go. */
static bool list_fd(struct handed *list, int *n, const struct sv_hand *hand, int fd)
{
	if (*n > 0 && list[0].hand.h != hand->h)
		return false; /* one table per exec: the parent's */
	struct handed *c = NULL;
	for (int i = 0; i < *n; i++) {
		if (list[i].hand.slot == hand->slot && list[i].hand.gen == hand->gen)
			c = &list[i];
	}
	if (!c) {
		struct stat st;
		if (*n == MAX_CONNS || fstat(fd, &st) < 0)
			return false;
		c = &list[(*n)++];
		*c = (struct handed){.hand = *hand, .ino = st.st_ino};
	}
	if (c->nfds == MAX_FDS)
		return false;
	c->fds[c->nfds++] = fd;
	return true;
}

/* The variable's value, or false when it does not fit. */
static bool format_var(char *buf, size_t size, int table_fd, const struct handed *list, int n)
{
	size_t len = 0;
	int w = snprintf(buf, size, HANDED_VAR "=%d:%d:", (int)getpid(), table_fd);
	for (int i = 0; w >= 0 && (size_t)w < size - len && i < n; i++) {
		len += (size_t)w;
		const struct handed *c = &list[i];
		w = snprintf(buf + len, size - len, "%s%d.%" PRIu64 ".%" PRIu64, i ? "," : "",
			     c->hand.slot, c->hand.gen, c->ino);
		for (int k = 0; w >= 0 && (size_t)w < size - len && k < c->nfds; k++) {
			len += (size_t)w;
			w = snprintf(buf + len, size - len, "%c%d", k ? '+' : '.', c->fds[k]);
		}
		if (w >= 0 && (size_t)w < size - len && (c->hand.dtx || c->hand.drx)) {
			len += (size_t)w;
			w = snprintf(buf + len, size - len, "~%" PRIu64 ".%" PRIu64, c->hand.dtx,
				     c->hand.drx);
		}
	}
	return w >= 0 && (size_t)w < size - len;
}

/* The client connections' variable, or false when it does not fit. */
static bool format_clients(char *buf, size_t size, const struct client *list, int n)
{
	size_t len = 0;
	int w = snprintf(buf, size, CLIENTS_VAR "=%d:", (int)getpid());
	for (int i = 0; w >= 0 && (size_t)w < size - len && i < n; i++) {
		len += (size_t)w;
		w = snprintf(buf + len, size - len, "%s%" PRIu64 ".%d.%" PRIu64 ".%" PRIu64,
			     i ? "," : "", list[i].ino, list[i].fd, list[i].dtx, list[i].drx);
	}
	return w >= 0 && (size_t)w < size - len;
}

static bool our_var(const char *e)
{
	return strncmp(e, HANDED_VAR "=", sizeof(HANDED_VAR)) == 0 ||
	       strncmp(e, CLIENTS_VAR "=", sizeof(CLIENTS_VAR)) == 0;
}

/* The caller's environment without our old variables, plus ours. */
static char **env_with(char *const envp[], char *var, char *client_var)
{
	size_t n = 0;
	while (envp && envp[n])
		n++;
	char **env = malloc((n + 3) * sizeof(*env));
	if (!env)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (!our_var(envp[i]))
			env[k++] = envp[i];
	}
	if (var)
		env[k++] = var;
	if (client_var)
		env[k++] = client_var;
	env[k] = NULL;
	return env;
}

/* The variable that hands the listed connections on, with the table. */
static bool hand_on(struct sv_exec_env *ex, const struct handed *list, int n)
{
	int table_fd = table_fd_for_exec(list[0].hand.h);
	if (table_fd < 0)
		return false;
	/* A copy without FD_CLOEXEC, among libsovia's own fds (the
	 * application's numbers stay free). */
	ex->table_fd = SV_REAL(fcntl)(table_fd, F_DUPFD, sv_ownfd_base());
	char buf[1024];
	if (ex->table_fd < 0 || !format_var(buf, sizeof(buf), ex->table_fd, list, n) ||
	    !(ex->var = strdup(buf))) {
		if (ex->table_fd >= 0)
			SV_REAL(close)(ex->table_fd);
		ex->table_fd = -1;
		return false;
	}
	return true;
}

/* The application's fds that survive the exec (no FD_CLOEXEC), per
 * client connection: the new image may continue one held on one fd only
 * (another would be the kernel's there). A copy with FD_CLOEXEC (a shell's
 * saved descriptor, libsovia's private one) goes with the exec. */
struct survivors {
	const void *priv;
	int n;
};
#define MAX_SURVIVORS (4 * MAX_CONNS)

static int count_survivors(struct survivors *sv)
{
	int n = 0, size = sv_fdtable_size();
	for (int fd = 0; fd < size; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		int fl = f && f->ops->exec_client ? SV_REAL(fcntl)(fd, F_GETFD, 0) : -1;
		int i = 0;
		while (fl >= 0 && !(fl & FD_CLOEXEC) && i < n && sv[i].priv != f->priv)
			i++;
		if (fl >= 0 && !(fl & FD_CLOEXEC) && (i < n || n < MAX_SURVIVORS)) {
			if (i == n)
				sv[n++] = (struct survivors){.priv = f->priv};
			sv[i].n++;
		}
		sv_fd_put(f);
	}
	return n;
}

static bool sole_survivor(const struct survivors *sv, int n, const void *priv)
{
	for (int i = 0; i < n; i++) {
		if (sv[i].priv == priv)
			return sv[i].n == 1;
	}
	return false; /* not counted: the table was full */
}

void sv_exec_prepare(const char *call, char *const envp[], struct sv_exec_env *ex)
{
	*ex = (struct sv_exec_env){.table_fd = -1};
	/* Connections kept on RDMA across a fork end with this image, its
	 * close-on-exec ones too: a fork's child that holds a copy gets them
	 * on plain TCP first. */
	sv_enter();
	sv_share_exec_all();
	sv_leave();
	struct handed list[MAX_CONNS];
	struct client clients[MAX_CONNS];
	struct survivors sv[MAX_SURVIVORS];
	int nsv = count_survivors(sv);
	int n = 0, nc = 0;
	int ours = -1; /* unknown yet */
	int size = sv_fdtable_size();
	for (int fd = 0; fd < size; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool served = f->ops->detach != NULL;
		int fl = served ? SV_REAL(fcntl)(fd, F_GETFD, 0) : 0;
		bool kept = served && fl >= 0 && !(fl & FD_CLOEXEC);
		if (kept && ours < 0 && (f->ops->exec_hand || f->ops->exec_client))
			ours = preloads_us(envp);
		struct sv_hand hand;
		bool listed = kept && ours > 0 && f->ops->exec_hand && f->ops->exec_hand(f, &hand) &&
			      list_fd(list, &n, &hand, fd);
		struct client *c = &clients[nc];
		struct stat st;
		if (!listed && kept && ours > 0 && f->ops->exec_client && nc < MAX_CONNS &&
		    sole_survivor(sv, nsv, f->priv) && fstat(fd, &st) == 0 &&
		    f->ops->exec_client(f, call, &c->dtx, &c->drx)) {
			c->ino = st.st_ino;
			c->fd = fd;
			nc++;
			listed = true; /* plain TCP here now */
		}
		sv_fd_put(f);
		if (served && !listed && (fl < 0 || !(fl & FD_CLOEXEC)))
			sv_fd_detach(fd, call);
	}
	char buf[1024];
	if (nc > 0 && (!format_clients(buf, sizeof(buf), clients, nc) ||
		       !(ex->client_var = strdup(buf))))
		sv_info("exec: no room to continue its client connections: they stay on TCP");
	bool handed = n > 0 && hand_on(ex, list, n);
	if (n > 0 && !handed) {
		/* Nothing to hand them with: back to plain TCP, as without. */
		for (int i = 0; i < n; i++) {
			for (int k = 0; k < list[i].nfds; k++)
				sv_fd_detach(list[i].fds[k], call);
		}
	}
	if ((handed || ex->client_var) && !(ex->envp = env_with(envp, ex->var, ex->client_var))) {
		sv_exec_env_done(ex);
		for (int i = 0; handed && i < n; i++) {
			for (int k = 0; k < list[i].nfds; k++)
				sv_fd_detach(list[i].fds[k], call);
		}
		return;
	}
	if (handed)
		sv_dbg("exec: %s", ex->var);
	if (ex->client_var)
		sv_dbg("exec: %s", ex->client_var);
}

void sv_exec_env_done(struct sv_exec_env *ex)
{
	int saved = errno;
	if (ex->table_fd >= 0)
		SV_REAL(close)(ex->table_fd);
	free(ex->envp);
	free(ex->var);
	free(ex->client_var);
	*ex = (struct sv_exec_env){.table_fd = -1};
	errno = saved;
}

/* ---- After the exec -------------------------------------------------------- */

/* A decimal number no larger than max; *p moves past it. */
static bool number(const char **p, uint64_t max, uint64_t *out)
{
	char *end;
	if (**p < '0' || **p > '9')
		return false;
	errno = 0;
	unsigned long long v = strtoull(*p, &end, 10);
	if (errno || v > max)
		return false;
	*out = v;
	*p = end;
	return true;
}

static bool expect(const char **p, char c)
{
	if (**p != c)
		return false;
	++*p;
	return true;
}

/* One <conn>: *p moves past it. */
static bool parse_conn(const char **p, struct handed *c)
{
	uint64_t slot, fd;
	*c = (struct handed){0};
	if (!number(p, INT32_MAX, &slot) || !expect(p, '.') ||
	    !number(p, UINT64_MAX, &c->hand.gen) || !expect(p, '.') ||
	    !number(p, UINT64_MAX, &c->ino) || !expect(p, '.'))
		return false;
	c->hand.slot = (int)slot;
	do {
		if (c->nfds == MAX_FDS || !number(p, INT32_MAX, &fd))
			return false;
		c->fds[c->nfds++] = (int)fd;
	} while (expect(p, '+'));
	if (expect(p, '~'))
		return number(p, UINT64_MAX, &c->hand.dtx) && expect(p, '.') &&
		       number(p, UINT64_MAX, &c->hand.drx);
	return true;
}

/* fd is the socket the image before handed on, a TCP one, and nobody's
 * entry yet. */
static bool same_socket(int fd, uint64_t ino)
{
	struct stat st;
	int domain, type;
	socklen_t dl = sizeof(domain), tl = sizeof(type);
	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) || st.st_ino != ino ||
	    SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) < 0 ||
	    SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
	    (domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM)
		return false;
	struct sv_fd *f = sv_fd_get(fd);
	bool free_fd = !f;
	sv_fd_put(f);
	return free_fd;
}

static const char *continue_conn(struct handed *c)
{
	struct sockaddr_storage local = {0}, peer = {0};
	socklen_t ll = sizeof(local), pl = sizeof(peer);
	for (int k = 0; k < c->nfds; k++) {
		if (!same_socket(c->fds[k], c->ino))
			return "not the socket handed on";
	}
	if (getsockname(c->fds[0], (struct sockaddr *)&local, &ll) < 0 ||
	    getpeername(c->fds[0], (struct sockaddr *)&peer, &pl) < 0 ||
	    !sv_holders_check(&c->hand, &local, &peer))
		return "not ours in the holders' table";
	uint64_t tx, rx;
	int r = sv_tcp_app_counts(c->fds[0], &tx, &rx);
	if (r < 0)
		return r == -ENOTCONN ? "past ESTABLISHED" : "no byte counts from the kernel";
	tx += c->hand.dtx;
	rx += c->hand.drx;
	for (int k = 0; k < c->nfds; k++) {
		if (c->fds[k] <= STDERR_FILENO && sv_stdio_take_std(c->fds[k]) < 0)
			return "stdio was used before libsovia's constructor";
	}
	if (!sv_stream_fd_adopt(c->fds, c->nfds, &c->hand, tx, rx))
		return "no memory";
	sv_info("fd %d: continued after the exec, at %" PRIu64 " bytes out, %" PRIu64 " in",
		c->fds[0], tx, rx);
	return NULL;
}

/* A client connection the image before took back to TCP: a stream again,
 * from the kernel's counts plus what its QP carried. */
static const char *continue_client(const struct client *c)
{
	if (!same_socket(c->fd, c->ino))
		return "not the socket handed on";
	uint64_t tx, rx;
	int r = sv_tcp_app_counts(c->fd, &tx, &rx);
	if (r < 0)
		return r == -ENOTCONN ? "past ESTABLISHED" : "no byte counts from the kernel";
	if (c->fd <= STDERR_FILENO && sv_stdio_take_std(c->fd) < 0)
		return "stdio was used before libsovia's constructor";
	struct sv_share_redo redo = {
		.tx = tx + c->dtx, .rx = rx + c->drx, .ktx = tx, .krx = rx};
	if (!sv_ops_continue_client(c->fd, &redo))
		return "no memory";
	sv_info("fd %d: continued after the exec, at %" PRIu64 " bytes out, %" PRIu64 " in",
		c->fd, redo.tx, redo.rx);
	return NULL;
}

static void inherit_clients(void)
{
	const char *v = secure_getenv(CLIENTS_VAR);
	if (!v)
		return;
	char copy[1024];
	snprintf(copy, sizeof(copy), "%s", v);
	unsetenv(CLIENTS_VAR); /* this process's alone */
	const char *p = copy;
	uint64_t pid;
	if (!number(&p, INT32_MAX, &pid) || !expect(&p, ':') || pid != (uint64_t)getpid() ||
	    sv_cfg.disable || getauxval(AT_SECURE))
		return; /* an ancestor's, through an image that ignored LD_PRELOAD */
	do {
		struct client c;
		uint64_t fd;
		if (!number(&p, UINT64_MAX, &c.ino) || !expect(&p, '.') ||
		    !number(&p, INT32_MAX, &fd) || !expect(&p, '.') ||
		    !number(&p, UINT64_MAX, &c.dtx) || !expect(&p, '.') ||
		    !number(&p, UINT64_MAX, &c.drx) || (*p && *p != ',')) {
			sv_warn("exec: malformed " CLIENTS_VAR ": the rest stays on TCP");
			return;
		}
		c.fd = (int)fd;
		const char *why = continue_client(&c);
		if (why)
			sv_info("fd %d: not continued after the exec (%s): it stays on TCP", c.fd,
				why);
	} while (expect(&p, ','));
}

void sv_exec_inherit(void)
{
	inherit_clients();
	const char *v = secure_getenv(HANDED_VAR);
	if (!v)
		return;
	char copy[1024];
	snprintf(copy, sizeof(copy), "%s", v);
	unsetenv(HANDED_VAR); /* this process's alone */
	const char *p = copy;
	uint64_t pid, table_fd;
	if (!number(&p, INT32_MAX, &pid) || !expect(&p, ':') ||
	    !number(&p, INT32_MAX, &table_fd) || !expect(&p, ':') ||
	    !sv_holders_is_table((int)table_fd))
		return;
	/* The copy the exec passed has no FD_CLOEXEC: none of our children
	 * may get the table but through a hand of ours. */
	SV_REAL(fcntl)((int)table_fd, F_SETFD, FD_CLOEXEC);
	if (pid != (uint64_t)getpid()) {
		/* An ancestor's, through an image between that ignored
		 * LD_PRELOAD: not for us, and neither is its table. */
		SV_REAL(close)((int)table_fd);
		return;
	}
	struct sv_holders *h = NULL;
	if (!getauxval(AT_SECURE) && !sv_cfg.disable)
		h = sv_holders_attach((int)table_fd);
	int own = h ? sv_ownfd_move((int)table_fd) : -1; /* kept for an exec of ours */
	if (own < 0) {
		if (!sv_cfg.disable)
			sv_info("exec: the holders' table handed on is not usable: the "
				"connections stay on TCP");
		SV_REAL(close)((int)table_fd);
		return;
	}
	inherited = h;
	inherited_fd = own;
	do {
		struct handed c;
		if (!parse_conn(&p, &c) || (*p && *p != ',')) {
			sv_warn("exec: malformed " HANDED_VAR ": the rest stays on TCP");
			return;
		}
		c.hand.h = h;
		const char *why = continue_conn(&c);
		if (why) {
			sv_info("fd %d: not continued after the exec (%s): it stays on TCP",
				c.fds[0], why);
			sv_holders_drop(&c.hand);
		}
	} while (expect(&p, ','));
}
