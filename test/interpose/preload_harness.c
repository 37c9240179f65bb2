/* The interposer's tests' harness: see preload_harness.h. */
#include "preload_harness.h"

#include "fdtable.h"
#include "preload.h"
#include "real.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <unistd.h>

struct sv_stream *ph_stream(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	struct sv_stream *s = f && f->ops->wait ? f->priv : NULL;
	sv_fd_put(f);
	return s;
}

const char *ph_ops_name(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	const char *n = f ? f->ops->name : NULL;
	sv_fd_put(f);
	return n;
}

pid_t ph_fork_one(int fd)
{
	struct sv_fd *f = sv_fd_get(fd);
	cr_assert(f && f->ops->detach_for_fork, "fd %d is not a stream's", fd);
	(void)f->ops->detach_for_fork(f);
	sv_fd_put(f);
	/* glibc's fork runs our fork handlers in the child (interpose.c). */
	pid_t pid = SV_REAL(fork)();
	sv_ops_after_fork(pid);
	return pid;
}

/* The pairs' streams, held for the test's life: a successor (a second
 * life, stream_redo.c) may take a pair's fd, and its predecessor, which
 * the test still looks at, would be freed. */
static struct sv_stream *held[64];
static unsigned nheld;

static void hold(struct sv_stream *s)
{
	cr_assert_lt(nheld, sizeof(held) / sizeof(held[0]), "too many pairs in one test");
	sv_stream_get(s);
	held[nheld++] = s;
}

void ph_pair_rdma(struct pair *p)
{
	h_listen(p, false); /* listen() made the RDMA listener */
	h_connect_sockets(p);
	p->c = ph_stream(p->cfd);
	p->s = ph_stream(p->sfd);
	cr_assert(p->c && p->s, "connect() and accept() made no streams");
	hold(p->c);
	hold(p->s);
	/* The server looks at it as an application does after accept():
	 * its upgrade request waits for that (sv_stream_app_uses). */
	struct pollfd pfd = {.fd = p->sfd, .events = POLLIN};
	cr_assert_geq(poll(&pfd, 1, 0), 0);
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p->c)));
	cr_assert_eq(h_wait_state(p->s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "server: %s",
		     sv_conn_state_name(h_state(p->s)));
}

void ph_pair_close(struct pair *p)
{
	int *fds[] = {&p->cfd, &p->sfd, &p->lfd};
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
	p->c = p->s = NULL;
}

long ph_write_all(int fd, const void *buf, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write(fd, (const uint8_t *)buf + done, n - done);
		if (r < 0)
			return done ? (long)done : -1;
		done += (size_t)r;
	}
	return (long)done;
}

size_t ph_read_all(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return got;
}
