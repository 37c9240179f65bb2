/* A signal handler that calls into libsovia while its thread is inside
 * libsovia (preload/reentry.c): it never deadlocks, and a call on a
 * connection libsovia serves is refused (EAGAIN for the calls that move
 * bytes, EBUSY for the others), so the peer gets exactly the stream's
 * bytes in order. Calls on other fds, and on a connection that is plain
 * TCP for good, are served. */
#include "preload_harness.h"

#include "fdtable.h"

/* The module's own sovia_conn_info, linked in (the header's run-time
 * lookup finds versioned symbols of a loaded module only). */
#define SOVIA_MODULE_BUILD
#include <sovia.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(signal, .init = h_setup, .fini = h_teardown, .timeout = 60);

/* The calls the handler makes, in order (all but the pipe's on the
 * connection), and what each must give when libsovia serves it: refused
 * with EAGAIN (moves bytes) or EBUSY, the connection left open. */
enum { H_WRITE, H_POLL, H_SELECT, H_EPOLL, H_DUP, H_INFO, H_SHUTDOWN, H_CLOSE, H_PIPE, H_CALLS };
static const struct {
	const char *name;
	long r;
	int err;
} refused[H_CALLS] = {
	[H_WRITE] = {"write", -1, EAGAIN},    [H_POLL] = {"poll", -1, EBUSY},
	[H_SELECT] = {"select", -1, EBUSY},   [H_EPOLL] = {"epoll_wait", -1, EBUSY},
	[H_DUP] = {"dup", -1, EBUSY},         [H_INFO] = {"sovia_conn_info", -1, EBUSY},
	[H_SHUTDOWN] = {"shutdown", -1, EBUSY},
	[H_CLOSE] = {"close", -1, EBUSY},     [H_PIPE] = {"write to a pipe", 1, 0},
};

static struct {
	int fd, pipe_w, ep;
	bool only_write; /* the handler writes to fd and does nothing else */
	volatile sig_atomic_t ran;
	long r[H_CALLS];
	int err[H_CALLS];
} hs;

static void handler_call(int i, long r)
{
	hs.r[i] = r;
	hs.err[i] = r < 0 ? errno : 0;
}

static void handler(int sig)
{
	(void)sig;
	int saved = errno;
	handler_call(H_WRITE, write(hs.fd, "sig", 3));
	if (!hs.only_write) {
		struct pollfd pf = {.fd = hs.fd, .events = POLLOUT};
		handler_call(H_POLL, poll(&pf, 1, 0));
		fd_set w;
		FD_ZERO(&w);
		FD_SET(hs.fd, &w);
		struct timeval tv = {0};
		handler_call(H_SELECT, select(hs.fd + 1, NULL, &w, NULL, &tv));
		struct epoll_event ev;
		handler_call(H_EPOLL, epoll_wait(hs.ep, &ev, 1, 0));
		handler_call(H_DUP, dup(hs.fd));
		struct sovia_conn_info info = {.size = sizeof(info)};
		handler_call(H_INFO, sovia_conn_info(hs.fd, &info));
		handler_call(H_SHUTDOWN, shutdown(hs.fd, SHUT_WR));
		handler_call(H_CLOSE, close(hs.fd));
		handler_call(H_PIPE, write(hs.pipe_w, "p", 1));
	}
	hs.ran = 1;
	errno = saved;
}

/* The handler for fd, which libsovia serves: an epoll set watches it. */
static void handler_setup(int fd, int pipe_w)
{
	memset(&hs, 0, sizeof(hs));
	hs.fd = fd;
	hs.pipe_w = pipe_w;
	hs.ep = epoll_create1(EPOLL_CLOEXEC);
	cr_assert_geq(hs.ep, 0);
	struct epoll_event ev = {.events = EPOLLIN};
	cr_assert_eq(epoll_ctl(hs.ep, EPOLL_CTL_ADD, fd, &ev), 0);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
}

/* The handler's calls that needed libsovia for the connection were
 * refused, and it is still open; the pipe's went to the kernel. */
static void handler_refused(void)
{
	cr_assert(hs.ran);
	for (int i = 0; i < H_CALLS; i++) {
		cr_assert_eq(hs.r[i], refused[i].r, "the handler's %s: %ld (%s)", refused[i].name,
			     hs.r[i], strerror(hs.err[i]));
		cr_assert_eq(hs.err[i], refused[i].err, "the handler's %s: %s", refused[i].name,
			     strerror(hs.err[i]));
	}
	cr_assert_geq(fcntl(hs.fd, F_GETFD), 0, "the connection's fd is still open");
	close(hs.ep);
}

/* The server reads exactly `want` then nothing more. */
static void server_reads(int sfd, const char *want)
{
	struct timeval tv = {.tv_sec = 10}; /* a failure ends in time; a pass never waits */
	cr_assert_eq(setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	char got[32] = {0};
	size_t n = strlen(want);
	cr_assert_eq(ph_read_all(sfd, got, n), n, "the server read \"%s\", not \"%s\"", got,
		     want);
	cr_assert_str_eq(got, want);
	int left = -1;
	cr_assert_eq(ioctl(sfd, FIONREAD, &left), 0);
	cr_assert_eq(left, 0, "%d more bytes", left);
}

/* A connection on RDMA, a pipe, and the handler for the client's end. */
static void served_setup(struct pair *p, int pp[2])
{
	ph_pair_rdma(p);
	cr_assert_eq(pipe(pp), 0);
	handler_setup(p->cfd, pp[1]);
}

/* After the handler: its calls were refused, and what the client writes
 * now is all the server gets (nothing of the handler's before it). */
static void refused_then_in_order(struct pair *p, int pp[2])
{
	handler_refused();
	cr_assert_eq(write(p->cfd, "after", 5), 5);
	server_reads(p->sfd, "after");
	close(pp[0]);
	close(pp[1]);
	ph_pair_close(p);
}

static int waiters(struct sv_stream *s)
{
	sv_lock(&s->lock);
	int n = (int)s->wt.waiters;
	sv_unlock(&s->lock);
	return n;
}

struct reader {
	int fd;
	char buf[8];
	ssize_t got;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	/* EINTR where some handler installed has no SA_RESTART (a
	 * sanitizer's), as the kernel's read would. */
	do
		r->got = read(r->fd, r->buf, 5);
	while (r->got < 0 && errno == EINTR);
	return NULL;
}

/* The client's thread sleeps in a read libsovia serves (on RDMA); a
 * handler interrupts it and writes to the same connection, polls it,
 * closes it, and writes to a pipe. */
Test(signal, a_handler_in_a_served_read_is_refused_and_the_bytes_stay_in_order)
{
	struct pair p;
	int pp[2];
	served_setup(&p, pp);
	struct reader r = {.fd = p.cfd};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, reader_main, &r), 0);
	uint64_t until = h_ms() + 10000;
	while (waiters(p.c) == 0 && h_ms() < until)
		usleep(1000);
	cr_assert_gt(waiters(p.c), 0, "the reader never slept in libsovia");
	cr_assert_eq(pthread_kill(t, SIGUSR1), 0);
	while (!hs.ran && h_ms() < until)
		usleep(1000);
	cr_assert_eq(write(p.sfd, "reply", 5), 5);
	pthread_join(t, NULL);
	cr_assert_eq(r.got, 5, "the interrupted read: %zd", r.got);
	cr_assert_eq(memcmp(r.buf, "reply", 5), 0);
	refused_then_in_order(&p, pp);
}

static void raise_in_lookup(int fd)
{
	if (fd == hs.fd && !hs.ran)
		raise(SIGUSR1);
}

/* The handler runs while its thread holds the fd table's stripe of the
 * very fd it writes to (a test hook raises it there): it must not wait
 * for that stripe. */
Test(signal, a_handler_in_the_fd_lookup_takes_no_lock)
{
	struct pair p;
	int pp[2];
	served_setup(&p, pp);
	cr_assert_eq(write(p.sfd, "x", 1), 1);
	sv_fdtable_test_held = raise_in_lookup;
	char b;
	ssize_t got = read(p.cfd, &b, 1);
	sv_fdtable_test_held = NULL;
	cr_assert_eq(got, 1);
	cr_assert_eq(b, 'x');
	refused_then_in_order(&p, pp);
}

/* Is the thread asleep (in the kernel)? */
static bool task_asleep(pid_t tid)
{
	char path[64], line[128], state = '?';
	snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f) && sscanf(line, "State: %c", &state) != 1)
		;
	if (f)
		fclose(f);
	return state == 'S';
}

struct kreader {
	struct reader r;
	volatile pid_t tid;
};

static void *kreader_main(void *arg)
{
	struct kreader *k = arg;
	k->tid = gettid();
	return reader_main(&k->r);
}

/* A connection that stayed on TCP (no RDMA route) is the kernel's socket
 * alone: the thread asleep in its read waits in the kernel, not inside
 * libsovia, and the handler's write to it goes out. */
Test(signal, a_handler_on_a_plain_tcp_connection_is_served)
{
	fake_net_no_route(true);
	struct pair p;
	h_listen(&p, false);
	h_connect_sockets(&p);
	p.c = ph_stream(p.cfd);
	cr_assert_not_null(p.c);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	int pp[2];
	cr_assert_eq(pipe(pp), 0);
	handler_setup(p.cfd, pp[1]);
	hs.only_write = true;
	struct kreader k = {.r = {.fd = p.cfd}};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, kreader_main, &k), 0);
	uint64_t until = h_ms() + 10000;
	while (!(k.tid && task_asleep(k.tid)) && h_ms() < until)
		usleep(1000);
	cr_assert(k.tid && task_asleep(k.tid), "the reader never slept");
	cr_assert_eq(pthread_kill(t, SIGUSR1), 0);
	while (!hs.ran && h_ms() < until)
		usleep(1000);
	cr_assert(hs.ran);
	cr_assert_eq(hs.r[H_WRITE], 3, "the handler's write on a plain TCP connection: %ld (%s)",
		     hs.r[H_WRITE], strerror(hs.err[H_WRITE]));
	close(hs.ep);
	cr_assert_eq(write(p.sfd, "reply", 5), 5);
	pthread_join(t, NULL);
	cr_assert_eq(k.r.got, 5);
	server_reads(p.sfd, "sig");
	close(pp[0]);
	close(pp[1]);
	ph_pair_close(&p);
}
