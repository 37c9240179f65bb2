/* The library's side of sovia-warden (warden.h): a server's listening
 * socket registered with the warden of its host, by a thread of its own.
 *
 * Whoever queues a registration (the application's listen(), or the
 * helper with the upgrade's lock held) never waits for the warden: a
 * warden that is stopped, slow or flooded by another user costs a server
 * the vouching, said once, and nothing else. The thread starts at the
 * first registration, waits at most SV_WARDEN_WAIT_MS for each step of
 * one (a connection whose backlog is full fails at once: it is never
 * waited for), and sleeps when there is none. */
#include "warden.h"

#include "fdpass.h"
#include "lock.h"
#include "log.h"
#include "real.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

const char *sv_warden_path = SV_WARDEN_SOCKET;

struct job {
	int fd;            /* the application's listening socket */
	uint64_t cookie;   /* ... as long as it has this cookie (SO_COOKIE) */
	uint16_t rdma_port;
	bool must;
	void (*done)(void *arg, int r);
	void *arg;
	struct job *next;
};

/* The jobs, and the thread that does them (started once per process:
 * a fork's child starts its own). Its lock ranks as the helper's: the
 * upgrade's is held when a job is queued. */
static struct {
	struct sv_lock lock;
	sem_t jobs; /* one post per job queued */
	struct job *head, **tail;
	bool started;
} q = {.lock = SV_LOCK_INIT(SV_RANK_HELPER), .tail = &q.head};

/* Said once per process: a warden that does not answer, or refuses. */
static atomic_bool told;

/* Wait for fd to be ready for `events`, at most SV_WARDEN_WAIT_MS: 0 or
 * -errno (-ETIMEDOUT). */
static int wait_ready(int fd, short events)
{
	struct pollfd p = {.fd = fd, .events = events};
	int n;
	do
		n = SV_REAL(poll)(&p, 1, SV_WARDEN_WAIT_MS);
	while (n < 0 && errno == EINTR);
	return n > 0 ? 0 : n == 0 ? -ETIMEDOUT : -errno;
}

/* A connection to the warden, non-blocking, whose peer is root (or
 * ourselves: a test's warden). The fd or -errno: -ENOENT when none runs
 * (or none is reachable from here), -EAGAIN when its backlog is full. */
static int connect_warden(void)
{
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	if (strlen(sv_warden_path) >= sizeof(un.sun_path))
		return -ENAMETOOLONG;
	strcpy(un.sun_path, sv_warden_path);
	int fd = SV_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	int r = 0;
	if (SV_REAL(connect)(fd, (struct sockaddr *)&un, sizeof(un)) < 0)
		r = errno == ECONNREFUSED || errno == ENOENT || errno == ENOTDIR ? -ENOENT
		    : errno == EINPROGRESS				     ? wait_ready(fd, POLLOUT)
									     : -errno;
	struct ucred uc;
	socklen_t len = sizeof(uc);
	if (r == 0 && SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		r = -errno;
	if (r == 0 && uc.uid != 0 && uc.uid != geteuid()) {
		sv_warn("%s is not root's (uid %u): no listener is registered there",
			sv_warden_path, (unsigned)uc.uid);
		r = -EPERM;
	}
	if (r < 0) {
		SV_REAL(close)(fd);
		return r;
	}
	return fd;
}

/* Is fd still the socket the job was queued for? The application may
 * have closed it (and reused its number) meanwhile: no copy of it is
 * held, which would keep its port bound after the application's close. */
static bool still_there(const struct job *j)
{
	uint64_t cookie = 0;
	socklen_t len = sizeof(cookie);
	return SV_REAL(getsockopt)(j->fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) == 0 &&
	       cookie == j->cookie;
}

/* One registration: 0, or -errno. */
static int do_job(const struct job *j)
{
	if (!still_there(j))
		return -ECANCELED;
	int fd = connect_warden();
	if (fd < 0)
		return fd;
	uint8_t msg[SV_WARDEN_MSG_LEN];
	sv_warden_msg_encode(j->rdma_port, msg);
	ssize_t w = sv_fd_send(fd, msg, sizeof(msg), j->fd, MSG_NOSIGNAL | MSG_DONTWAIT);
	int r = w == (ssize_t)sizeof(msg) ? 0 : w < 0 ? -errno : -EIO;
	/* Only a listener the warden alone can show clients waits for the
	 * answer; the others are taken for made once sent (the warden reads
	 * the message after we have gone). */
	if (r == 0 && j->must && (r = wait_ready(fd, POLLIN)) == 0) {
		char yes = 0;
		ssize_t k;
		do
			k = SV_REAL(recv)(fd, &yes, 1, MSG_DONTWAIT);
		while (k < 0 && errno == EINTR);
		r = k == 1 && yes == 'y' ? 0 : -EACCES;
	}
	SV_REAL(close)(fd);
	return r;
}

static void *run(void *unused)
{
	(void)unused;
	for (;;) {
		while (sem_wait(&q.jobs) < 0)
			; /* EINTR */
		sv_lock(&q.lock);
		struct job *j = q.head;
		q.head = j->next;
		if (!q.head)
			q.tail = &q.head;
		sv_unlock(&q.lock);
		int r = do_job(j);
		if (r == 0)
			sv_dbg("registered with sovia-warden: RDMA listener at port %u", j->rdma_port);
		else if (r != -ENOENT && r != -ECANCELED && !atomic_exchange(&told, true))
			sv_info("sovia-warden did not take a listener of ours (%s): its clients may "
				"not find it", strerror(-r));
		if (j->done)
			j->done(j->arg, r);
		free(j);
	}
	return NULL;
}

int sv_warden_register(int listen_fd, uint16_t rdma_port, bool must,
		       void (*done)(void *arg, int r), void *arg)
{
	uint64_t cookie = 0;
	socklen_t len = sizeof(cookie);
	if (SV_REAL(getsockopt)(listen_fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) < 0)
		return -errno;
	struct job *j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	*j = (struct job){.fd = listen_fd, .cookie = cookie, .rdma_port = rdma_port,
			  .must = must, .done = done, .arg = arg};
	sv_lock(&q.lock);
	int r = 0;
	if (!q.started && sem_init(&q.jobs, 0, 0) < 0)
		r = -errno;
	if (r == 0 && !q.started) {
		pthread_t t;
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old); /* not the application's signals */
		r = -pthread_create(&t, NULL, run, NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (r == 0) {
			pthread_detach(t);
			q.started = true;
		}
	}
	if (r == 0) {
		*q.tail = j;
		q.tail = &j->next;
		sem_post(&q.jobs);
	}
	sv_unlock(&q.lock);
	if (r < 0)
		free(j);
	return r;
}

void sv_warden_atfork_child(void)
{
	/* The parent's jobs are the parent's. */
	sv_lock_reinit(&q.lock);
	for (struct job *j = q.head, *n; j; j = n) {
		n = j->next;
		free(j);
	}
	q.head = NULL;
	q.tail = &q.head;
	q.started = false; /* its semaphore is made anew with the thread */
}
