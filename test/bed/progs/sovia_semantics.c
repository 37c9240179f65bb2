/* The socket semantics an application relies on, checked on one connection
 * (over RDMA when preloaded in the test bed): a plain socket program.
 *
 *   sovia-semantics -s PORT         server
 *   sovia-semantics -c HOST PORT    client
 *
 * Both wait for SIGUSR1 after connecting (test/integration/semantics.sh
 * sends it once libsovia logged the connection on RDMA), then run the
 * steps in lock-step; each side exits non-zero at the first surprise:
 *
 *   1. SO_RCVTIMEO: a read with nothing sent fails with EAGAIN.
 *   2. MSG_DONTWAIT and O_NONBLOCK: EAGAIN with nothing to read. Also
 *      when O_NONBLOCK was set by a raw system call (no fcntl wrapper saw
 *      it, as when another process sharing the file sets it) right after
 *      a blocking read waited, and when set by ioctl(FIONBIO).
 *   3. FIONREAD counts what arrived; MSG_PEEK leaves it there.
 *   4. MSG_WAITALL gets all of 100,000 bytes sent in small pieces.
 *   4b. With TCP_NODELAY, non-blocking 64-byte writes to a reader that
 *      sleeps are taken until EAGAIN, at least 64 KiB of them (a TCP
 *      socket's send buffer takes that much); every one arrives.
 *   5. A signal whose handler lacks SA_RESTART fails a blocking read with
 *      EINTR; with SA_RESTART the read goes on and returns the data.
 *   6. After the peer closed: EPIPE without a signal under MSG_NOSIGNAL,
 *      then EPIPE and SIGPIPE without it.
 *
 *   sovia-semantics -S PORT / -C HOST PORT: the wait-flush rounds instead.
 *   The client writes a request in two small pieces and waits for the
 *   answer in poll, then select, then epoll_wait; the server answers once
 *   it has both pieces. Under coalescing the second piece is held (the
 *   first is not acknowledged yet) until the client's wait pushes it out;
 *   test/integration/semantics.sh makes every other way out (the timers)
 *   too slow to come first and checks libsovia's counters.
 *
 *   sovia-semantics -E PORT / -e HOST PORT: an end by _exit. The client
 *   writes 1 MiB and a small tail, closes and calls _exit at once, as
 *   ftpd ends a session; the server reads to the end and checks that every
 *   byte arrived, in order. Between the bulk and the tail, a child made by
 *   clone() with the client's memory (a hand-made vfork) calls _exit: it
 *   must leave the client's connection alone. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *me = "?";

#define CHECK(cond, ...)                                                                    \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "sovia-semantics %s: line %d: ", me, __LINE__);     \
			fprintf(stderr, __VA_ARGS__);                                       \
			fprintf(stderr, " (errno %s)\n", strerror(errno));                  \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static void step(const char *what)
{
	printf("%s: %s: ok\n", me, what);
	fflush(stdout);
}

static void send_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		CHECK(w > 0 || errno == EINTR, "send");
		if (w > 0) {
			c += w;
			n -= (size_t)w;
		}
	}
}

static void recv_exact(int fd, void *p, size_t n)
{
	ssize_t r = recv(fd, p, n, MSG_WAITALL);
	CHECK(r == (ssize_t)n, "recv of %zu gave %zd", n, r);
}

/* One byte of lock-step. */
static void say(int fd, char c)
{
	send_all(fd, &c, 1);
}

static void expect(int fd, char want)
{
	char c = 0;
	recv_exact(fd, &c, 1);
	CHECK(c == want, "got '%c', want '%c'", c, want);
}

static void wait_go(void)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	int sig;
	CHECK(sigwait(&s, &sig) == 0, "sigwait");
}

static volatile sig_atomic_t caught_usr2, caught_pipe;
static void on_usr2(int sig)
{
	(void)sig;
	caught_usr2++;
}
static void on_pipe(int sig)
{
	(void)sig;
	caught_pipe++;
}

static void handle(int sig, void (*fn)(int), int flags)
{
	struct sigaction sa = {.sa_handler = fn, .sa_flags = flags};
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(sig, &sa, NULL) == 0, "sigaction");
}

static char state_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return '?';
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] && p[2] ? p[2] : '?';
}

/* Signal pid once it sleeps (in its blocking read). */
static void signal_when_asleep(pid_t pid, int sig)
{
	for (int i = 0; state_of(pid) != 'S'; i++) {
		CHECK(i < 600000, "the server never went to sleep");
		usleep(100);
	}
	usleep(50000); /* past libsovia's spin, asleep in the kernel */
	CHECK(kill(pid, sig) == 0, "kill");
}

static void server(int fd)
{
	char buf[256];
	/* 1 */
	struct timeval tv = {0, 200000};
	CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0, "SO_RCVTIMEO");
	ssize_t r = recv(fd, buf, sizeof(buf), 0);
	CHECK(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "timed read gave %zd", r);
	tv.tv_usec = 0;
	CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0, "SO_RCVTIMEO");
	step("SO_RCVTIMEO read with nothing sent: EAGAIN");
	say(fd, '1');
	/* 2: two answers late enough that the client's reads wait for them */
	for (int i = 0; i < 2; i++) {
		expect(fd, 'q');
		usleep(50000);
		say(fd, 'a');
	}
	/* 3 */
	expect(fd, '3');
	int n = 0;
	for (int i = 0; n < 5000; i++) {
		CHECK(ioctl(fd, FIONREAD, &n) == 0, "FIONREAD");
		CHECK(i < 600000, "FIONREAD stays at %d", n);
		if (n < 5000)
			usleep(100);
	}
	CHECK(n == 5000, "FIONREAD says %d, want 5000", n);
	r = recv(fd, buf, 10, MSG_PEEK);
	CHECK(r == 10 && memcmp(buf, "peekpeekpe", 10) == 0, "MSG_PEEK gave %zd", r);
	char all[5000];
	recv_exact(fd, all, sizeof(all));
	CHECK(memcmp(all, "peekpeekpe", 10) == 0, "the peeked bytes were not left in place");
	CHECK(ioctl(fd, FIONREAD, &n) == 0 && n == 0, "FIONREAD after reading: %d", n);
	step("FIONREAD counts 5000; MSG_PEEK leaves them");
	say(fd, '4');
	/* 4 */
	static char big[100000];
	r = recv(fd, big, sizeof(big), MSG_WAITALL);
	CHECK(r == (ssize_t)sizeof(big), "MSG_WAITALL gave %zd", r);
	for (size_t i = 0; i < sizeof(big); i++)
		CHECK(big[i] == (char)(i * 7), "MSG_WAITALL byte %zu", i);
	step("MSG_WAITALL: 100000 bytes from 100 pieces");
	/* 4b: not reading while the client queues small writes; then count
	 * them up to its end chunk ('Z', then how many it wrote). */
	usleep(500000);
	long got = 0, sent = -1;
	for (;;) {
		char c64[64];
		recv_exact(fd, c64, sizeof(c64));
		if (c64[0] == 'Z') {
			memcpy(&sent, c64 + 8, sizeof(sent));
			break;
		}
		for (int k = 0; k < 64; k++)
			CHECK(c64[k] == 'a', "queued write %ld, byte %d", got, k);
		got++;
	}
	CHECK(got == sent, "%ld queued 64-byte writes arrived, the client wrote %ld", got, sent);
	step("64-byte NODELAY writes queued while we slept: all arrived");
	/* 5: the client signals us while we sleep in read() */
	handle(SIGUSR2, on_usr2, 0);
	pid_t pid = getpid();
	send_all(fd, &pid, sizeof(pid));
	r = recv(fd, buf, 1, 0);
	CHECK(r < 0 && errno == EINTR, "a read interrupted without SA_RESTART gave %zd", r);
	CHECK(caught_usr2 == 1, "handler ran %d times", (int)caught_usr2);
	step("blocking read, signal without SA_RESTART: EINTR");
	handle(SIGUSR2, on_usr2, SA_RESTART);
	say(fd, '5');
	r = recv(fd, buf, 1, 0);
	CHECK(r == 1 && buf[0] == 'X', "a read interrupted with SA_RESTART gave %zd", r);
	CHECK(caught_usr2 == 2, "handler ran %d times", (int)caught_usr2);
	step("blocking read, signal with SA_RESTART: restarted, data read");
	/* 6: the client closes */
	r = recv(fd, buf, 1, 0);
	CHECK(r == 0, "read at the peer's close gave %zd", r);
	handle(SIGPIPE, on_pipe, 0);
	int i;
	for (i = 0; i < 100000; i++) {
		r = send(fd, buf, 1, MSG_NOSIGNAL);
		if (r < 0)
			break;
		usleep(1000);
	}
	CHECK(r < 0 && (errno == EPIPE || errno == ECONNRESET),
	      "writes to a closed peer kept succeeding (%d)", i);
	CHECK(caught_pipe == 0, "SIGPIPE under MSG_NOSIGNAL");
	r = send(fd, buf, 1, 0);
	CHECK(r < 0 && errno == EPIPE, "a write after EPIPE gave %zd", r);
	CHECK(caught_pipe == 1, "SIGPIPE raised %d times", (int)caught_pipe);
	step("closed peer: EPIPE, SIGPIPE only without MSG_NOSIGNAL");
	close(fd);
}

static void client(int fd)
{
	char buf[16];
	expect(fd, '1');
	/* 2 */
	ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
	CHECK(r < 0 && errno == EAGAIN, "MSG_DONTWAIT gave %zd", r);
	int fl = fcntl(fd, F_GETFL);
	CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	r = read(fd, buf, sizeof(buf));
	CHECK(r < 0 && errno == EAGAIN, "O_NONBLOCK read gave %zd", r);
	CHECK(fcntl(fd, F_SETFL, fl) == 0, "blocking again");
	/* A blocking read that waits, then O_NONBLOCK behind the wrappers'
	 * back: the read must still fail with EAGAIN, not sleep (SIGALRM's
	 * default action ends a read that sleeps anyway, failing the step). */
	say(fd, 'q');
	expect(fd, 'a');
	CHECK(syscall(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK) == 0, "raw O_NONBLOCK");
	alarm(30);
	r = read(fd, buf, sizeof(buf));
	alarm(0);
	CHECK(r < 0 && errno == EAGAIN, "read after a raw O_NONBLOCK gave %zd", r);
	CHECK(syscall(SYS_fcntl, fd, F_SETFL, fl) == 0, "raw blocking again");
	say(fd, 'q');
	expect(fd, 'a');
	int on = 1;
	CHECK(ioctl(fd, FIONBIO, &on) == 0, "FIONBIO on");
	r = read(fd, buf, sizeof(buf));
	CHECK(r < 0 && errno == EAGAIN, "read after FIONBIO gave %zd", r);
	on = 0;
	CHECK(ioctl(fd, FIONBIO, &on) == 0, "FIONBIO off");
	step("MSG_DONTWAIT and O_NONBLOCK with nothing to read: EAGAIN");
	/* 3 */
	char all[5000];
	for (size_t i = 0; i < sizeof(all); i++)
		all[i] = "peek"[i % 4];
	say(fd, '3');
	send_all(fd, all, sizeof(all));
	expect(fd, '4');
	/* 4: 100 pieces, each pushed out on its own */
	int one = 1;
	CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "NODELAY");
	static char big[100000];
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7);
	for (size_t off = 0; off < sizeof(big); off += 1000) {
		send_all(fd, big + off, 1000);
		if (off % 10000 == 0)
			usleep(2000);
	}
	/* 4b: the server sleeps; small NODELAY writes are taken until EAGAIN
	 * (at most 1 MiB: a reader that wakes meanwhile keeps room free). */
	char chunk[64];
	memset(chunk, 'a', sizeof(chunk));
	long n = 0;
	for (;;) {
		ssize_t w = send(fd, chunk, sizeof(chunk), MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "a queued 64-byte write");
			break;
		}
		if (w < (ssize_t)sizeof(chunk)) /* the kernel may take part of one */
			send_all(fd, chunk + w, sizeof(chunk) - (size_t)w);
		if (++n == 16384)
			break;
	}
	CHECK(n * 64 >= 65536, "only %ld 64-byte NODELAY writes were taken before EAGAIN", n);
	memset(chunk, 0, sizeof(chunk));
	chunk[0] = 'Z';
	memcpy(chunk + 8, &n, sizeof(n));
	send_all(fd, chunk, sizeof(chunk));
	printf("%s: %ld 64-byte NODELAY writes taken before EAGAIN\n", me, n);
	step("64-byte NODELAY writes queued while the reader slept");
	/* 5 */
	pid_t pid;
	recv_exact(fd, &pid, sizeof(pid));
	signal_when_asleep(pid, SIGUSR2);
	expect(fd, '5');
	signal_when_asleep(pid, SIGUSR2);
	usleep(100000); /* let the handler run before the data comes */
	say(fd, 'X');
	/* 6 */
	close(fd);
	step("lock-step done, closed");
}

#define WAIT_ROUNDS 3
static const char *const wait_how[WAIT_ROUNDS] = {"poll", "select", "epoll_wait"};

/* Sleep until fd is readable, the way round r does it. */
static void wait_in(int fd, int r)
{
	int n = -1;
	if (r == 0) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		n = poll(&p, 1, -1);
	} else if (r == 1) {
		fd_set rd;
		FD_ZERO(&rd);
		FD_SET(fd, &rd);
		n = select(fd + 1, &rd, NULL, NULL, NULL);
	} else {
		int ep = epoll_create1(0);
		struct epoll_event e = {.events = EPOLLIN, .data.fd = fd}, got;
		CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0, "epoll");
		n = epoll_wait(ep, &got, 1, -1);
		close(ep);
	}
	CHECK(n == 1, "%s gave %d", wait_how[r], n);
}

static void wait_server(int fd)
{
	for (int r = 0; r < WAIT_ROUNDS; r++) {
		char req[32];
		recv_exact(fd, req, sizeof(req));
		CHECK(req[0] == 'a' + r && req[16] == 'A' + r, "round %d: a wrong request", r);
		say(fd, (char)('0' + r));
		step(wait_how[r]);
	}
	char c;
	CHECK(recv(fd, &c, 1, 0) == 0, "no end after the rounds");
	close(fd);
}

static void wait_client(int fd)
{
	for (int r = 0; r < WAIT_ROUNDS; r++) {
		char a[16], b[16];
		memset(a, 'a' + r, sizeof(a));
		memset(b, 'A' + r, sizeof(b));
		send_all(fd, a, sizeof(a)); /* idle: sent at once */
		send_all(fd, b, sizeof(b)); /* held: a is not acknowledged */
		wait_in(fd, r);
		expect(fd, (char)('0' + r));
		step(wait_how[r]);
	}
	close(fd);
}

/* The byte at offset i of the _exit rounds' stream. */
static char exit_byte(size_t i)
{
	return (char)(i * 7 + i / 4093);
}

#define EXIT_BULK (1u << 20)
#define EXIT_TAIL 100u

static char child_stack[1 << 16];

static int shared_child(void *arg)
{
	(void)arg;
	_exit(0);
}

static void exit_writer(int fd)
{
	static char buf[8192];
	size_t off = 0;
	while (off < EXIT_BULK + EXIT_TAIL) {
		size_t n = off < EXIT_BULK ? sizeof(buf) : EXIT_TAIL;
		for (size_t i = 0; i < n; i++)
			buf[i] = exit_byte(off + i);
		if (off == EXIT_BULK) {
			pid_t pid = clone(shared_child, child_stack + sizeof(child_stack),
					  CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
			CHECK(pid > 0 && waitpid(pid, NULL, 0) == pid, "clone");
		}
		send_all(fd, buf, n);
		off += n;
	}
	CHECK(close(fd) == 0, "close");
	printf("exit-writer: %zu bytes written, closed: ok\n", off);
	_exit(0); /* no exit handlers: what is owed must go anyway */
}

static void exit_reader(int fd)
{
	static char buf[65536];
	size_t off = 0;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		CHECK(n >= 0, "read at offset %zu", off);
		if (n == 0)
			break;
		for (ssize_t i = 0; i < n; i++)
			CHECK(buf[i] == exit_byte(off + (size_t)i), "byte %zu differs", off + (size_t)i);
		off += (size_t)n;
	}
	CHECK(off == EXIT_BULK + EXIT_TAIL, "the stream ended after %zu of %u bytes", off,
	      EXIT_BULK + EXIT_TAIL);
	printf("exit-reader: %zu bytes, all in order: ok\n", off);
	close(fd);
}

static int connect_to(const char *host, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo");
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0, "connect");
	freeaddrinfo(ai);
	return fd;
}

static int accept_on(const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE}, *ai;
	CHECK(getaddrinfo(NULL, port, &hints, &ai) == 0, "getaddrinfo");
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(l >= 0 && bind(l, ai->ai_addr, ai->ai_addrlen) == 0 && listen(l, 1) == 0, "listen");
	freeaddrinfo(ai);
	int fd = accept(l, NULL, NULL);
	CHECK(fd >= 0, "accept");
	close(l);
	return fd;
}

int main(int argc, char **argv)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);
	int fd;
	if (argc == 3 && argv[1][0] == '-' && argv[1][1] && strchr("sSE", argv[1][1]) && !argv[1][2]) {
		me = "server";
		fd = accept_on(argv[2]);
		printf("server: connected\n");
		wait_go();
		char m = argv[1][1];
		(m == 's' ? server : m == 'S' ? wait_server : exit_reader)(fd);
	} else if (argc == 4 && argv[1][0] == '-' && argv[1][1] && strchr("cCe", argv[1][1]) && !argv[1][2]) {
		me = "client";
		fd = connect_to(argv[2], argv[3]);
		printf("client: connected\n");
		wait_go();
		char m = argv[1][1];
		(m == 'c' ? client : m == 'C' ? wait_client : exit_writer)(fd);
	} else {
		fprintf(stderr, "usage: sovia-semantics -s PORT | -c HOST PORT "
				"| -S PORT | -C HOST PORT | -E PORT | -e HOST PORT\n");
		return 2;
	}
	return 0;
}
