/* sovia-warden (src/upgrade/warden.h) on the fake network: a rogue holds the
 * server's port in rdma_cm's space before the server's libsovia, as any
 * local user can. The client asks the warden's port first; the warden
 * here is the test's, with the real registration checks and table
 * (warden_table.c) behind a Unix socket of its own. The rogue must never
 * see a request: the client's echo would go to the real server's stream. */
#include "harness.h"

#include "cmdata.h"
#include "config.h"
#include "warden_table.h"
#include "../unit/fdrecv.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void setup(void);
static void teardown(void);
TestSuite(warden, .init = setup, .fini = teardown, .timeout = 60);

/* A listener on the fake network that answers every request with a
 * rejection: the warden's (from its table) or the rogue's (counted). */
struct cm_side {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	bool warden;
	atomic_int requests;
};

static struct cm_side warden_cm, rogue_cm;
static struct sv_warden_table *table;
static int diag = -1;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static int unix_fd = -1;
static char unix_path[108];
static pthread_t thread;
static atomic_bool running;
static bool thread_up;

static bool cm_up(struct cm_side *c, uint16_t port, bool warden)
{
	c->warden = warden;
	atomic_store(&c->requests, 0);
	c->ch = sv_cm->create_event_channel();
	cr_assert_not_null(c->ch);
	cr_assert_eq(sv_cm->create_id(c->ch, &c->id, NULL, RDMA_PS_TCP), 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (sv_cm->bind_addr(c->id, (struct sockaddr *)&a) < 0)
		return false;
	cr_assert_eq(sv_cm->listen_id(c->id, 16), 0);
	return true;
}

static int alive(void *arg, const struct sockaddr_storage *addr, uint64_t cookie)
{
	(void)arg;
	return sv_warden_alive(diag, addr, cookie);
}

static void cm_answer(struct cm_side *c)
{
	if (!c->ch)
		return;
	struct rdma_cm_event *ev;
	while (sv_cm->get_event(c->ch, &ev) == 0) {
		struct rdma_cm_id *gone = NULL;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			atomic_fetch_add(&c->requests, 1);
			struct sv_cm_req req;
			uint8_t pd[SV_CM_REJ_LEN];
			uint16_t port = 0;
			if (c->warden &&
			    sv_cm_req_decode(ev->param.conn.private_data,
					     ev->param.conn.private_data_len, &req) == 0) {
				pthread_mutex_lock(&table_lock);
				port = sv_warden_table_lookup(table, &req.server, alive, NULL);
				pthread_mutex_unlock(&table_lock);
			}
			if (port)
				sv_cm_rej_encode_redirect(port, pd);
			else
				sv_cm_rej_encode(SV_CM_REJ_UNKNOWN, pd);
			sv_cm->reject(ev->id, pd, sizeof(pd));
			gone = ev->id;
		}
		sv_cm->ack_event(ev);
		if (gone)
			sv_cm->destroy_id(gone);
	}
}

/* The warden's registrations: as tools/sovia_warden.c takes them. */
static void take_registrations(void)
{
	int c = accept4(unix_fd, NULL, NULL, SOCK_NONBLOCK);
	if (c < 0)
		return;
	uint8_t m[16];
	struct pollfd p = {.fd = c, .events = POLLIN};
	poll(&p, 1, 1000);
	int fd;
	ssize_t n = fdpass_recv(c, m, sizeof(m), &fd, MSG_DONTWAIT);
	uint16_t port;
	struct sv_warden_listener l;
	bool ok = n > 0 && sv_warden_msg_decode(m, (size_t)n, &port) == 0 && fd >= 0 &&
		  sv_warden_check_listener(diag, fd, &l) == 0;
	if (ok) {
		pthread_mutex_lock(&table_lock);
		ok = sv_warden_table_add(table, getuid(), &l, port) == 0;
		pthread_mutex_unlock(&table_lock);
	}
	if (fd >= 0)
		close(fd);
	(void)!send(c, ok ? "y" : "n", 1, MSG_NOSIGNAL);
	close(c); /* the registration lasts as long as its socket listens */
}

static void *serve(void *arg)
{
	(void)arg;
	while (atomic_load(&running)) {
		cm_answer(&warden_cm);
		cm_answer(&rogue_cm);
		if (unix_fd >= 0)
			take_registrations();
		usleep(1000);
	}
	return NULL;
}

static void setup(void)
{
	h_setup();
	memset(&warden_cm, 0, sizeof(warden_cm));
	memset(&rogue_cm, 0, sizeof(rogue_cm));
	table = sv_warden_table_new();
	diag = sv_warden_diag_open();
	cr_assert_geq(diag, 0);
	snprintf(unix_path, sizeof(unix_path), "/tmp/sovia-warden-stream.%d", (int)getpid());
	unlink(unix_path);
	sv_warden_path = unix_path;
	thread_up = false;
}

static void cm_down(struct cm_side *c)
{
	if (c->id)
		sv_cm->destroy_id(c->id);
	if (c->ch)
		sv_cm->destroy_event_channel(c->ch);
	c->id = NULL;
	c->ch = NULL;
}

static void teardown(void)
{
	if (thread_up) {
		atomic_store(&running, false);
		pthread_join(thread, NULL);
	}
	cm_down(&warden_cm);
	cm_down(&rogue_cm);
	if (unix_fd >= 0)
		close(unix_fd);
	unix_fd = -1;
	unlink(unix_path);
	sv_warden_path = SV_WARDEN_SOCKET;
	sv_warden_table_free(table);
	close(diag);
	h_teardown();
}

/* The warden (with its Unix socket) and a rogue on `port`, as asked. */
static void start(bool warden, uint16_t rogue_port)
{
	if (warden) {
		cr_assert(cm_up(&warden_cm, (uint16_t)sv_cfg.warden_port, true));
		unix_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
		struct sockaddr_un un = {.sun_family = AF_UNIX};
		strcpy(un.sun_path, unix_path);
		cr_assert_eq(bind(unix_fd, (struct sockaddr *)&un, sizeof(un)), 0);
		cr_assert_eq(listen(unix_fd, 8), 0);
	}
	if (rogue_port)
		cr_assert(cm_up(&rogue_cm, rogue_port, false), "the rogue could not listen");
	atomic_store(&running, true);
	cr_assert_eq(pthread_create(&thread, NULL, serve, NULL), 0);
	thread_up = true;
}

/* A server listening on TCP on the loopback, at a port of the kernel's
 * choice, without its RDMA listener yet: its port, for the rogue to take
 * too. Held from here on: no other test's connection can be given it
 * before the server listens (a port found free, closed and bound again
 * later could be). */
static uint16_t listen_tcp(struct pair *p)
{
	cr_assert_eq(h_listen_at(p, false, 0), 0);
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)&a, &len), 0);
	return ntohs(a.sin_port);
}

/* A pair on that server (port: from listen_tcp, which listens already),
 * or on a new one at any port (port 0); with an RDMA listener beside the
 * server's socket if rdma_server. */
static void pair_up(struct pair *p, bool rdma_server, uint16_t port)
{
	if (!port) {
		cr_assert_eq(h_listen_at(p, rdma_server, 0), 0);
	} else if (rdma_server && !p->l) {
		p->l = sv_upgrade_listen(p->lfd);
		cr_assert_not_null(p->l, "no RDMA listener");
	}
	h_connect_sockets(p);
	p->c = sv_stream_new(p->cfd, true);
	cr_assert_not_null(p->c);
	if (rdma_server) {
		p->s = sv_stream_new(p->sfd, false);
		cr_assert_not_null(p->s);
		h_start_server(p->s, p->l);
	}
	sv_stream_start_client(p->c);
}

/* Both ends of a pair on RDMA closed, and the pair freed. */
static void pair_done(struct pair *p)
{
	sv_stream_close(p->s, p->sfd);
	sv_stream_close(p->c, p->cfd);
	p->s = p->c = NULL;
	h_pair_free(p);
}

/* The rogue holds the server's port; the server's libsovia listens at
 * another and registers it; the warden sends the client there. */
Test(warden, the_warden_sends_the_client_past_the_rogue_to_the_server)
{
	struct pair p;
	uint16_t port = listen_tcp(&p);
	start(true, port);
	pair_up(&p, true, port);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p.c)), sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(atomic_load(&rogue_cm.requests), 0, "the rogue got a request");
	cr_assert_geq(atomic_load(&warden_cm.requests), 1);
	cr_assert_neq(p.c->up.redirect_port, 0);
	cr_assert_neq(p.c->up.redirect_port, port, "the server's listener is elsewhere");
	h_exchange(&p, 31, true);
	pair_done(&p);
}

/* A plain server (no libsovia listener registered) behind the rogue: the
 * warden knows none, the client stays on TCP, the rogue hears nothing,
 * and the server's stream is the client's bytes alone. */
Test(warden, a_server_the_warden_does_not_know_stays_on_tcp)
{
	struct pair p;
	uint16_t port = listen_tcp(&p);
	start(true, port);
	pair_up(&p, false, port);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.c), SV_FB_UNVOUCHED, "%s", sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(atomic_load(&rogue_cm.requests), 0, "the rogue got a request");
	cr_assert_geq(atomic_load(&warden_cm.requests), 2, "asked again, as for no listener yet");
	uint8_t b[6] = "hello!", r[8];
	cr_assert_eq(h_write_all(p.c, b, sizeof(b)), 6);
	cr_assert_eq(read(p.sfd, r, sizeof(r)), 6, "nothing but the client's bytes");
	cr_assert_eq(memcmp(b, r, 6), 0);
	sv_stream_put(p.c);
	p.c = NULL;
	h_pair_free(&p);
}

/* No warden on the server's host: the server's port is asked, as before
 * there were wardens (here the server's libsovia holds it). */
Test(warden, without_a_warden_the_servers_port_is_asked)
{
	start(false, 0);
	struct pair p;
	pair_up(&p, true, 0);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p.c)), sv_fallback_name(h_fallback(p.c)));
	cr_assert(p.c->up.no_warden);
	cr_assert_eq(p.c->up.connect_retries, 0, "asking the server's port is not a retry");
	h_exchange(&p, 32, true);
	pair_done(&p);
}

/* A host found without a warden is remembered for a while: the process's
 * next connection there asks the server's port at once, without the
 * round trip; a warden that appears meanwhile is not asked yet. */
Test(warden, a_host_without_a_warden_is_remembered)
{
	start(false, 0);
	struct pair p;
	pair_up(&p, true, 0);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert(p.c->up.no_warden);
	pair_done(&p);

	/* A warden now (it would answer "unknown": no listener registered). */
	atomic_store(&running, false);
	pthread_join(thread, NULL);
	cr_assert(cm_up(&warden_cm, (uint16_t)sv_cfg.warden_port, true));
	atomic_store(&running, true);
	cr_assert_eq(pthread_create(&thread, NULL, serve, NULL), 0);
	struct pair q;
	pair_up(&q, true, 0);
	cr_assert_eq(h_wait_state(q.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(q.c)), sv_fallback_name(h_fallback(q.c)));
	cr_assert_eq(atomic_load(&warden_cm.requests), 0, "the remembered host's warden was asked");
	pair_done(&q);
}

/* SOVIA_WARDEN_REQUIRED: no warden, no upgrade; the rogue on the port
 * hears nothing. */
Test(warden, a_required_warden_that_is_missing_keeps_tcp)
{
	sv_cfg.warden_required = true;
	struct pair p;
	uint16_t port = listen_tcp(&p);
	start(false, port);
	pair_up(&p, false, port);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_FALLBACK, 10000), SV_CONN_FALLBACK);
	cr_assert_eq(h_fallback(p.c), SV_FB_UNVOUCHED, "%s", sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(atomic_load(&rogue_cm.requests), 0, "the rogue got a request");
	sv_stream_put(p.c);
	p.c = NULL;
	h_pair_free(&p);
}

/* Without a warden, a server whose port the rogue holds has no RDMA
 * listener at all: nobody could send its clients elsewhere. */
Test(warden, a_held_port_without_a_warden_gives_the_server_no_listener)
{
	struct pair p;
	uint16_t port = listen_tcp(&p);
	start(false, port);
	p.l = sv_upgrade_listen(p.lfd);
	/* Opened on the helper (NULL: at once, and failed). */
	for (int i = 0; p.l && sv_upgrade_listener_usable(p.l) && i < 200; i++)
		usleep(10000);
	cr_assert(!p.l || !sv_upgrade_listener_usable(p.l), "a listener on a port another holds");
	h_pair_free(&p);
}

/* Issue 53: a warden that hangs costs a server nothing but the vouching.
 * Here its Unix socket takes no connection (its backlog is full, as any
 * local user can make it): the server's listen() returns at once, where
 * it used to wait in a blocking connect(), and its connections still
 * move to RDMA (nothing of the upgrade waits either). */
Test(warden, a_hung_warden_costs_a_servers_listen_nothing)
{
	int hung = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	strcpy(un.sun_path, unix_path);
	cr_assert_eq(bind(hung, (struct sockaddr *)&un, sizeof(un)), 0);
	cr_assert_eq(listen(hung, 0), 0);
	int fillers[8], nf = 0;
	while (nf < 8) {
		int f = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
		if (connect(f, (struct sockaddr *)&un, sizeof(un)) < 0) {
			close(f);
			break;
		}
		fillers[nf++] = f;
	}
	cr_assert_lt(nf, 8, "the warden's backlog never filled");
	start(false, 0);
	struct pair p;
	uint64_t t0 = h_ms();
	cr_assert_eq(h_listen_at(&p, true, 0), 0);
	uint64_t took = h_ms() - t0;
	cr_assert_lt(took, 100, "listen() took %llu ms", (unsigned long long)took);
	h_connect(&p);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p.c)), sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	h_exchange(&p, 33, true);
	pair_done(&p);
	/* rdma_cm is up now: this listener opens, and registers, in the
	 * application's own listen(). */
	struct pair q;
	t0 = h_ms();
	cr_assert_eq(h_listen_at(&q, true, 0), 0);
	took = h_ms() - t0;
	cr_assert_lt(took, 100, "the second listen() took %llu ms", (unsigned long long)took);
	h_pair_free(&q);
	for (int i = 0; i < nf; i++)
		close(fillers[i]);
	close(hung);
}

/* Issue 53, finding 1, against the library's clients: a listener that
 * registered and closed vouches for nobody. The rogue holds the port in
 * rdma_cm's space, so each server's RDMA listener is elsewhere and only
 * the warden can send clients to it. The first server listens on the
 * port's very address, registers, and goes; a second listens on the
 * wildcard of that port and registers. Its clients reach its listener:
 * the first one's exact entry, which used to outrank a wildcard whatever
 * its age, sent them to a port where nothing listens. */
Test(warden, a_gone_listeners_registration_sends_no_client_astray)
{
	struct pair first;
	uint16_t port = listen_tcp(&first);
	start(true, port);
	first.l = sv_upgrade_listen(first.lfd);
	cr_assert_not_null(first.l);
	for (int i = 0; i < 2000 && sv_warden_table_count(table) == 0; i++)
		usleep(1000);
	cr_assert_eq(sv_warden_table_count(table), 1, "the first server registered");
	sv_upgrade_unlisten(first.l);
	close(first.lfd);

	struct pair p;
	memset(&p, 0, sizeof(p));
	p.cfd = p.sfd = -1;
	p.lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(p.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
	/* The warden's copy of the first listener goes once it took it. */
	int b = -1;
	for (int i = 0; i < 2000 && (b = bind(p.lfd, (struct sockaddr *)&any, sizeof(any))) < 0 &&
			errno == EADDRINUSE;
	     i++)
		usleep(1000);
	cr_assert_eq(b, 0, "%s", strerror(errno));
	cr_assert_eq(listen(p.lfd, 16), 0);
	p.l = sv_upgrade_listen(p.lfd);
	cr_assert_not_null(p.l);
	for (int i = 0; i < 2000 && sv_warden_table_count(table) < 2; i++)
		usleep(1000);
	pair_up(&p, true, port);
	cr_assert_eq(h_wait_state(p.c, SV_CONN_RDMA, 10000), SV_CONN_RDMA, "client: %s (%s)",
		     sv_conn_state_name(h_state(p.c)), sv_fallback_name(h_fallback(p.c)));
	cr_assert_eq(h_wait_state(p.s, SV_CONN_RDMA, 10000), SV_CONN_RDMA);
	cr_assert_eq(atomic_load(&rogue_cm.requests), 0, "the rogue got a request");
	h_exchange(&p, 34, true);
	pair_done(&p);
}
