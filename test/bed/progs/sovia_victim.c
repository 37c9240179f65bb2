/* sovia-victim: the server sovia-hostile attacks (test/integration/hostile.sh),
 * a plain socket program that says what became of each connection.
 * Nothing here knows about libsovia.
 *
 *   sovia-victim -p PORT [-a ADDR] [-n CONNS] [-i FILE [-g BYTES]] [-o PREFIX]
 *                [-k BYTES [-x fork|sendfile]] [-e]
 *
 * Serves CONNS connections (default 1) one after the other. On each it
 * reads until EOF or an error, into PREFIX.N (N from 1) with -o; with -i a
 * second thread writes FILE meanwhile (once BYTES were read, with -g: a
 * libsovia peer's bytes then go over its QP), then shuts down its sending; with
 * -e every byte read is written back (an echo server). With -k, once BYTES
 * were read on a connection, it calls fork() (the child exits at once),
 * which takes a libsovia connection back to TCP under SOVIA_FORK_KEEP=0
 * (otherwise the parent keeps it on RDMA), or sendfile() of FILE's
 * first 16 bytes (back to TCP only when FILE is not a regular file: from
 * one libsovia serves it), and says how long the call took. After the last
 * connection it prints its peak memory (VmHWM) and exits 0; 1 if it could
 * not serve. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct opts {
	const char *addr, *in, *out, *call;
	int port, conns;
	long long trigger, gate;
	bool echo;
};

struct writer {
	pthread_t t;
	int fd;
	const char *path;
	unsigned long long wrote, gate;
	int err;
	/* The bytes the reader has read, for the gate. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned long long got;
	bool done;
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int write_all(int fd, const char *buf, size_t n, unsigned long long *done)
{
	while (n) {
		ssize_t w = write(fd, buf, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return errno ? errno : EIO;
		buf += w;
		n -= (size_t)w;
		if (done)
			*done += (unsigned long long)w;
	}
	return 0;
}

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	pthread_mutex_lock(&w->mu);
	while (w->got < w->gate && !w->done)
		pthread_cond_wait(&w->cv, &w->mu);
	bool open_gate = w->got >= w->gate;
	pthread_mutex_unlock(&w->mu);
	if (!open_gate)
		return NULL; /* the connection ended first */
	int f = open(w->path, O_RDONLY | O_CLOEXEC);
	if (f < 0) {
		w->err = errno;
		return NULL;
	}
	static char buf[1 << 16];
	ssize_t n;
	while ((n = read(f, buf, sizeof(buf))) > 0 && !w->err)
		w->err = write_all(w->fd, buf, (size_t)n, &w->wrote);
	close(f);
	if (!w->err)
		shutdown(w->fd, SHUT_WR);
	return NULL;
}

/* The call (fork, or sendfile), timed. */
static void detach_call(const struct opts *o, int c, int n, unsigned long long at)
{
	uint64_t t0 = now_ms();
	long r;
	int err = 0;
	if (!strcmp(o->call, "sendfile")) {
		int f = o->in ? open(o->in, O_RDONLY | O_CLOEXEC) : -1;
		r = f < 0 ? -1 : (long)sendfile(c, f, NULL, 16);
		err = errno;
		if (f >= 0)
			close(f);
	} else {
		pid_t pid = fork();
		if (pid == 0)
			_exit(0);
		r = pid;
		err = errno;
		if (pid > 0)
			waitpid(pid, NULL, 0);
	}
	printf("victim: conn %d: %s() returned %s after %llu ms (at %llu bytes read)\n", n, o->call,
	       r < 0 ? strerror(err) : "ok", (unsigned long long)(now_ms() - t0), at);
	fflush(stdout);
}

static void tell_writer(struct writer *w, unsigned long long got, bool done)
{
	pthread_mutex_lock(&w->mu);
	w->got = got;
	w->done = done;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* One connection, read to its end. */
static void serve(const struct opts *o, int c, int n)
{
	struct writer w = {.fd = c, .path = o->in, .gate = (unsigned long long)o->gate,
			   .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	bool writing = o->in && !o->echo && pthread_create(&w.t, NULL, writer_main, &w) == 0;
	FILE *out = NULL;
	if (o->out) {
		char path[4096];
		snprintf(path, sizeof(path), "%s.%d", o->out, n);
		out = fopen(path, "we");
	}
	static char buf[1 << 16];
	unsigned long long got = 0, echoed = 0;
	bool called = false;
	int rerr = 0, werr = 0;
	for (;;) {
		ssize_t r = read(c, buf, sizeof(buf));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rerr = r < 0 ? errno : 0;
			break;
		}
		got += (unsigned long long)r;
		tell_writer(&w, got, false);
		if (out && fwrite(buf, 1, (size_t)r, out) != (size_t)r)
			werr = EIO;
		if (o->echo && !werr)
			werr = write_all(c, buf, (size_t)r, &echoed);
		if (o->trigger > 0 && !called && got >= (unsigned long long)o->trigger) {
			called = true;
			detach_call(o, c, n, got);
		}
	}
	tell_writer(&w, got, true);
	if (writing)
		pthread_join(w.t, NULL);
	if (out)
		fclose(out);
	printf("victim: conn %d: read %llu bytes, end=%s; wrote %llu, write=%s\n", n, got,
	       rerr ? strerror(rerr) : "eof", writing ? w.wrote : echoed,
	       (writing ? w.err : werr) ? strerror(writing ? w.err : werr) : "ok");
	fflush(stdout);
}

static void peak_memory(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6) || !strncmp(line, "VmRSS:", 6))
			printf("victim: %s", line);
	if (f)
		fclose(f);
}

int main(int argc, char **argv)
{
	struct opts o = {.addr = "0.0.0.0", .conns = 1, .call = "fork"};
	int opt;
	while ((opt = getopt(argc, argv, "a:p:n:i:g:o:k:x:e")) != -1) {
		switch (opt) {
		case 'a': o.addr = optarg; break;
		case 'p': o.port = atoi(optarg); break;
		case 'n': o.conns = atoi(optarg); break;
		case 'i': o.in = optarg; break;
		case 'g': o.gate = atoll(optarg); break;
		case 'o': o.out = optarg; break;
		case 'k': o.trigger = atoll(optarg); break;
		case 'x': o.call = optarg; break;
		case 'e': o.echo = true; break;
		default:
			fprintf(stderr, "usage: sovia-victim -p PORT [-a ADDR] [-n CONNS] "
					"[-i FILE [-g BYTES]] [-o PREFIX] [-k BYTES [-x fork|sendfile]] "
					"[-e]\n");
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN); /* a reset connection says so through write's errno */
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.port)};
	int one = 1, l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (l < 0 || inet_pton(AF_INET, o.addr, &a.sin_addr) != 1 ||
	    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 16) < 0) {
		perror("sovia-victim: listen");
		return 1;
	}
	for (int n = 1; n <= o.conns; n++) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			perror("sovia-victim: accept");
			return 1;
		}
		serve(&o, c, n);
		close(c);
	}
	peak_memory();
	printf("victim: done\n");
	return 0;
}
