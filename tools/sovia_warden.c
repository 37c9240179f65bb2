/* sovia-warden: tells a client's libsovia where the server's libsovia
 * listens, on a host where rdma_cm's port space is open to every local
 * user (src/upgrade/warden.h, docs/design.md "The warden",
 * sovia-warden(8)).
 *
 * It listens on rdma_cm at a port below 1024 and on a Unix socket. A
 * server's libsovia registers there with its listening TCP socket and its
 * RDMA listener's port; a client's upgrade request, sent here first, is
 * answered with a redirect to that port, or "unknown". It never accepts a
 * connection and keeps nothing but the table.
 *
 * Any local user may register, so nothing a user controls may stall the
 * process that answers everyone: reading a registration (which may carry
 * files, any files), checking its socket and closing what came all happen
 * in a process of their own (a worker), which the warden kills when it
 * takes too long; a file whose close might wait (a lingering TCP socket, a
 * FUSE file, a Unix socket with such files queued) is never last closed
 * here. A registration vouches for its socket only while the socket
 * listens: every answer confirms it with the kernel's socket diagnostics
 * (warden_table.h). */
#include "cmdata.h"
#include "warden_table.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Registrations under way at once, in all and of one user: each is a
 * process of ours for the time it takes (at most WORKER_MS). */
#define WORKERS_MAX 64
#define WORKERS_PER_USER 4
#define WORKER_MS 3000
/* A registrant has this long to send its registration once accepted. */
#define IDLE_MS 1000
/* Connections refused at once wait here to be closed by a process of
 * their own; past this many, the warden stops taking connections until
 * they are. */
#define REFUSED_MAX 256
#define JANITOR_MS 2000
/* After accept() found no descriptor free (EMFILE, ENFILE), the Unix
 * socket is left alone this long rather than polled again at once. */
#define FULL_BACKOFF_MS 200
/* How often every entry is confirmed, to free the table of gone ones
 * nobody asks for. */
#define SWEEP_MS 30000

struct worker {
	pid_t pid;
	int sock;      /* ours of the pair; -1 once it answered */
	uid_t uid;
	uint64_t deadline;
};

/* What a worker tells the warden: r 0 and the listener, or why not. */
struct report {
	int32_t r;
	uint16_t rdma_port;
	struct sv_warden_listener l;
};

static struct worker workers[WORKERS_MAX];
static int nworkers;
static int refused[REFUSED_MAX];
static int nrefused;
static pid_t janitor;
static uint64_t janitor_deadline;
static struct sv_warden_table *table;
static int diag = -1;
static bool verbose;
static volatile sig_atomic_t stop;

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("sovia-warden: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *addr_text(const struct sockaddr_storage *ss, char *buf, size_t n)
{
	char a[INET6_ADDRSTRLEN] = "?";
	if (ss->ss_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, a, sizeof(a));
	else if (ss->ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, a, sizeof(a));
	snprintf(buf, n, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", a,
		 sv_addr_port((const struct sockaddr *)ss));
	return buf;
}

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* poll() for one fd, up to ms: > 0 ready. */
static int wait_fd(int fd, short events, int ms)
{
	struct pollfd p = {.fd = fd, .events = events};
	int n;
	do
		n = poll(&p, 1, ms);
	while (n < 0 && errno == EINTR);
	return n;
}

/* ---- A worker: one registration, in a process of its own ---------------------------- */

/* Read the registration on conn and check its socket. 0 and *rep, or
 * -errno. */
static int read_registration(int conn, struct report *rep)
{
	if (wait_fd(conn, POLLIN, IDLE_MS) <= 0)
		return -ETIMEDOUT;
	uint8_t msg[SV_WARDEN_MSG_LEN + 1];
	struct iovec iov = {msg, sizeof(msg)};
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf,
			    .msg_controllen = sizeof(cb.buf)};
	ssize_t n = recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	int fds[4], nfd = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t j = 0; j < k && nfd < 4; j++)
			memcpy(&fds[nfd++], CMSG_DATA(cm) + j * sizeof(int), sizeof(int));
	}
	/* The files that came are closed when this process ends. */
	if (sv_warden_msg_decode(msg, (size_t)n, &rep->rdma_port) < 0 || nfd != 1 ||
	    (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
		return -EPROTO;
	int d = sv_warden_diag_open();
	if (d < 0)
		return d;
	return sv_warden_check_listener(d, fds[0], &rep->l);
}

static _Noreturn void work(int conn, int sock)
{
	/* The warden closes its copy of conn first, then says go: conn is
	 * last closed here, where waiting costs nobody else. */
	char go;
	if (wait_fd(sock, POLLIN, WORKER_MS) <= 0 || read(sock, &go, 1) != 1)
		_exit(1);
	struct report rep = {0};
	rep.r = read_registration(conn, &rep);
	char verdict = 'n';
	if (write(sock, &rep, sizeof(rep)) == (ssize_t)sizeof(rep) && rep.r == 0 &&
	    wait_fd(sock, POLLIN, WORKER_MS) > 0 && read(sock, &verdict, 1) != 1)
		verdict = 'n';
	send(conn, &verdict, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	_exit(0);
}

/* ---- The warden's side of its workers ---------------------------------------------------- */

static void refuse_later(int fd)
{
	/* Over the limits: closed by a janitor (a close here might wait). */
	if (nrefused < REFUSED_MAX)
		refused[nrefused++] = fd;
}

static void start_worker(int conn, uid_t uid)
{
	int pair[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
		refuse_later(conn);
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		close(pair[0]);
		work(conn, pair[1]);
	}
	close(pair[1]);
	if (pid < 0) {
		close(pair[0]);
		refuse_later(conn);
		return;
	}
	/* Not the last reference: the worker holds conn. */
	close(conn);
	fcntl(pair[0], F_SETFL, O_NONBLOCK);
	if (write(pair[0], "g", 1) != 1) {
		kill(pid, SIGKILL);
		close(pair[0]);
		pair[0] = -1;
	}
	workers[nworkers++] = (struct worker){pid, pair[0], uid, now_ms() + WORKER_MS};
}

/* A worker's report: the registration enters the table (or not), and
 * the worker tells the registrant. */
static void take_report(struct worker *w)
{
	struct report rep;
	ssize_t n = read(w->sock, &rep, sizeof(rep));
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	int r = n == (ssize_t)sizeof(rep) ? rep.r : -EIO;
	if (r == 0)
		r = sv_warden_table_add(table, w->uid, &rep.l, rep.rdma_port);
	char a[80];
	if (verbose && r == 0)
		say("uid %u: the listener at %s is at RDMA port %u", (unsigned)w->uid,
		    addr_text(&rep.l.addr, a, sizeof(a)), rep.rdma_port);
	else if (verbose && n > 0)
		say("uid %u: registration refused: %s", (unsigned)w->uid, strerror(-r));
	if (n > 0 && r == 0 && write(w->sock, "y", 1) < 0)
		(void)0; /* a worker gone meanwhile: its registrant hears nothing */
	close(w->sock);
	w->sock = -1;
}

static int user_workers(uid_t uid)
{
	int n = 0;
	for (int i = 0; i < nworkers; i++)
		n += workers[i].uid == uid;
	return n;
}

static bool full_backoff;
static uint64_t backoff_until;

static void accept_conns(int lfd)
{
	for (int k = 0; k < 64 && nrefused < REFUSED_MAX; k++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				full_backoff = true;
				backoff_until = now_ms() + FULL_BACKOFF_MS;
			}
			return;
		}
		struct ucred uc;
		socklen_t len = sizeof(uc);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
			refuse_later(fd);
			continue;
		}
		if (nworkers == WORKERS_MAX || user_workers(uc.uid) >= WORKERS_PER_USER) {
			if (verbose)
				say("uid %u: a registration refused: %d under way", (unsigned)uc.uid,
				    nworkers == WORKERS_MAX ? nworkers : user_workers(uc.uid));
			refuse_later(fd);
			continue;
		}
		start_worker(fd, uc.uid);
	}
}

/* The refused connections go to a janitor, a process that closes them
 * (its closes may wait) and ends; one at a time. */
static void start_janitor(void)
{
	if (!nrefused || janitor > 0)
		return;
	int go[2];
	if (pipe2(go, O_CLOEXEC) < 0)
		return;
	pid_t pid = fork();
	if (pid == 0) {
		close(go[1]);
		char c;
		while (read(go[0], &c, 1) < 0 && errno == EINTR)
			;
		for (int i = 0; i < nrefused; i++)
			close(refused[i]);
		_exit(0);
	}
	close(go[0]);
	if (pid < 0) {
		close(go[1]);
		return;
	}
	/* Ours first (not the last references), then the janitor's. */
	for (int i = 0; i < nrefused; i++)
		close(refused[i]);
	nrefused = 0;
	close(go[1]);
	janitor = pid;
	janitor_deadline = now_ms() + JANITOR_MS;
}

/* Workers and the janitor that ended are reaped; those past their time
 * are killed (a kill ends a close that waits, too). */
static void reap(uint64_t now)
{
	pid_t pid;
	int status;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		if (pid == janitor)
			janitor = 0;
		for (int i = 0; i < nworkers; i++) {
			if (workers[i].pid != pid)
				continue;
			if (workers[i].sock >= 0)
				close(workers[i].sock);
			workers[i] = workers[--nworkers];
			break;
		}
	}
	for (int i = 0; i < nworkers; i++)
		if (now >= workers[i].deadline)
			kill(workers[i].pid, SIGKILL);
	if (janitor > 0 && now >= janitor_deadline)
		kill(janitor, SIGKILL);
}

/* ---- Requests ------------------------------------------------------------ */

static int alive(void *arg, const struct sockaddr_storage *addr, uint64_t cookie)
{
	(void)arg;
	return sv_warden_alive(diag, addr, cookie);
}

static void answer(struct rdma_cm_event *ev)
{
	struct sv_cm_req req;
	uint8_t pd[SV_CM_REJ_LEN];
	int r = sv_cm_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
				 &req);
	uint16_t port = r == 0 ? sv_warden_table_lookup(table, &req.server, alive, NULL) : 0;
	if (port)
		sv_cm_rej_encode_redirect(port, pd);
	else
		sv_cm_rej_encode(r == 0 ? SV_CM_REJ_UNKNOWN : SV_CM_REJ_NO, pd);
	/* Not ours at all: no word of ours either. */
	rdma_reject(ev->id, r == -EPROTO ? NULL : pd, r == -EPROTO ? 0 : sizeof(pd));
	char a[80];
	if (verbose && r < 0)
		say("a request %s: refused", r == -EPROTO ? "not of libsovia's" : "of another version");
	else if (verbose)
		say("a request for %s: %s %u", addr_text(&req.server, a, sizeof(a)),
		    port ? "to RDMA port" : "unknown, at port",
		    port ? port : sv_addr_port((const struct sockaddr *)&req.server));
}

static void cm_events(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(ch, &ev) == 0) {
		struct rdma_cm_id *gone = NULL;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			answer(ev);
			gone = ev->id;
		}
		rdma_ack_cm_event(ev);
		if (gone)
			rdma_destroy_id(gone);
	}
}

/* ---- Start ----------------------------------------------------------------- */

static int unix_listener(const char *path)
{
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(un.sun_path)) {
		say("%s: path too long", path);
		return -1;
	}
	strcpy(un.sun_path, path);
	/* Its directory (/run/sovia): made by us, else it must be root's and
	 * writable by root alone, or another user could take the name. */
	char dir[sizeof(un.sun_path)];
	strcpy(dir, path);
	char *slash = strrchr(dir, '/');
	struct stat st;
	if (slash && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			say("%s: %s", dir, strerror(errno));
			return -1;
		}
		if (stat(dir, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022)) {
			say("%s: not root's alone (owner %u, mode %o): another user could take the "
			    "socket's name", dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
			return -1;
		}
	}
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path); /* a former warden's */
	mode_t old = umask(0);
	/* Any local user may register: what it registers is proven by the
	 * socket it passes. */
	int r = bind(fd, (struct sockaddr *)&un, sizeof(un));
	umask(old);
	if (r < 0 || listen(fd, 128) < 0) {
		say("%s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	chmod(path, 0666);
	return fd;
}

static struct rdma_cm_id *cm_listener(struct rdma_event_channel *ch, uint16_t port)
{
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) < 0) {
		say("rdma_create_id: %s (no RDMA device?)", strerror(errno));
		return NULL;
	}
	struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = htons(port),
				    .sin6_addr = IN6ADDR_ANY_INIT};
	struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (rdma_bind_addr(id, (struct sockaddr *)&any6) < 0 &&
	    rdma_bind_addr(id, (struct sockaddr *)&any4) < 0) {
		say("rdma_cm port %u: %s%s", port, strerror(errno),
		    errno == EACCES ? " (a port below 1024 needs CAP_NET_BIND_SERVICE)" : "");
		rdma_destroy_id(id);
		return NULL;
	}
	if (rdma_listen(id, 1024) < 0) {
		say("rdma_listen: %s", strerror(errno));
		rdma_destroy_id(id);
		return NULL;
	}
	return id;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: sovia-warden [-p PORT] [-s SOCKET] [-v]\n"
		   "  -p PORT    rdma_cm port to answer clients at, below 1024 (default %u)\n"
		   "  -s SOCKET  Unix socket servers register at (default %s)\n"
		   "  -v         say each registration and answer on stderr\n"
		   "  -V, --version  libsovia's version\n",
		SV_WARDEN_PORT, SV_WARDEN_SOCKET);
}

static int parse(int argc, char **argv, unsigned long *port, const char **path)
{
	static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
					      {"version", no_argument, NULL, 'V'},
					      {NULL, 0, NULL, 0}};
	int opt;
	while ((opt = getopt_long(argc, argv, "p:s:vhV", longs, NULL)) != -1) {
		char *end;
		switch (opt) {
		case 'p':
			errno = 0;
			*port = strtoul(optarg, &end, 10);
			if (errno || *end || *port == 0 || *port > 1023) {
				say("-p %s: a port from 1 to 1023: only a privileged process can "
				    "listen there, which is what makes the answers the host's",
				    optarg);
				return 2;
			}
			break;
		case 's':
			*path = optarg;
			break;
		case 'v':
			verbose = true;
			break;
		case 'V':
			printf("sovia-warden (libsovia) %s\n", SOVIA_VERSION_STRING);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/* One round: wait for rdma_cm, registrations and workers, then serve
 * what came. */
static void round_once(struct rdma_event_channel *ch, int lfd, uint64_t *sweep_at)
{
	struct pollfd p[WORKERS_MAX + 2];
	int idx[WORKERS_MAX];
	uint64_t now = now_ms();
	if (full_backoff && now >= backoff_until)
		full_backoff = false;
	p[0] = (struct pollfd){.fd = ch->fd, .events = POLLIN};
	/* Not while no fd is free, nor while refused ones wait for a
	 * janitor: accept() would find the same again at once. */
	bool taking = !full_backoff && nrefused < REFUSED_MAX;
	p[1] = (struct pollfd){.fd = taking ? lfd : -1, .events = POLLIN};
	nfds_t n = 2;
	for (int i = 0; i < nworkers; i++) {
		if (workers[i].sock < 0)
			continue;
		idx[n - 2] = i;
		p[n++] = (struct pollfd){.fd = workers[i].sock, .events = POLLIN};
	}
	uint64_t next = *sweep_at;
	for (int i = 0; i < nworkers; i++)
		if (workers[i].deadline < next)
			next = workers[i].deadline;
	if (janitor > 0 && janitor_deadline < next)
		next = janitor_deadline;
	if (full_backoff && backoff_until < next)
		next = backoff_until;
	/* Children end without a fd of ours: look for them now and then. */
	if (nworkers || janitor > 0)
		next = next < now + 50 ? next : now + 50;
	int timeout = next > now ? (int)(next - now) : 0;
	if (poll(p, n, timeout) < 0)
		return; /* EINTR: a signal, stop looked at */
	if (p[0].revents)
		cm_events(ch);
	for (nfds_t j = 2; j < n; j++)
		if (p[j].revents)
			take_report(&workers[idx[j - 2]]);
	if (p[1].revents)
		accept_conns(lfd);
	start_janitor();
	now = now_ms();
	reap(now);
	if (now >= *sweep_at) {
		size_t gone = sv_warden_table_sweep(table, alive, NULL);
		if (verbose && gone)
			say("%zu registrations whose listeners are gone forgotten", gone);
		*sweep_at = now + SWEEP_MS;
	}
}

int main(int argc, char **argv)
{
	unsigned long port = SV_WARDEN_PORT;
	const char *path = SV_WARDEN_SOCKET;
	int r = parse(argc, argv, &port, &path);
	if (r >= 0)
		return r;
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	table = sv_warden_table_new();
	diag = sv_warden_diag_open();
	if (!table || diag < 0) {
		say("no socket diagnostics (NETLINK_SOCK_DIAG): %s", strerror(diag < 0 ? -diag : ENOMEM));
		return 1;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		say("no rdma_cm: %s", strerror(errno));
		return 1;
	}
	struct rdma_cm_id *id = cm_listener(ch, (uint16_t)port);
	if (!id)
		return 1;
	int lfd = unix_listener(path);
	if (lfd < 0)
		return 1;
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	say("answering at rdma_cm port %lu; registrations at %s", port, path);
	uint64_t sweep_at = now_ms() + SWEEP_MS;
	while (!stop)
		round_once(ch, lfd, &sweep_at);
	unlink(path);
	for (int i = 0; i < nworkers; i++)
		kill(workers[i].pid, SIGKILL);
	if (janitor > 0)
		kill(janitor, SIGKILL);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	sv_warden_table_free(table);
	return 0;
}
