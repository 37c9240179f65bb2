/* sovia-local: a local user of a server's host against the root parts of
 * libsovia, one attack per mode (issue 53; docs/faults.md). It speaks the
 * documented wires by hand (src/upgrade/warden.h, the registration;
 * tools/sovia_stat.c, a view's answer), not through libsovia, and is run
 * as nobody by test/bed/hostile.sh, which judges the victims. Each mode
 * prints what it did, then waits to be killed.
 *
 *   sovia-local register -a IP -p PORT -r RDMA_PORT
 *       listen on IP:PORT, register it with sovia-warden as served at
 *       RDMA_PORT, close the listener and keep the connection to the
 *       warden (finding 1: the registration must die with the listener)
 *   sovia-local hang-warden -a IP -p PORT [-n CONNECTS]
 *       register a connected TCP socket that lingers in close() for an
 *       hour (its peer, a listener on IP:PORT of ours, never accepts nor
 *       reads), then open CONNECTS connections (256) to the warden that
 *       never register (findings 2 and 3: the warden must go on
 *       answering, and idle connections must not keep a user's room)
 *   sovia-local stat-view -a IP -p PORT
 *       answer on this process's sovia-stat view socket with such a
 *       lingering socket instead of a view (finding 4: root's sovia-stat
 *       must not wait for its close) */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define WARDEN_SOCKET "/run/sovia/warden.sock"
#define STAT_DIR "/dev/shm/libsovia-stat"

static void die(const char *what)
{
	printf("LOCAL_FAILED %s: %s\n", what, strerror(errno));
	fflush(stdout);
	exit(1);
}

static void say(const char *line)
{
	printf("%s\n", line);
	fflush(stdout);
}

static struct sockaddr_in in4(const char *ip, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		errno = EINVAL;
		die("address");
	}
	return a;
}

static int tcp_listener(const char *ip, int port, int backlog)
{
	struct sockaddr_in a = in4(ip, port);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s, backlog) < 0)
		die("listen");
	return s;
}

/* A TCP socket whose close() waits up to an hour: connected to a listener
 * of ours that never accepts, its send queue full, SO_LINGER on. */
static int lingering_socket(const char *ip, int port)
{
	int l = tcp_listener(ip, port, 4);
	struct sockaddr_in a = in4(ip, port);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	int small = 4096;
	setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect to our own listener");
	int fl = fcntl(s, F_GETFL);
	fcntl(s, F_SETFL, fl | O_NONBLOCK);
	static char junk[65536];
	size_t queued = 0;
	for (;;) {
		ssize_t w = send(s, junk, sizeof(junk), MSG_NOSIGNAL);
		if (w <= 0)
			break;
		queued += (size_t)w;
	}
	fcntl(s, F_SETFL, fl);
	struct linger lg = {.l_onoff = 1, .l_linger = 3600};
	if (setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
		die("SO_LINGER");
	printf("LOCAL lingering socket: %zu bytes queued to a peer that never reads\n", queued);
	fflush(stdout);
	(void)l; /* kept open, never accepted */
	return s;
}

static int unix_connect(const char *path, int type)
{
	struct sockaddr_un u = {.sun_family = AF_UNIX};
	snprintf(u.sun_path, sizeof(u.sun_path), "%s", path);
	int s = socket(AF_UNIX, type, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&u, sizeof(u)) < 0) {
		if (s >= 0)
			close(s);
		return -1;
	}
	return s;
}

/* One message: `len` bytes and the one fd. */
static ssize_t send_fd(int s, const void *buf, size_t len, int fd)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
			   .msg_controllen = sizeof(u.b)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(s, &m, MSG_NOSIGNAL);
}

/* The registration (src/upgrade/warden.h): "SOVW" (0x57564f53, little-
 * endian), version 2, zero, the RDMA port little-endian. */
static int warden_register(int fd, int rdma_port)
{
	uint8_t msg[8] = {0x53, 0x4f, 0x56, 0x57, 2, 0, (uint8_t)(rdma_port & 0xff),
			  (uint8_t)(rdma_port >> 8)};
	int w = unix_connect(WARDEN_SOCKET, SOCK_SEQPACKET);
	if (w < 0)
		die("connect to the warden");
	if (send_fd(w, msg, sizeof(msg), fd) != (ssize_t)sizeof(msg))
		die("send the registration");
	return w;
}

static void wait_forever(void)
{
	for (;;)
		pause();
}

static void do_register(const char *ip, int port, int rdma_port)
{
	int l = tcp_listener(ip, port, 16);
	int w = warden_register(l, rdma_port);
	char yes = 0;
	ssize_t r = recv(w, &yes, 1, 0);
	printf("LOCAL registered %s:%d at RDMA port %d: answer %c\n", ip, port, rdma_port,
	       r == 1 ? yes : '-');
	fflush(stdout);
	close(l);
	say("LOCAL closed the listener, kept the connection to the warden");
	wait_forever();
}

static void do_hang_warden(const char *ip, int port, int connects)
{
	int s = lingering_socket(ip, port);
	int w = warden_register(s, 40000);
	close(s); /* the warden's copy is the last one */
	int made = 0;
	for (int i = 0; i < connects; i++) {
		struct sockaddr_un u = {.sun_family = AF_UNIX};
		snprintf(u.sun_path, sizeof(u.sun_path), "%s", WARDEN_SOCKET);
		int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
		if (c < 0)
			break;
		if (connect(c, (struct sockaddr *)&u, sizeof(u)) == 0 || errno == EINPROGRESS)
			made++;
		else
			close(c);
	}
	printf("LOCAL registered a lingering socket, then %d connections that never register\n",
	       made);
	fflush(stdout);
	(void)w;
	wait_forever();
}

static void do_stat_view(const char *ip, int port)
{
	int s = lingering_socket(ip, port);
	char dir[64], path[108];
	snprintf(dir, sizeof(dir), "%s.%u", STAT_DIR, (unsigned)geteuid());
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		die("mkdir the view directory");
	snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
	unlink(path);
	struct sockaddr_un u = {.sun_family = AF_UNIX};
	snprintf(u.sun_path, sizeof(u.sun_path), "%s", path);
	int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&u, sizeof(u)) < 0 || listen(l, 16) < 0)
		die("the view socket");
	printf("LOCAL view at %s answers with the lingering socket\n", path);
	fflush(stdout);
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			continue;
		char one = 'v';
		if (send_fd(c, &one, 1, s) == 1)
			say("LOCAL answered a reader");
		close(c);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: sovia-local register|hang-warden|stat-view -a IP -p PORT ...\n");
		return 2;
	}
	const char *mode = argv[1], *ip = "127.0.0.1";
	int port = 0, rdma_port = 0, connects = 256, opt;
	optind = 2;
	while ((opt = getopt(argc, argv, "a:p:r:n:")) != -1) {
		switch (opt) {
		case 'a':
			ip = optarg;
			break;
		case 'p':
			port = atoi(optarg);
			break;
		case 'r':
			rdma_port = atoi(optarg);
			break;
		case 'n':
			connects = atoi(optarg);
			break;
		default:
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	/* As many connections as the hard limit lets anyone open. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (port <= 0)
		return 2;
	if (strcmp(mode, "register") == 0 && rdma_port > 0)
		do_register(ip, port, rdma_port);
	else if (strcmp(mode, "hang-warden") == 0)
		do_hang_warden(ip, port, connects);
	else if (strcmp(mode, "stat-view") == 0)
		do_stat_view(ip, port);
	return 2;
}
