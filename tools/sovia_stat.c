/* sovia-stat: the libsovia connections of the user's processes (every
 * user's for root), as ss(8) lists sockets.
 *
 * Each process that has libsovia connections answers on a unix socket,
 * SV_STAT_DIR.EUID/PID (src/helper/helper_stat.c), with a sealed memfd
 * holding one line per connection; it answers only its own user and root.
 * The processes are found in /proc/net/unix.
 *
 * Whatever a process answers (any process of any user, for root) is
 * received in a process of our own, which is killed when it takes too
 * long: a message may carry files of any kind, and the last close of one
 * (a lingering TCP socket, a FUSE file) may wait as long as its owner
 * likes. Only a sealed memfd is read, and its seals are asked before
 * anything else of it. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef SOVIA_VERSION_STRING
#define SOVIA_VERSION_STRING "?"
#endif

#include "helper.h" /* SV_STAT_DIR */

#include <sys/wait.h>

#define NAME_PREFIX SV_STAT_DIR "."

/* One connection, as a process's view line gives it. */
struct conn {
	int pid;
	char comm[32];
	int fd;
	char role[8], local[64], peer[64], tx[8], rx[8], state[16], fallback[40];
	char call[40]; /* fallback unsupported-call: the call, else "" */
	unsigned long long rdma_tx, rdma_rx, tcp_tx, tcp_rx, stalls, ttr_us;
};

struct list {
	struct conn *v;
	size_t n, cap;
};

static bool list_add(struct list *l, const struct conn *c)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct conn *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return false;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *c;
	return true;
}

/* ---- Asking a process ---------------------------------------------------- */

static void word(const char *line, const char *key, char *out, size_t len)
{
	size_t kl = strlen(key);
	out[0] = '\0';
	for (const char *p = line; (p = strstr(p, key)); p += kl) {
		if ((p == line || p[-1] == ' ') && p[kl] == '=') {
			const char *v = p + kl + 1;
			size_t n = strcspn(v, " \n");
			if (n >= len)
				n = len - 1;
			memcpy(out, v, n);
			out[n] = '\0';
			return;
		}
	}
}

static unsigned long long number(const char *line, const char *key)
{
	char buf[32];
	word(line, key, buf, sizeof(buf));
	return strtoull(buf, NULL, 10);
}

static void parse_line(const char *line, struct conn *c)
{
	char buf[32];
	word(line, "fd", buf, sizeof(buf));
	c->fd = buf[0] ? atoi(buf) : -1;
	word(line, "role", c->role, sizeof(c->role));
	word(line, "local", c->local, sizeof(c->local));
	word(line, "peer", c->peer, sizeof(c->peer));
	word(line, "tx", c->tx, sizeof(c->tx));
	word(line, "rx", c->rx, sizeof(c->rx));
	word(line, "state", c->state, sizeof(c->state));
	word(line, "fallback", c->fallback, sizeof(c->fallback));
	word(line, "call", c->call, sizeof(c->call));
	if (strcmp(c->call, "-") == 0)
		c->call[0] = '\0';
	c->rdma_tx = number(line, "rdma_tx_bytes");
	c->rdma_rx = number(line, "rdma_rx_bytes");
	c->tcp_tx = number(line, "tcp_tx_bytes");
	c->tcp_rx = number(line, "tcp_rx_bytes");
	c->stalls = number(line, "credit_stalls");
	c->ttr_us = number(line, "time_to_rdma_us");
}

static void read_comm(int pid, char *out, size_t len)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	FILE *f = fopen(path, "r");
	out[0] = '\0';
	if (f) {
		if (fgets(out, (int)len, f))
			out[strcspn(out, "\n")] = '\0';
		fclose(f);
	}
}

/* The user ids of process pid (real, effective, saved), from /proc: 0, or
 * -errno. */
static int proc_uids(int pid, uid_t uids[3])
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	int found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned r, e, s;
		if (sscanf(line, "Uid: %u %u %u", &r, &e, &s) == 3) {
			uids[0] = r, uids[1] = e, uids[2] = s;
			found = 1;
		}
	}
	fclose(f);
	return found ? 0 : -ESRCH;
}

static bool has_uid(const uid_t uids[3], uid_t u)
{
	return uids[0] == u || uids[1] == u || uids[2] == u;
}

/* Connect to a view without ever blocking: a process that does not
 * accept (stopped, in a debugger) fills its backlog, and a blocking
 * connect would then wait for good. Returns the socket, or -errno. */
static int connect_view(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int err = errno == EAGAIN ? -ETIMEDOUT : -errno;
		close(s);
		return err;
	}
	return s;
}

/* One process asked: its socket while the answer is awaited, then the
 * view's text or why there is none (-errno: -EACCES refused, -ESRCH not
 * the process the name gives, -ETIMEDOUT no answer within the bound,
 * -ECONNRESET answered nothing, -EPROTO answered something else than a
 * view). */
struct ask {
	int pid;
	char path[108]; /* its view's socket */
	int sock;
	int err;
	char *text;
};

enum {
	ANSWER_MS = 2000,     /* for a batch at once: a silent process costs 2 s in all */
	RECEIVER_MS = 1000,   /* and the receiver's own time past that, to tell us */
	BATCH = 128,          /* processes asked at once: each costs an fd or two */
	VIEW_MAX = 16 << 20,  /* bytes: far above any process's connections */
	CONNS_MAX = 1 << 16,  /* a process's connections shown: bounds a fake view's */
};

/* The view's text, NUL-terminated, or NULL. Only a sealed memfd of a sane
 * size is read (what helper_stat.c sends): a pipe, a device or a file
 * someone keeps writing could hold the reader for ever. */
static char *read_view(int view)
{
	/* The seals first: a file of any other kind than a memfd says EINVAL
	 * without being looked at, where fstat or a read could wait. */
	int seals = fcntl(view, F_GET_SEALS);
	int want = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
	if (seals < 0 || (seals & want) != want)
		return NULL;
	struct stat st;
	if (fstat(view, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > VIEW_MAX)
		return NULL;
	size_t size = (size_t)st.st_size;
	char *text = malloc(size + 1);
	if (!text)
		return NULL;
	size_t got = 0;
	while (got < size) {
		ssize_t r = pread(view, text + got, size - got, (off_t)got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	text[got] = '\0';
	return text;
}

/* The fds a message carried: the one view, or -EPROTO (all closed) for
 * anything else. */
static int take_view(struct msghdr *m)
{
	int view = -1, extra = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (view < 0)
				view = fd;
			else
				extra++, close(fd);
		}
	}
	if (view >= 0 && (extra || (m->msg_flags & MSG_CTRUNC))) {
		close(view);
		return -EPROTO;
	}
	return view;
}

/* Is the answerer at a->sock the pid the name gives, running as root or
 * as one of that process's users (the listener's user is who the process
 * was at listen(), and the helper listens again when the process changes
 * its credentials)? 0, or -errno. Asked of the kernel, without reading. */
static int check_peer(const struct ask *a)
{
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	uid_t uids[3] = {0, 0, 0};
	if (getsockopt(a->sock, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.pid != a->pid ||
	    proc_uids(a->pid, uids) < 0)
		return -ESRCH;
	if (cr.uid != 0 && !has_uid(uids, cr.uid))
		return -EPERM;
	return 0;
}

/* The answer waiting on a->sock: the view's text into a->text, or a->err.
 * In the receiver (ask_all). */
static void receive(struct ask *a)
{
	char one = 0;
	struct iovec iov = {.iov_base = &one, .iov_len = 1};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			   .msg_controllen = sizeof(u.buf)};
	ssize_t r = recvmsg(a->sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	/* Even an empty message may carry fds: each is taken or closed. */
	int view = r >= 0 ? take_view(&m) : -1;
	if (r < 0)
		a->err = errno == EAGAIN ? -ETIMEDOUT : -errno;
	else if (view == -EPROTO)
		a->err = -EPROTO;
	else if (r == 0 && view < 0)
		a->err = -ECONNRESET;
	else if (r == 0)
		a->err = -EPROTO;
	else if (view < 0)
		a->err = one == 'n' ? -EACCES : -EPROTO;
	else if (!(a->text = read_view(view)))
		a->err = -EPROTO;
	if (view >= 0)
		close(view);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The receiver: every answer awaited together within ANSWER_MS, then
 * told to the parent on `out`: for each process asked, its index, its
 * error and its view's text. */
struct told {
	int32_t i, err;
	uint32_t len;
};

static _Noreturn void receive_all(struct ask *a, size_t n, int out)
{
	struct pollfd *pf = calloc(n ? n : 1, sizeof(*pf));
	size_t *of = calloc(n ? n : 1, sizeof(*of));
	if (!pf || !of)
		_exit(1);
	int64_t end = now_ms() + ANSWER_MS;
	for (;;) {
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (a[i].sock >= 0 && !a[i].err && !a[i].text) {
				pf[k] = (struct pollfd){.fd = a[i].sock, .events = POLLIN};
				of[k++] = i;
			}
		int64_t left = end - now_ms();
		if (!k || left <= 0)
			break;
		int r = poll(pf, k, (int)left);
		if (r < 0 && errno != EINTR)
			break;
		for (size_t j = 0; r > 0 && j < k; j++)
			if (pf[j].revents)
				receive(&a[of[j]]);
	}
	for (size_t i = 0; i < n; i++) {
		if (a[i].sock < 0 || (!a[i].text && !a[i].err))
			continue;
		struct told t = {(int32_t)i, a[i].err, a[i].text ? (uint32_t)strlen(a[i].text) : 0};
		if (write(out, &t, sizeof(t)) != (ssize_t)sizeof(t))
			_exit(1);
		for (uint32_t done = 0; done < t.len;) {
			ssize_t w = write(out, a[i].text + done, t.len - done);
			if (w <= 0)
				_exit(1);
			done += (uint32_t)w;
		}
	}
	_exit(0);
}

/* Read exactly len bytes from fd by `end`: false when it ended first. */
static bool read_full(int fd, void *buf, size_t len, int64_t end)
{
	for (size_t got = 0; got < len;) {
		int64_t left = end - now_ms();
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return false;
		ssize_t r = read(fd, (char *)buf + got, len - got);
		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

/* What the receiver told: each answer's error or text into a[]. */
static void hear(struct ask *a, size_t n, int in, int64_t end)
{
	struct told t;
	while (read_full(in, &t, sizeof(t), end)) {
		if (t.i < 0 || (size_t)t.i >= n || t.len > VIEW_MAX)
			return;
		struct ask *x = &a[t.i];
		x->err = t.err;
		if (!t.len)
			continue;
		x->text = malloc((size_t)t.len + 1);
		if (!x->text || !read_full(in, x->text, t.len, end)) {
			free(x->text);
			x->text = NULL;
			x->err = -EPROTO;
			return;
		}
		x->text[t.len] = '\0';
	}
}

/* Every process of a[] asked at once, the answers awaited together within
 * ANSWER_MS. A non-root caller does not ask processes none of whose users
 * it is: they would refuse, and asking wakes their helpers. The answers
 * are read in a receiver of our own (the file's head says why). */
static void ask_all(struct ask *a, size_t n)
{
	bool *asked = calloc(n ? n : 1, sizeof(*asked));
	for (size_t i = 0; i < n; i++) {
		uid_t uids[3] = {0, 0, 0};
		a[i].sock = -1;
		a[i].err = proc_uids(a[i].pid, uids);
		if (!a[i].err && geteuid() != 0 && !has_uid(uids, getuid()) &&
		    !has_uid(uids, geteuid()))
			a[i].err = -EACCES;
		if (!a[i].err) {
			a[i].sock = connect_view(a[i].path);
			a[i].err = a[i].sock < 0 ? a[i].sock : check_peer(&a[i]);
		}
	}
	int res[2] = {-1, -1}, go[2] = {-1, -1};
	pid_t pid = -1;
	if (asked && pipe2(res, O_CLOEXEC) == 0 && pipe2(go, O_CLOEXEC) == 0)
		pid = fork();
	if (pid == 0) {
		close(res[0]);
		close(go[1]);
		/* The parent lets go of the sockets first: their last close is
		 * ours, and a wait in it costs nobody else. */
		char c;
		while (read(go[0], &c, 1) < 0 && errno == EINTR)
			;
		receive_all(a, n, res[1]);
	}
	for (size_t i = 0; i < n; i++) {
		if (asked)
			asked[i] = a[i].sock >= 0 && !a[i].err;
		if (a[i].sock >= 0)
			close(a[i].sock);
		a[i].sock = -1;
		if (asked && asked[i] && pid < 0)
			a[i].err = -ENOMEM;
	}
	if (pid > 0) {
		close(go[0]);
		close(go[1]);
		close(res[1]);
		hear(a, n, res[0], now_ms() + ANSWER_MS + RECEIVER_MS);
		close(res[0]);
		/* Done or not, it goes: one stuck in a close is ended. */
		kill(pid, SIGKILL);
		for (int k = 0; k < 100 && waitpid(pid, NULL, WNOHANG) == 0; k++)
			usleep(1000);
	} else {
		for (int k = 0; k < 2; k++) {
			if (res[k] >= 0)
				close(res[k]);
			if (go[k] >= 0)
				close(go[k]);
		}
	}
	for (size_t i = 0; asked && i < n; i++)
		if (asked[i] && !a[i].text && !a[i].err)
			a[i].err = -ETIMEDOUT;
	free(asked);
}

/* The connections of a process's view into l, at most CONNS_MAX. */
static void collect(const struct ask *a, struct list *l)
{
	char comm[32];
	read_comm(a->pid, comm, sizeof(comm));
	size_t taken = 0;
	for (char *line = a->text, *next; *line && taken < CONNS_MAX; line = next) {
		next = line + strcspn(line, "\n");
		if (*next)
			*next++ = '\0';
		if (strncmp(line, "fd=", 3) != 0)
			continue; /* the header, or a line of a kind this version does not know */
		struct conn c = {.pid = a->pid};
		snprintf(c.comm, sizeof(c.comm), "%s", comm);
		parse_line(line, &c);
		if (!list_add(l, &c))
			break;
		taken++;
	}
}

/* The views' sockets, from /proc/net/unix (-errno if it cannot be read):
 * every process's, or only's. */
static int find_views(int only, struct ask **out)
{
	FILE *f = fopen("/proc/net/unix", "r");
	if (!f)
		return -errno;
	struct ask *v = NULL;
	int n = 0, cap = 0;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, NAME_PREFIX);
		if (!p)
			continue;
		p[strcspn(p, "\n")] = '\0';
		char *slash = strrchr(p, '/');
		char *end;
		long pid = slash ? strtol(slash + 1, &end, 10) : 0;
		if (pid <= 0 || *end || (only && pid != only) || strlen(p) >= sizeof(v->path))
			continue;
		bool seen = false;
		for (int i = 0; i < n && !seen; i++)
			seen = !strcmp(v[i].path, p); /* the listener and its accepted sockets */
		if (seen)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 32;
			struct ask *nv = realloc(v, (size_t)cap * sizeof(*nv));
			if (!nv)
				break;
			v = nv;
		}
		v[n] = (struct ask){.pid = (int)pid, .sock = -1};
		strcpy(v[n].path, p);
		n++;
	}
	fclose(f);
	*out = v;
	return n;
}

/* ---- Printing -------------------------------------------------------------- */

/* Every byte of a process's answer and name is printed as printable
 * ASCII: another user's process must not reach root's terminal with
 * escape sequences, and a name cut inside a UTF-8 character must not make
 * the JSON invalid. */
static void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* s with each byte that is not printable ASCII as '?', in place. */
static void printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			*s = '?';
}

static void print_json(const struct list *l)
{
	printf("{\"connections\":[");
	for (size_t i = 0; i < l->n; i++) {
		const struct conn *c = &l->v[i];
		printf("%s{\"pid\":%d,\"comm\":", i ? "," : "", c->pid);
		json_string(c->comm);
		if (c->fd >= 0)
			printf(",\"fd\":%d", c->fd);
		else
			printf(",\"fd\":null");
		const struct {
			const char *key, *value;
		} text[] = {{"role", c->role}, {"local", c->local}, {"peer", c->peer},
			    {"tx", c->tx},     {"rx", c->rx},       {"state", c->state},
			    {"fallback", c->fallback}, {"call", c->call}};
		for (size_t k = 0; k < sizeof(text) / sizeof(text[0]); k++) {
			printf(",\"%s\":", text[k].key);
			json_string(text[k].value);
		}
		printf(",\"rdma_tx_bytes\":%llu,\"rdma_rx_bytes\":%llu,\"tcp_tx_bytes\":%llu,"
		       "\"tcp_rx_bytes\":%llu,\"credit_stalls\":%llu,\"time_to_rdma_us\":%llu}",
		       c->rdma_tx, c->rdma_rx, c->tcp_tx, c->tcp_rx, c->stalls, c->ttr_us);
	}
	printf("]}\n");
}

static void print_table(struct list *l)
{
	printf("%-7s %-15s %4s %-6s %-21s %-21s %-4s %-4s %-9s %-22s %12s %12s %12s %12s %7s %8s\n",
	       "PID", "COMMAND", "FD", "ROLE", "LOCAL", "PEER", "TX", "RX", "STATE", "FALLBACK",
	       "RDMA-TX", "RDMA-RX", "TCP-TX", "TCP-RX", "STALLS", "TTR(ms)");
	for (size_t i = 0; i < l->n; i++) {
		struct conn *c = &l->v[i];
		char ttr[24] = "-", fd[16] = "-";
		if (c->ttr_us)
			snprintf(ttr, sizeof(ttr), "%.1f", (double)c->ttr_us / 1000.0);
		if (c->fd >= 0)
			snprintf(fd, sizeof(fd), "%d", c->fd);
		char *text[] = {c->comm, c->role,  c->local,    c->peer, c->tx,
				c->rx,   c->state, c->fallback, c->call};
		for (size_t k = 0; k < sizeof(text) / sizeof(text[0]); k++)
			printable(text[k]);
		/* The call that kept it on TCP, beside the reason. */
		char why[sizeof(c->fallback) + sizeof(c->call) + 2];
		snprintf(why, sizeof(why), c->call[0] ? "%s:%s" : "%s", c->fallback, c->call);
		printf("%-7d %-15s %4s %-6s %-21s %-21s %-4s %-4s %-9s %-22s %12llu %12llu %12llu "
		       "%12llu %7llu %8s\n",
		       c->pid, c->comm, fd, c->role, c->local, c->peer, c->tx, c->rx, c->state,
		       why, c->rdma_tx, c->rdma_rx, c->tcp_tx, c->tcp_rx, c->stalls, ttr);
	}
}

/* ---- Main --------------------------------------------------------------------- */

static void usage(FILE *to)
{
	fprintf(to, "Usage: sovia-stat [-p PID] [--json] [-w|--watch [SECS]] [-h|--help] [--version]\n"
		    "List the libsovia connections of your processes (of every user's for root).\n"
		    "  -p, --pid PID     only that process\n"
		    "  -j, --json        one JSON object: {\"connections\":[...]}\n"
		    "  -w, --watch[=S]   show again every S seconds (default 1) until interrupted\n"
		    "  -h, --help        this text\n"
		    "      --version     libsovia's version\n");
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

/* One look at every process (or just `only`): 0, or 1 after an error. */
static const char *why(int err)
{
	switch (err) {
	case -EACCES:
		return "its user's connections are not yours to see";
	case -ESRCH:
		return "not the process its view's name says";
	case -EPERM:
		return "its view's socket is not its users' (it changed users just now?)";
	case -ETIMEDOUT:
		return "not answering (stopped?)";
	case -ECONNRESET:
		return "gave no view (out of memory?)";
	case -EPROTO:
		return "answered with something that is not a view";
	case -ECONNREFUSED:
		return "has no libsovia view";
	case -ENOENT:
		return "no such process";
	}
	return strerror(-err);
}

/* One look at every process (or just `only`): 0, or 1 after an error. */
static int show(int only, bool json)
{
	struct list l = {0};
	int status = 0;
	struct ask *a = NULL;
	int n = find_views(only, &a);
	if (n < 0) {
		fprintf(stderr, "sovia-stat: /proc/net/unix: %s\n", strerror(-n));
		return 1;
	}
	if (only && n == 0) {
		fprintf(stderr, "sovia-stat: process %d: %s\n", only,
			kill(only, 0) < 0 && errno == ESRCH ? why(-ENOENT) : why(-ECONNREFUSED));
		free(a);
		return 1;
	}
	/* In batches: all at once would run out of fds with many
	 * processes, and hold every view's text at the same time. */
	for (int b = 0; b < n; b += BATCH) {
		int m = n - b < BATCH ? n - b : BATCH;
		ask_all(a + b, (size_t)m);
		for (int i = b; i < b + m; i++) {
			if (a[i].text)
				collect(&a[i], &l);
			else if (only) { /* others', and ones gone since, are skipped */
				fprintf(stderr, "sovia-stat: process %d: %s\n", only, why(a[i].err));
				status = 1;
			}
			free(a[i].text);
		}
	}
	free(a);
	if (json)
		print_json(&l);
	else if (!status)
		print_table(&l);
	free(l.v);
	fflush(stdout);
	return status;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"pid", required_argument, NULL, 'p'}, {"json", no_argument, NULL, 'j'},
		{"watch", optional_argument, NULL, 'w'}, {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},	{NULL, 0, NULL, 0},
	};
	long pid = 0, every = 0;
	bool json = false;
	int c;
	while ((c = getopt_long(argc, argv, "p:jw::h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if (!parse_int(optarg, 1, INT32_MAX, &pid)) {
				fprintf(stderr, "sovia-stat: -p: '%s' is not a process id\n", optarg);
				return 2;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'w':
			every = 1;
			/* "-w 2": getopt leaves an optional argument in the next word. */
			if (!optarg && optind < argc && isdigit((unsigned char)argv[optind][0]))
				optarg = argv[optind++];
			if (optarg && !parse_int(optarg, 1, 86400, &every)) {
				fprintf(stderr, "sovia-stat: --watch: '%s' is not a number of seconds 1..86400\n",
					optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("sovia-stat (libsovia) %s\n", SOVIA_VERSION_STRING);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "sovia-stat: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_DFL);
	if (!every)
		return show((int)pid, json);
	for (;;) {
		if (!json && isatty(STDOUT_FILENO))
			printf("\033[H\033[2J"); /* a screen, as watch(1) shows it */
		show((int)pid, json);
		struct timespec ts = {.tv_sec = every};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
}
