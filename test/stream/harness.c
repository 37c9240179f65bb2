/* The stream-layer tests' harness: see harness.h. */
#include "harness.h"

#include "clock.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "peers.h"
#include "share.h"
#include "upgrade.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

uint64_t h_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t h_now_ms(void)
{
	return sv_now_us() / 1000u;
}

/* The helper's jobs run so far (a count, not a flag on the waiter's
 * stack: a job may outlive a test that gave up on it). */
static atomic_uint jobs_run;

static void job_done(void *arg, int rdma_err)
{
	(void)arg;
	(void)rdma_err;
	atomic_fetch_add(&jobs_run, 1);
}

/* One job on the helper, waited for. false: no helper to run it. */
static bool helper_job(void)
{
	unsigned before = atomic_load(&jobs_run);
	if (sv_helper_defer(job_done, NULL) < 0)
		return false;
	uint64_t until = h_ms() + 10000;
	while (atomic_load(&jobs_run) == before && h_ms() < until)
		usleep(200);
	cr_assert_neq(atomic_load(&jobs_run), before, "the helper ran no job in 10 s");
	return true;
}

void h_helper_round(void)
{
	/* The helper takes its jobs as one batch after each sleep, and looks
	 * at its connections (with a fresh reading of the clock) between
	 * sleeps: the second job is queued after the first ran, so a look
	 * begins and ends between the two. While rdma_cm starts on it, it
	 * runs no job and looks at nothing: its round comes once it is ready,
	 * or never while the test holds the start (fake_net_slow_start). */
	if (sv_helper_wake_fd() < 0)
		return; /* not started */
	uint64_t until = h_ms() + 10000;
	while (sv_helper_rdma_state() == 0 && !fake_net_start_held() && h_ms() < until)
		usleep(200);
	if (sv_helper_rdma_state() != 0 && helper_job())
		helper_job();
}

void h_warp_ms(uint64_t ms)
{
	sv_clock_warp(ms * 1000u);
	h_helper_round();
}

bool h_wait_asleep(struct sv_stream *s, int ms)
{
	uint64_t end = h_ms() + (uint64_t)ms;
	for (;;) {
		sv_lock(&s->lock);
		bool asleep = s->wt.waiters > 0;
		sv_unlock(&s->lock);
		if (asleep || h_ms() >= end)
			return asleep;
		usleep(1000);
	}
}

void h_setup(void)
{
	const char *log = getenv("SOVIA_TEST_LOG");
	sv_log_threshold = log ? atoi(log) : -1;
	sv_config_defaults(&sv_cfg);
	sv_cfg.upgrade_delay_ms = 0;
	sv_cfg.upgrade_timeout_ms = 5000;
	sv_cfg.window = 4;
	sv_cfg.buf_size = 4096;
	sv_cfg.coalesce_size = 1024;
	sv_cfg.reg_threshold = 1u << 30; /* the fake has no registration */
	fake_net_use();
	sv_share_init();
	sv_peers_use(NULL); /* this test's own table, empty */
}

void h_teardown(void)
{
	cr_expect_eq(fake_net_violations(), 0, "the fake network saw: %s", fake_net_why());
}

void h_listen(struct pair *p, bool rdma)
{
	cr_assert_eq(h_listen_at(p, rdma, 0), 0);
}

int h_listen_at(struct pair *p, bool rdma, uint16_t port)
{
	memset(p, 0, sizeof(*p));
	p->cfd = p->sfd = -1;
	p->lfd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(p->lfd, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;
		close(p->lfd);
		p->lfd = -1;
		return -e;
	}
	cr_assert_eq(listen(p->lfd, 16), 0);
	if (rdma) {
		p->l = sv_upgrade_listen(p->lfd);
		cr_assert_not_null(p->l, "no RDMA listener");
	}
	return 0;
}

void h_connect_sockets(struct pair *p)
{
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)&a, &al), 0);
	p->cfd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(p->cfd, (struct sockaddr *)&a, sizeof(a)), 0);
	p->sfd = accept(p->lfd, NULL, NULL);
	cr_assert_geq(p->sfd, 0);
}

void h_start_server(struct sv_stream *s, struct sv_listener *l)
{
	sv_stream_start_server(s, l);
	sv_stream_app_uses(s);
}

void h_connect(struct pair *p)
{
	h_connect_sockets(p);
	p->c = sv_stream_new(p->cfd, true);
	p->s = sv_stream_new(p->sfd, false);
	cr_assert(p->c && p->s);
	if (p->l)
		h_start_server(p->s, p->l);
	sv_stream_start_client(p->c);
}

void h_pair_rdma(struct pair *p)
{
	h_listen(p, true);
	h_connect(p);
	cr_assert_eq(h_wait_state(p->c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s",
		     sv_conn_state_name(h_state(p->c)));
	cr_assert_eq(h_wait_state(p->s, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "server: %s",
		     sv_conn_state_name(h_state(p->s)));
}

void h_pair_free(struct pair *p)
{
	sv_stream_put(p->c);
	sv_stream_put(p->s);
	if (p->l)
		sv_upgrade_unlisten(p->l);
	close(p->lfd);
}

enum sv_conn_state h_state(struct sv_stream *s)
{
	sv_lock(&s->lock);
	enum sv_conn_state st = s->state;
	sv_unlock(&s->lock);
	return st;
}

enum sv_fallback h_fallback(struct sv_stream *s)
{
	sv_lock(&s->lock);
	enum sv_fallback f = s->fallback;
	sv_unlock(&s->lock);
	return f;
}

enum sv_conn_state h_wait_state(struct sv_stream *s, enum sv_conn_state want, int ms)
{
	uint64_t end = h_ms() + (uint64_t)ms;
	enum sv_conn_state st;
	while ((st = h_state(s)) != want && h_ms() < end)
		usleep(1000);
	return st;
}

void h_warp_sleeper_ms(uint64_t ms, struct sv_stream *s)
{
	h_warp_ms(ms);
	sv_lock(&s->lock);
	uint64_t slept = s->st.waits_slept;
	sv_stream_wake(s);
	sv_unlock(&s->lock);
	uint64_t end = h_ms() + 2000;
	for (;;) {
		sv_lock(&s->lock);
		bool again = s->st.waits_slept > slept && s->wt.waiters > 0;
		sv_unlock(&s->lock);
		if (again || h_ms() >= end)
			return;
		usleep(1000);
	}
}

bool h_exchanging(struct sv_stream *s)
{
	enum sv_conn_state st = h_state(s);
	return st == SV_CONN_RESOLVING || st == SV_CONN_SWITCHING;
}

enum sv_conn_state h_wait_state_warp(struct sv_stream *s, enum sv_conn_state want, int ms)
{
	uint64_t end = h_now_ms() + (uint64_t)ms, real_end = h_ms() + 30000;
	enum sv_conn_state st;
	while ((st = h_state(s)) != want && h_now_ms() < end && h_ms() < real_end) {
		if (h_exchanging(s))
			usleep(1000);
		else
			h_warp_ms(H_WARP_STEP_MS);
	}
	return st;
}

void h_warp_steps_ms(uint64_t ms)
{
	for (uint64_t done = 0; done < ms; done += H_WARP_STEP_MS)
		h_warp_ms(H_WARP_STEP_MS);
}

struct h_counts h_counts(struct sv_stream *s)
{
	struct h_counts c = {0};
	sv_lock(&s->lock);
	if (s->proto) {
		const struct sv_proto_stats *p = sv_proto_stats(s->proto);
		c.rdma_tx = p->tx_bytes;
		c.rdma_rx = p->rx_bytes;
		c.gave_back = p->gave_back;
		c.got_back = p->got_back;
	}
	c.tcp_tx = s->st.tcp_tx_bytes;
	c.tcp_rx = s->st.tcp_rx_bytes;
	sv_unlock(&s->lock);
	return c;
}

long h_write(struct sv_stream *s, const void *buf, size_t n, int flags)
{
	struct iovec iov = {(void *)buf, n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return sv_stream_sendmsg(s, &m, flags | MSG_NOSIGNAL);
}

long h_read(struct sv_stream *s, void *buf, size_t n, int flags)
{
	struct iovec iov = {buf, n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return sv_stream_recvmsg(s, &m, flags);
}

long h_write_all(struct sv_stream *s, const void *buf, size_t n)
{
	size_t done = 0;
	while (done < n) {
		/* Writes of varying sizes: small ones coalesce, large ones go
		 * as whole messages. */
		size_t want = n - done, chunk = 1 + (done * 7919) % 20000;
		long r = h_write(s, (const uint8_t *)buf + done, want < chunk ? want : chunk, 0);
		if (r < 0)
			return done ? (long)done : r;
		done += (size_t)r;
	}
	return (long)done;
}

size_t h_read_all(struct sv_stream *s, void *buf, size_t n, long *end)
{
	size_t got = 0;
	*end = 1;
	while (got < n) {
		long r = h_read(s, (uint8_t *)buf + got, n - got, 0);
		if (r <= 0) {
			*end = r;
			return got;
		}
		got += (size_t)r;
	}
	return got;
}

static uint8_t pattern_byte(uint64_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
	x ^= x >> 31;
	x *= 0x94D049BB133111EBull;
	return (uint8_t)(x >> 56);
}

void h_pattern(uint8_t *buf, size_t n, uint64_t seed, uint64_t from)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = pattern_byte(seed, from + i);
}

bool h_pattern_ok(const uint8_t *buf, size_t n, uint64_t seed, uint64_t from)
{
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pattern_byte(seed, from + i))
			return false;
	return true;
}

static void *writer_main(void *arg)
{
	struct h_writer *w = arg;
	uint8_t *buf = malloc(w->len);
	h_pattern(buf, w->len, w->seed, 0);
	w->written = h_write_all(w->s, buf, w->len);
	free(buf);
	w->end = w->close_fd ? sv_stream_close(w->s, w->fd) : sv_stream_shutdown(w->s, SHUT_WR);
	return NULL;
}

void h_writer_start(struct h_writer *w)
{
	cr_assert_eq(pthread_create(&w->t, NULL, writer_main, w), 0);
}

void h_writer_join(struct h_writer *w)
{
	pthread_join(w->t, NULL);
}

int h_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	cr_assert_not_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

uint64_t h_helper_looks(struct sv_stream *s)
{
	sv_lock(&s->lock);
	uint64_t n = s->st.helper_looks;
	sv_unlock(&s->lock);
	return n;
}

void h_exchange(struct pair *p, uint64_t seed, bool rdma)
{
	uint8_t out[5000], in[5000];
	long end;
	h_pattern(out, sizeof(out), seed, 0);
	struct h_counts c0 = h_counts(p->c), s0 = h_counts(p->s);
	cr_assert_eq(h_write_all(p->c, out, sizeof(out)), (long)sizeof(out));
	cr_assert_eq(h_read_all(p->s, in, sizeof(in), &end), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), seed, 0));
	cr_assert_eq(h_write_all(p->s, out, sizeof(out)), (long)sizeof(out));
	cr_assert_eq(h_read_all(p->c, in, sizeof(in), &end), sizeof(in));
	cr_assert(h_pattern_ok(in, sizeof(in), seed, 0));
	struct h_counts c = h_counts(p->c), s = h_counts(p->s);
	if (rdma) {
		cr_assert_eq(c.rdma_tx - c0.rdma_tx, sizeof(out), "the client's bytes went on RDMA");
		cr_assert_eq(s.rdma_tx - s0.rdma_tx, sizeof(out), "the server's bytes went on RDMA");
	} else {
		cr_assert_eq(c.rdma_tx + s.rdma_tx, 0);
		cr_assert_eq(c.tcp_tx - c0.tcp_tx, sizeof(out), "the client's bytes went on TCP");
		cr_assert_eq(s.tcp_tx - s0.tcp_tx, sizeof(out), "the server's bytes went on TCP");
	}
}
