/* sovia-warden: tells a client's libsovia where the server's libsovia
 * listens, on a host where rdma_cm's port space is open to every local
 * user (src/upgrade/warden.h, docs/design.md "The warden", sovia-warden(8)).
 *
 * It listens on rdma_cm at a port below 1024 and on a Unix socket. A
 * server's libsovia registers there with its listening TCP socket and its
 * RDMA listener's port; a client's upgrade request, sent here first, is
 * answered with a redirect to that port, or "unknown". It never accepts a
 * connection and keeps nothing but the table. */
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
#include <unistd.h>

/* Registrations at once, in all and from one user: each is a Unix
 * connection, and any local user may make them. */
#define CONNS_MAX 16384
#define CONNS_PER_USER 1024

struct conn {
	int fd;
	uid_t uid;
	bool registered;
};

static struct conn conns[CONNS_MAX];
static int nconns;
static struct sv_warden_table *table;
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

/* ---- Registrations ------------------------------------------------------ */

static void drop_conn(int i)
{
	if (conns[i].registered)
		sv_warden_table_drop(table, conns[i].fd);
	close(conns[i].fd);
	conns[i] = conns[--nconns];
}

static void accept_conns(int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct ucred uc;
		socklen_t len = sizeof(uc);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
			close(fd);
			continue;
		}
		int mine = 0;
		for (int i = 0; i < nconns; i++)
			mine += conns[i].uid == uc.uid;
		if (nconns == CONNS_MAX || mine >= CONNS_PER_USER) {
			if (verbose)
				say("refused a registration of uid %u: %d at once", (unsigned)uc.uid,
				    nconns == CONNS_MAX ? nconns : mine);
			send(fd, "n", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
			close(fd);
			continue;
		}
		conns[nconns++] = (struct conn){fd, uc.uid, false};
	}
}

/* Take a registration on conns[i]. False: the connection is to go. */
static bool take(int i)
{
	struct conn *c = &conns[i];
	uint8_t msg[SV_WARDEN_MSG_LEN + 1];
	struct iovec iov = {msg, sizeof(msg)};
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf,
			    .msg_controllen = sizeof(cb.buf)};
	ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	/* Every fd that came is closed, whatever the message. */
	int fds[4], nfd = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t j = 0; j < k && nfd < 4; j++)
			memcpy(&fds[nfd++], CMSG_DATA(cm) + j * sizeof(int), sizeof(int));
	}
	uint16_t port = 0;
	int r = 0;
	struct sockaddr_storage addr;
	bool v6only = false;
	if (n == 0 && nfd == 0)
		r = -ECONNRESET; /* the registrant let go */
	else if (c->registered)
		r = -EEXIST;
	else if (sv_warden_msg_decode(msg, (size_t)n, &port) < 0 || nfd != 1 ||
		 (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
		r = -EPROTO;
	else
		r = sv_warden_check_listener(fds[0], &addr, &v6only);
	for (int j = 0; j < nfd; j++)
		close(fds[j]);
	if (r == 0)
		r = sv_warden_table_add(table, c->fd, &addr, v6only, port);
	char a[80];
	if (r == 0) {
		c->registered = true;
		if (verbose)
			say("uid %u: the listener at %s is at RDMA port %u", (unsigned)c->uid,
			    addr_text(&addr, a, sizeof(a)), port);
		send(c->fd, "y", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		return true;
	}
	if (r != -ECONNRESET) {
		if (verbose)
			say("uid %u: registration refused: %s", (unsigned)c->uid, strerror(-r));
		send(c->fd, "n", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	return false;
}

/* ---- Requests ------------------------------------------------------------ */

static void answer(struct rdma_cm_event *ev)
{
	struct sv_cm_req req;
	uint8_t pd[SV_CM_REJ_LEN];
	int r = sv_cm_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
				 &req);
	uint16_t port = r == 0 ? sv_warden_table_lookup(table, &req.server) : 0;
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
		    port ? "to RDMA port" : "unknown, at port", port ? port : sv_addr_port(
			    (const struct sockaddr *)&req.server));
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

int main(int argc, char **argv)
{
	unsigned long port = SV_WARDEN_PORT;
	const char *path = SV_WARDEN_SOCKET;
	static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
					      {"version", no_argument, NULL, 'V'},
					      {NULL, 0, NULL, 0}};
	int opt;
	while ((opt = getopt_long(argc, argv, "p:s:vhV", longs, NULL)) != -1) {
		char *end;
		switch (opt) {
		case 'p':
			errno = 0;
			port = strtoul(optarg, &end, 10);
			if (errno || *end || port == 0 || port > 1023) {
				say("-p %s: a port from 1 to 1023: only a privileged process can "
				    "listen there, which is what makes the answers the host's",
				    optarg);
				return 2;
			}
			break;
		case 's':
			path = optarg;
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
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < CONNS_MAX + 64 &&
	    rl.rlim_max > rl.rlim_cur) {
		rl.rlim_cur = rl.rlim_max < CONNS_MAX + 64 ? rl.rlim_max : CONNS_MAX + 64;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	table = sv_warden_table_new();
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!table || !ch) {
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

	static struct pollfd p[CONNS_MAX + 2];
	while (!stop) {
		p[0] = (struct pollfd){.fd = ch->fd, .events = POLLIN};
		p[1] = (struct pollfd){.fd = lfd, .events = POLLIN};
		for (int i = 0; i < nconns; i++)
			p[i + 2] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
		int n = poll(p, (nfds_t)nconns + 2, -1);
		if (n < 0)
			continue; /* EINTR: a signal, stop looked at */
		if (p[0].revents)
			cm_events(ch);
		/* From the last, so that a dropped one's place takes one
		 * already looked at. */
		for (int i = nconns - 1; i >= 0; i--)
			if (p[i + 2].revents && !take(i))
				drop_conn(i);
		if (p[1].revents)
			accept_conns(lfd);
	}
	unlink(path);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	sv_warden_table_free(table);
	return 0;
}
