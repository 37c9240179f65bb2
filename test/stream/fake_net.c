/* The in-process fake of rdma_cm and RC queue pairs: see fake_net.h. */
#include "fake_net.h"
#include "helper.h"

#include "hub.h"
#include "lock.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* One lock for the whole fake: below the streams' locks (it is called with
 * a stream's lock held), and never held while calling into the core. */
static struct sv_lock net_lock = SV_LOCK_INIT(SV_RANK_TRANSPORT);

static unsigned violations;
static char why[256];
static bool no_route;
static bool refuse_moves; /* fake_net_refuse_moves */
/* Credential changes (fake_net_creds_change) and rdma_cm calls refused for
 * them (fake_net_cm_refused). */
static unsigned cred_gen, cm_refused;
static bool any_channel;
static bool change_in_move; /* fake_net_creds_change_in_next_move */
static bool reflect_challenge;
static bool rdma_links; /* fake_net_rdma_links */
static bool fork_keeps; /* fake_net_fork_keeps */
static uint64_t delivered;
static long break_after = -1;
static long refuse_after = -1; /* fake_net_refuse_posts_after */
static enum fake_side hold_side;
static unsigned qps_created;
/* rdma_cm's first use waits for fake_net_start_now() (fake_net_slow_start). */
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t start_cv = PTHREAD_COND_INITIALIZER;
static bool start_gated;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
	if (violations++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, sizeof(why), fmt, ap);
		va_end(ap);
	}
}

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);
	if (!p)
		abort();
	return p;
}

static void notify(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof(one));
	(void)r;
}

static void unnotify(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof(v));
	(void)r;
}

/* ---- Queue pairs ------------------------------------------------------------ */

struct cqe {
	bool send;
	bool flushed;
	uint32_t idx, len;
	struct cqe *next;
};

/* A message sent and not delivered yet (held). */
struct flight {
	uint32_t slot, len;
	uint8_t *bytes;
	struct flight *next;
};

enum qp_state { QP_INIT, QP_RTS, QP_ERR };

struct fqp {
	struct sv_qp q; /* first */
	uint32_t num, nrecv, nsend, buf_size;
	uint32_t start_size;     /* what buffers are before they grow */
	bool rgrown, sgrown;
	uint32_t *rsize;         /* per receive buffer: its size as posted */
	uint8_t *sbig;           /* per send buffer: at buf_size */
	uint8_t *rbuf, *sbuf;
	uint32_t *posted; /* posted receive buffers, oldest first (a ring) */
	uint32_t phead, pcount;
	struct cqe *cq_head, *cq_tail;
	struct flight *fl_head, *fl_tail;
	enum fake_side side;
	bool hold;
	bool armed;
	bool fired;           /* on the channel's list */
	struct fqp *next_fired;
	enum qp_state state;
	struct fqp *peer;
	struct fqp *next; /* every live QP */
};

static struct fqp *qps;
static uint32_t next_qp_num = 100;

/* The fake's completion channel: one for every QP, as a device's is
 * (hub.h). An armed QP's completion puts it on the list and makes the
 * eventfd readable. */
static struct {
	struct sv_hub_chan hc;
	bool added;
	struct fqp *fired;
} chan = {.hc.fd = -1};

/* With net_lock. */
static void fire(struct fqp *f)
{
	f->armed = false;
	if (f->fired)
		return;
	f->fired = true;
	f->next_fired = chan.fired;
	chan.fired = f;
	notify(chan.hc.fd);
}

/* Under the hub's lock (below net_lock's rank: taken inside it). */
static void chan_drain(struct sv_hub_chan *c)
{
	sv_lock(&net_lock);
	unnotify(c->fd);
	while (chan.fired) {
		struct fqp *f = chan.fired;
		chan.fired = f->next_fired;
		f->fired = false;
		if (f->q.node)
			sv_hub_fire(f->q.node);
	}
	sv_unlock(&net_lock);
}

/* The channel, made and given to the hub at the first QP (not under
 * net_lock: the hub's lock ranks below it). */
static pthread_mutex_t chan_mu = PTHREAD_MUTEX_INITIALIZER;

static void chan_open(void)
{
	pthread_mutex_lock(&chan_mu);
	if (!chan.added) {
		chan.hc.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		chan.hc.drain = chan_drain;
		if (chan.hc.fd < 0 || sv_hub_chan_add(&chan.hc) < 0)
			abort();
		chan.added = true;
	}
	pthread_mutex_unlock(&chan_mu);
}

static struct fqp *of(const struct sv_qp *q)
{
	return (struct fqp *)q;
}

static void push_cqe(struct fqp *f, bool send, bool flushed, uint32_t idx, uint32_t len)
{
	struct cqe *c = xcalloc(1, sizeof(*c));
	*c = (struct cqe){.send = send, .flushed = flushed, .idx = idx, .len = len};
	if (f->cq_tail)
		f->cq_tail->next = c;
	else
		f->cq_head = c;
	f->cq_tail = c;
	if (f->armed)
		fire(f);
}

/* Into the error state: the posted receives and the sends in flight come
 * back flushed. With net_lock. */
static void qp_error(struct fqp *f)
{
	if (f->state == QP_ERR)
		return;
	f->state = QP_ERR;
	while (f->pcount) {
		push_cqe(f, false, true, f->posted[f->phead], 0);
		f->phead = (f->phead + 1) % f->nrecv;
		f->pcount--;
	}
	while (f->fl_head) {
		struct flight *m = f->fl_head;
		f->fl_head = m->next;
		push_cqe(f, true, true, m->slot, 0);
		free(m->bytes);
		free(m);
	}
	f->fl_tail = NULL;
}

static void break_pair(struct fqp *f);

/* A message reaches the peer: into its oldest posted buffer. With
 * net_lock. */
static void deliver(struct fqp *f, uint32_t slot, const uint8_t *bytes, uint32_t len)
{
	struct fqp *p = f->peer;
	if (!p || p->state != QP_RTS || f->state != QP_RTS) {
		push_cqe(f, true, true, slot, 0); /* the link is gone: lost */
		return;
	}
	if (!p->pcount) {
		violation("QP %u sent into QP %u, which had no receive posted", f->num, p->num);
		push_cqe(f, true, true, slot, 0);
		return;
	}
	uint32_t b = p->posted[p->phead];
	if (len > p->rsize[b]) {
		violation("QP %u sent %u bytes into QP %u's %u-byte buffer", f->num, len, p->num,
			  p->rsize[b]);
		push_cqe(f, true, true, slot, 0);
		return;
	}
	p->phead = (p->phead + 1) % p->nrecv;
	p->pcount--;
	memcpy(p->rbuf + (size_t)b * p->buf_size, bytes, len);
	push_cqe(p, false, false, b, len);
	push_cqe(f, true, false, slot, len);
	delivered++;
	if (refuse_after > 0)
		refuse_after--;
	if (break_after > 0 && --break_after == 0)
		break_pair(f);
}

static int q_post_recv(void *ctx, uint32_t i, bool big)
{
	struct fqp *f = ctx;
	sv_lock(&net_lock);
	int r = 0;
	if (i >= f->nrecv) {
		violation("QP %u: post_recv(%u) of %u", f->num, i, f->nrecv);
		r = -EINVAL;
	} else if (f->state == QP_ERR) {
		push_cqe(f, false, true, i, 0);
	} else if (big && !f->rgrown) {
		violation("QP %u: post_recv(%u) at buf_size before grow(recv)", f->num, i);
		r = -EINVAL;
	} else {
		f->rsize[i] = big ? f->buf_size : f->start_size;
		f->posted[(f->phead + f->pcount) % f->nrecv] = i;
		f->pcount++;
	}
	sv_unlock(&net_lock);
	return r;
}

static int q_post_send(void *ctx, uint32_t slot, uint32_t len, const struct iovec *iov,
		       int iovcnt)
{
	struct fqp *f = ctx;
	size_t total = len;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	if (slot >= f->nsend || len > (f->sbig[slot] ? f->buf_size : f->start_size)) {
		violation("QP %u: post_send slot %u, %zu bytes", f->num, slot, total);
		return -EINVAL;
	}
	/* What the hardware reads: the header and payload in the send buffer,
	 * then the application's memory (zero copy). */
	uint8_t *bytes = malloc(total);
	if (!bytes)
		return -ENOMEM;
	memcpy(bytes, f->sbuf + (size_t)slot * f->buf_size, len);
	size_t off = len;
	for (int i = 0; i < iovcnt; i++) {
		memcpy(bytes + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	sv_lock(&net_lock);
	int r = 0;
	if (f->state == QP_INIT) {
		r = -EINVAL; /* as ibv_post_send before RTS */
	} else if (refuse_after == 0) {
		r = -EACCES; /* nothing sent; the QP stays as it is */
	} else if (f->state == QP_ERR) {
		push_cqe(f, true, true, slot, 0);
	} else if (break_after == 0) {
		break_pair(f);
		push_cqe(f, true, true, slot, 0);
	} else if (f->hold) {
		struct flight *m = xcalloc(1, sizeof(*m));
		*m = (struct flight){.slot = slot, .len = (uint32_t)total, .bytes = bytes};
		bytes = NULL;
		if (f->fl_tail)
			f->fl_tail->next = m;
		else
			f->fl_head = m;
		f->fl_tail = m;
	} else {
		deliver(f, slot, bytes, (uint32_t)total);
	}
	sv_unlock(&net_lock);
	free(bytes);
	return r;
}

static void *q_recv_buf(void *ctx, uint32_t i)
{
	struct fqp *f = ctx;
	return f->rbuf + (size_t)(i < f->nrecv ? i : 0) * f->buf_size;
}

static void *q_send_buf(void *ctx, uint32_t i)
{
	struct fqp *f = ctx;
	return f->sbuf + (size_t)(i < f->nsend ? i : 0) * f->buf_size;
}

static unsigned grows_done;

static int q_grow(void *ctx, bool recv)
{
	struct fqp *f = ctx;
	sv_lock(&net_lock);
	if (recv ? f->rgrown : f->sgrown)
		violation("QP %u: grow(%d) twice", f->num, recv);
	*(recv ? &f->rgrown : &f->sgrown) = true;
	grows_done++;
	sv_unlock(&net_lock);
	return 0;
}

static void q_send_big(void *ctx, uint32_t slot)
{
	struct fqp *f = ctx;
	if (!f->sgrown || slot >= f->nsend)
		violation("QP %u: send_big(%u) before grow(send)", f->num, slot);
	else
		f->sbig[slot] = 1;
}

static unsigned shrinks_done;

static void q_shrink(void *ctx, bool recv)
{
	struct fqp *f = ctx;
	sv_lock(&net_lock);
	if (!(recv ? f->rgrown : f->sgrown))
		violation("QP %u: shrink(%d) before grow", f->num, recv);
	if (recv) {
		for (uint32_t i = 0; i < f->nrecv; i++)
			if (f->rsize[i] == f->buf_size)
				violation("QP %u: shrink(recv) with buffer %u at buf_size", f->num, i);
		f->rgrown = false;
	} else {
		memset(f->sbig, 0, f->nsend);
		f->sgrown = false;
	}
	shrinks_done++;
	sv_unlock(&net_lock);
}

unsigned fake_net_shrinks(void)
{
	sv_lock(&net_lock);
	unsigned n = shrinks_done;
	sv_unlock(&net_lock);
	return n;
}

unsigned fake_net_grows(void)
{
	sv_lock(&net_lock);
	unsigned n = grows_done;
	sv_unlock(&net_lock);
	return n;
}

static const struct sv_xport_ops xport_ops = {
	.recv_buf = q_recv_buf,
	.send_buf = q_send_buf,
	.post_recv = q_post_recv,
	.post_send = q_post_send,
	.grow = q_grow,
	.send_big = q_send_big,
	.shrink = q_shrink,
};

static struct sv_xport q_xport(struct sv_qp *q)
{
	return (struct sv_xport){.ops = &xport_ops, .ctx = of(q)};
}

/* As the verbs transport: a flushed work request is the expected
 * aftermath of a break or the normal end, anything else fails the core. */
static int q_poll(struct sv_qp *q, struct sv_proto *p, struct sv_clock *clk)
{
	struct fqp *f = of(q);
	int n = 0, err = 0;
	for (;;) {
		sv_lock(&net_lock);
		struct cqe *c = f->cq_head;
		if (c) {
			f->cq_head = c->next;
			if (!f->cq_head)
				f->cq_tail = NULL;
		}
		sv_unlock(&net_lock);
		if (!c)
			break;
		int r = 0;
		if (c->flushed && !sv_proto_flush_is_end(p))
			r = sv_proto_abort(p, -ECONNRESET);
		if (c->send) {
			int s = sv_proto_on_send_done(p, c->idx, clk);
			r = r ? r : s;
		} else if (!c->flushed) {
			r = sv_proto_on_recv(p, c->idx, c->len, clk);
		}
		free(c);
		n++;
		if (r < 0 && !err)
			err = r;
	}
	return err ? err : n;
}

static int q_arm(struct sv_qp *q)
{
	struct fqp *f = of(q);
	sv_lock(&net_lock);
	f->armed = true;
	if (f->cq_head) /* as a CQ armed with entries in it: an event at the next one */
		fire(f);
	sv_unlock(&net_lock);
	return 0;
}

static uint32_t q_num(const struct sv_qp *q)
{
	return of(q)->num;
}

static int q_connected(struct sv_qp *q)
{
	struct fqp *f = of(q);
	sv_lock(&net_lock);
	if (f->state == QP_INIT)
		f->state = QP_RTS;
	sv_unlock(&net_lock);
	return 0;
}

static void q_to_error(struct sv_qp *q)
{
	sv_lock(&net_lock);
	qp_error(of(q));
	sv_unlock(&net_lock);
}

static void q_destroy(struct sv_qp *q)
{
	struct fqp *f = of(q);
	sv_lock(&net_lock);
	for (struct fqp **pp = &qps; *pp; pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	}
	if (f->peer)
		f->peer->peer = NULL;
	for (struct fqp **pp = &chan.fired; *pp; pp = &(*pp)->next_fired) {
		if (*pp == f) {
			*pp = f->next_fired;
			break;
		}
	}
	sv_unlock(&net_lock);
	while (f->cq_head) {
		struct cqe *c = f->cq_head;
		f->cq_head = c->next;
		free(c);
	}
	while (f->fl_head) {
		struct flight *m = f->fl_head;
		f->fl_head = m->next;
		free(m->bytes);
		free(m);
	}
	free(f->rbuf);
	free(f->sbuf);
	free(f->posted);
	free(f->rsize);
	free(f->sbig);
	free(f);
}

/* What a held send carries: its DATA's payload (the header is first). */
static uint64_t q_data_in_flight(const struct sv_qp *q)
{
	const struct fqp *f = (const struct fqp *)q;
	uint64_t n = 0;
	sv_lock(&net_lock);
	for (struct flight *m = f->fl_head; m; m = m->next) {
		struct sv_hdr h;
		sv_hdr_decode(m->bytes, &h);
		n += h.type == SV_MSG_DATA ? h.len : 0;
	}
	sv_unlock(&net_lock);
	return n;
}

static const struct sv_qp_ops qp_ops = {
	.xport = q_xport,
	.poll_cq = q_poll,
	.arm = q_arm,
	.num = q_num,
	.connected = q_connected,
	.to_error = q_to_error,
	.destroy = q_destroy,
	.data_in_flight = q_data_in_flight,
};

/* ---- rdma_cm ---------------------------------------------------------------- */

struct fid {
	struct rdma_cm_id id; /* first */
	struct sockaddr_storage src, dst; /* this end's address, the peer's */
	bool listening;
	bool afonly; /* an IPv6 listener that takes no IPv4 request */
	bool connected, disconnected;
	struct fid *peer;       /* the other end of a connection */
	struct fid *listener;   /* a request's: the listener it came to */
	uint32_t qp_num;
	uint8_t req_pd[64];     /* a connect's private data, as sent */
	uint8_t req_len;
	bool destroyed;
	struct fid *next;       /* every id (never freed: events may name them) */
};

struct fev {
	struct rdma_cm_event ev; /* first */
	uint8_t pd[256];
	struct fev *next;
};

struct fchan {
	struct rdma_event_channel ch; /* first */
	struct fev *head, *tail;
	unsigned gen;     /* the credential change it was opened after */
	pthread_t opener; /* and by whom */
	struct fchan *dead_next; /* closed ones, on `dead_chans` */
};

/* Closed channels: their memory stays reachable (an id never moved would
 * still name its channel), and is never given back. */
static struct fchan *dead_chans;

/* Would the kernel let this thread write to c (ib_safe_file_access)? Until
 * the first change every thread shares the credentials that opened it;
 * after one, each thread has credentials of its own, and a file opened
 * since is writable by its opener alone, until the next change. With
 * net_lock; a refusal sets errno and counts. */
static bool chan_ok(const struct fchan *c)
{
	bool opener = pthread_equal(c->opener, pthread_self());
	if (c->gen == cred_gen && (cred_gen == 0 || opener))
		return true;
	/* Only the helper may call rdma_cm after a change: another thread's
	 * call is a defect. The helper's own call on a channel a newer change
	 * made stale is the race every change starts; it tries again. */
	if (cred_gen > 0 && !opener)
		cm_refused++;
	errno = EACCES;
	return false;
}

static bool id_ok(struct rdma_cm_id *id)
{
	return chan_ok((const struct fchan *)id->channel);
}

/* The write every rdma_cm call on id is: refused, the call fails. */
#define CHECK_ID(id)                                                                        \
	do {                                                                                \
		sv_lock(&net_lock);                                                         \
		bool ok_ = id_ok(id);                                                       \
		sv_unlock(&net_lock);                                                       \
		if (!ok_)                                                                   \
			return -1;                                                          \
	} while (0)

static struct fid *ids;

static struct fqp *qp_by_num(uint32_t num)
{
	for (struct fqp *f = qps; f; f = f->next)
		if (f->num == num)
			return f;
	return NULL;
}

static uint16_t port_of(const struct sockaddr_storage *a)
{
	return a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)a)->sin6_port
					: ((const struct sockaddr_in *)a)->sin_port;
}

/* An event for id, on its channel. With net_lock. */
static void queue_event(struct fid *id, enum rdma_cm_event_type type, int status,
			struct fid *listen, const void *pd, size_t len)
{
	struct fchan *c = (struct fchan *)id->id.channel;
	struct fev *e = xcalloc(1, sizeof(*e));
	e->ev.id = &id->id;
	e->ev.listen_id = listen ? &listen->id : NULL;
	e->ev.event = type;
	e->ev.status = status;
	if (pd && len) {
		if (len > sizeof(e->pd))
			len = sizeof(e->pd);
		memcpy(e->pd, pd, len);
		e->ev.param.conn.private_data = e->pd;
		e->ev.param.conn.private_data_len = (uint8_t)len;
	}
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	notify(c->ch.fd);
}

static struct rdma_event_channel *f_create_event_channel(void)
{
	pthread_mutex_lock(&start_mu);
	while (start_gated)
		pthread_cond_wait(&start_cv, &start_mu);
	pthread_mutex_unlock(&start_mu);
	struct fchan *c = xcalloc(1, sizeof(*c));
	c->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	sv_lock(&net_lock);
	c->gen = cred_gen;
	c->opener = pthread_self();
	any_channel = true;
	sv_unlock(&net_lock);
	return &c->ch;
}

/* Its memory stays: an id never moved would still name it. */
static void f_destroy_event_channel(struct rdma_event_channel *ch)
{
	sv_lock(&net_lock);
	close(ch->fd);
	ch->fd = -1;
	((struct fchan *)ch)->dead_next = dead_chans;
	dead_chans = (struct fchan *)ch;
	sv_unlock(&net_lock);
}

/* rdma_migrate_id for every id not destroyed: a write to the new channel,
 * the old one's events going with their id. */
static int f_move_ids(struct rdma_event_channel *ch)
{
	struct fchan *to = (struct fchan *)ch;
	sv_lock(&net_lock);
	if (change_in_move) {
		change_in_move = false;
		cred_gen++; /* the kernel's part only: the library hears of it later */
	}
	if (!chan_ok(to) || refuse_moves) {
		if (refuse_moves)
			errno = EACCES;
		sv_unlock(&net_lock);
		return -1;
	}
	for (struct fid *f = ids; f; f = f->next) {
		struct fchan *from = (struct fchan *)f->id.channel;
		if (f->destroyed || from == to)
			continue;
		f->id.channel = ch;
		for (struct fev **pe = &from->head, *prev = NULL; *pe;) {
			struct fev *e = *pe;
			if (e->ev.id != &f->id) {
				prev = e;
				pe = &e->next;
				continue;
			}
			*pe = e->next;
			if (from->tail == e)
				from->tail = prev;
			e->next = NULL;
			if (to->tail)
				to->tail->next = e;
			else
				to->head = e;
			to->tail = e;
			notify(to->ch.fd);
			if (from->ch.fd >= 0)
				unnotify(from->ch.fd);
		}
	}
	sv_unlock(&net_lock);
	return 0;
}

static int f_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **out, void *ctx,
		       enum rdma_port_space ps)
{
	sv_lock(&net_lock);
	if (!chan_ok((struct fchan *)ch)) {
		sv_unlock(&net_lock);
		return -1;
	}
	sv_unlock(&net_lock);
	struct fid *f = xcalloc(1, sizeof(*f));
	f->id.channel = ch;
	f->id.context = ctx;
	f->id.ps = ps;
	sv_lock(&net_lock);
	f->next = ids;
	ids = f;
	sv_unlock(&net_lock);
	*out = &f->id;
	return 0;
}

static int f_destroy_id(struct rdma_cm_id *id)
{
	struct fid *f = (struct fid *)id;
	sv_lock(&net_lock);
	if (!id_ok(id)) { /* librdmacm returns before freeing anything */
		sv_unlock(&net_lock);
		return -1;
	}
	f->destroyed = true;
	f->listening = false;
	f->id.context = NULL;
	if (f->peer)
		f->peer->peer = NULL;
	f->peer = NULL;
	sv_unlock(&net_lock);
	return 0;
}

static bool v4mapped(const struct sockaddr *a)
{
	return a->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr);
}

static int f_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
			  int timeout_ms)
{
	CHECK_ID(id);
	(void)timeout_ms;
	struct fid *f = (struct fid *)id;
	size_t len = dst->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						: sizeof(struct sockaddr_in);
	if (v4mapped(src) || v4mapped(dst)) {
		errno = EADDRNOTAVAIL; /* rdma_cm has no route to such an address */
		return -1;
	}
	sv_lock(&net_lock);
	memcpy(&f->src, src, len);
	memcpy(&f->dst, dst, len);
	queue_event(f, no_route ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED,
		    no_route ? -EHOSTUNREACH : 0, NULL, NULL, 0);
	sv_unlock(&net_lock);
	return 0;
}

static int f_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	CHECK_ID(id);
	(void)timeout_ms;
	sv_lock(&net_lock);
	queue_event((struct fid *)id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, NULL, 0);
	sv_unlock(&net_lock);
	return 0;
}

static bool any_addr(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == INADDR_ANY;
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* As rdma_cm matches a request to a listener: the same port, and the
 * listener's address the same or its family's wildcard; an IPv6 wildcard
 * that is not afonly takes IPv4 requests too. Nothing else crosses
 * families: rdma_cm cannot bind an IPv4-mapped IPv6 address. */
static bool addr_match(const struct fid *listen, const struct sockaddr_storage *dst)
{
	const struct sockaddr_storage *l = &listen->src;
	if (port_of(l) != port_of(dst))
		return false;
	if (l->ss_family != dst->ss_family)
		return l->ss_family == AF_INET6 && !listen->afonly && any_addr(l);
	if (any_addr(l))
		return true;
	if (l->ss_family == AF_INET)
		return ((const struct sockaddr_in *)l)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)dst)->sin_addr.s_addr;
	return IN6_ARE_ADDR_EQUAL(&((const struct sockaddr_in6 *)l)->sin6_addr,
				  &((const struct sockaddr_in6 *)dst)->sin6_addr);
}

static int f_connect(struct rdma_cm_id *id, struct rdma_conn_param *cp)
{
	CHECK_ID(id);
	struct fid *f = (struct fid *)id;
	sv_lock(&net_lock);
	f->qp_num = cp->qp_num;
	f->req_len = cp->private_data_len < sizeof(f->req_pd) ? cp->private_data_len
							       : (uint8_t)sizeof(f->req_pd);
	memcpy(f->req_pd, cp->private_data, f->req_len);
	struct fid *l = ids;
	while (l && !(l->listening && addr_match(l, &f->dst)))
		l = l->next;
	if (!l) {
		queue_event(f, RDMA_CM_EVENT_REJECTED, 8, NULL, NULL, 0); /* invalid service ID */
		sv_unlock(&net_lock);
		return 0;
	}
	struct fid *r = xcalloc(1, sizeof(*r));
	r->id.channel = l->id.channel;
	r->id.context = l->id.context;
	r->id.ps = l->id.ps;
	r->src = f->dst;
	r->dst = f->src;
	r->listener = l;
	r->peer = f;
	f->peer = r;
	r->next = ids;
	ids = r;
	queue_event(r, RDMA_CM_EVENT_CONNECT_REQUEST, 0, l, cp->private_data,
		    cp->private_data_len);
	sv_unlock(&net_lock);
	return 0;
}

static int f_accept(struct rdma_cm_id *id, struct rdma_conn_param *cp)
{
	CHECK_ID(id);
	struct fid *r = (struct fid *)id;
	sv_lock(&net_lock);
	struct fid *c = r->peer;
	r->qp_num = cp->qp_num;
	struct fqp *sq = qp_by_num(r->qp_num), *cq = c ? qp_by_num(c->qp_num) : NULL;
	if (!c || !sq || !cq) {
		sv_unlock(&net_lock);
		errno = EINVAL;
		return -1;
	}
	sq->peer = cq;
	cq->peer = sq;
	uint8_t pd[64];
	uint8_t len = cp->private_data_len < sizeof(pd) ? cp->private_data_len : (uint8_t)sizeof(pd);
	memcpy(pd, cp->private_data, len);
	/* The reply's challenge (offset 12) made the request's (offset 16):
	 * docs/protocol.md, section 3. */
	if (reflect_challenge && len >= 20 && c->req_len >= 24)
		memcpy(pd + 12, c->req_pd + 16, 8);
	queue_event(c, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, NULL, pd, len);
	sv_unlock(&net_lock);
	return 0;
}

static int f_reject(struct rdma_cm_id *id, const void *pd, uint8_t len)
{
	CHECK_ID(id);
	struct fid *r = (struct fid *)id;
	sv_lock(&net_lock);
	if (r->peer)
		queue_event(r->peer, RDMA_CM_EVENT_REJECTED, 28, NULL, pd, len); /* the consumer's */
	sv_unlock(&net_lock);
	return 0;
}

static int f_establish(struct rdma_cm_id *id)
{
	CHECK_ID(id);
	struct fid *c = (struct fid *)id;
	sv_lock(&net_lock);
	c->connected = true;
	if (c->peer) {
		c->peer->connected = true;
		queue_event(c->peer, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, NULL, 0);
	}
	sv_unlock(&net_lock);
	return 0;
}

/* Both ends hear of it once. With net_lock. */
static void disconnect_ids(struct fid *f)
{
	struct fid *p = f->peer;
	if (!f->disconnected && f->connected) {
		f->disconnected = true;
		queue_event(f, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL, 0);
	}
	if (p && !p->disconnected && p->connected) {
		p->disconnected = true;
		queue_event(p, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL, 0);
	}
}

static bool lost_device_of(const struct fid *f);

static int f_disconnect(struct rdma_cm_id *id)
{
	CHECK_ID(id);
	sv_lock(&net_lock);
	if (lost_device_of((struct fid *)id)) {
		sv_unlock(&net_lock);
		return 0;
	}
	disconnect_ids((struct fid *)id);
	sv_unlock(&net_lock);
	return 0;
}

static int f_set_afonly(struct rdma_cm_id *id, int afonly)
{
	CHECK_ID(id);
	((struct fid *)id)->afonly = afonly != 0;
	return 0;
}

static int f_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	CHECK_ID(id);
	static uint16_t next_port = 50000; /* rdma_cm's own port space */
	struct fid *f = (struct fid *)id;
	if (v4mapped(addr)) {
		errno = EADDRNOTAVAIL; /* as rdma_cm: no device has such an address */
		return -1;
	}
	memcpy(&f->src, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							  : sizeof(struct sockaddr_in));
	sv_lock(&net_lock);
	/* As rdma_cm: a port one id holds is not another's. */
	for (struct fid *i = ids; port_of(&f->src) && i; i = i->next) {
		if (i != f && port_of(&i->src) == port_of(&f->src) &&
		    (addr_match(i, &f->src) || addr_match(f, &i->src))) {
			sv_unlock(&net_lock);
			memset(&f->src, 0, sizeof(f->src));
			errno = EADDRINUSE;
			return -1;
		}
	}
	if (port_of(&f->src) == 0) {
		uint16_t port = htons(next_port++);
		if (f->src.ss_family == AF_INET6)
			((struct sockaddr_in6 *)&f->src)->sin6_port = port;
		else
			((struct sockaddr_in *)&f->src)->sin_port = port;
	}
	sv_unlock(&net_lock);
	return 0;
}

static struct sockaddr *f_local_addr(struct rdma_cm_id *id)
{
	return (struct sockaddr *)&((struct fid *)id)->src;
}

static int f_listen(struct rdma_cm_id *id, int backlog)
{
	CHECK_ID(id);
	(void)backlog;
	sv_lock(&net_lock);
	((struct fid *)id)->listening = true;
	sv_unlock(&net_lock);
	return 0;
}

static int f_get_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev)
{
	struct fchan *c = (struct fchan *)ch;
	sv_lock(&net_lock);
	if (!chan_ok(c)) {
		/* The kernel's ucma refuses the read; the events stay queued
		 * and the channel's fd readable. */
		sv_unlock(&net_lock);
		return -1;
	}
	struct fev *e = c->head;
	if (e) {
		c->head = e->next;
		if (!c->head) {
			c->tail = NULL;
			unnotify(c->ch.fd);
		}
	}
	sv_unlock(&net_lock);
	if (!e) {
		errno = EAGAIN;
		return -1;
	}
	*ev = &e->ev;
	return 0;
}

static int f_ack_event(struct rdma_cm_event *ev)
{
	free(ev);
	return 0;
}

static struct sockaddr *f_peer_addr(struct rdma_cm_id *id)
{
	return (struct sockaddr *)&((struct fid *)id)->dst;
}

static int f_create_qp(struct sv_qp **out, struct rdma_cm_id *id,
		       const struct sv_proto_params *prm)
{
	struct fid *fi = (struct fid *)id;
	sv_lock(&net_lock);
	bool ok = id_ok(id); /* rdma_init_qp_attr */
	sv_unlock(&net_lock);
	if (!ok)
		return -EACCES;
	struct fqp *f = xcalloc(1, sizeof(*f));
	f->q.ops = &qp_ops;
	f->nrecv = sv_proto_nrecv(prm);
	f->nsend = sv_proto_nsend(prm);
	f->buf_size = prm->buf_size;
	f->start_size = sv_proto_start_size(prm);
	f->rgrown = f->sgrown = f->start_size == f->buf_size;
	f->rbuf = xcalloc(f->nrecv, f->buf_size);
	f->sbuf = xcalloc(f->nsend, f->buf_size);
	f->posted = xcalloc(f->nrecv, sizeof(*f->posted));
	f->rsize = xcalloc(f->nrecv, sizeof(*f->rsize));
	f->sbig = xcalloc(f->nsend, 1);
	memset(f->sbig, f->sgrown, f->nsend);
	chan_open();
	sv_lock(&net_lock);
	f->num = next_qp_num++;
	f->side = fi->listener ? FAKE_SERVER : FAKE_CLIENT;
	f->hold = hold_side == f->side;
	f->next = qps;
	qps = f;
	qps_created++;
	sv_unlock(&net_lock);
	*out = &f->q;
	return 0;
}

static void f_atfork_child(void)
{
	/* The parent's connections are the parent's: the child starts with
	 * none (their memory stays, unused). */
	sv_lock_reinit(&net_lock);
	qps = NULL;
	ids = NULL;
	/* The channel's eventfd is shared with the parent: a new one, given
	 * to the child's hub (which forgot the parent's) at the next QP. */
	if (chan.hc.fd >= 0)
		close(chan.hc.fd);
	chan.hc.fd = -1;
	chan.added = false;
	chan.fired = NULL;
	pthread_mutex_init(&chan_mu, NULL);
}

static bool f_on_rdma_link(const struct sockaddr_storage *local, const struct sockaddr_storage *peer)
{
	(void)local;
	(void)peer;
	return rdma_links;
}

/* The fake QPs are plain memory of the process that made them: a fork's
 * child gets a copy it never uses, and the parent's stay as they were. */
static bool f_fork_keeps_qp(void)
{
	return fork_keeps;
}

static const struct sv_cm_ops fake_ops = {
	.create_event_channel = f_create_event_channel,
	.destroy_event_channel = f_destroy_event_channel,
	.move_ids = f_move_ids,
	.create_id = f_create_id,
	.destroy_id = f_destroy_id,
	.resolve_addr = f_resolve_addr,
	.resolve_route = f_resolve_route,
	.connect_id = f_connect,
	.accept_id = f_accept,
	.reject = f_reject,
	.establish = f_establish,
	.disconnect = f_disconnect,
	.bind_addr = f_bind_addr,
	.set_afonly = f_set_afonly,
	.listen_id = f_listen,
	.get_event = f_get_event,
	.ack_event = f_ack_event,
	.peer_addr = f_peer_addr,
	.local_addr = f_local_addr,
	.create_qp = f_create_qp,
	.on_rdma_link = f_on_rdma_link,
	.fork_keeps_qp = f_fork_keeps_qp,
	.atfork_child = f_atfork_child,
};

/* ---- The tests' controls ------------------------------------------------------- */

static void break_pair(struct fqp *f)
{
	struct fqp *p = f->peer;
	qp_error(f);
	if (p)
		qp_error(p);
	for (struct fid *i = ids; i; i = i->next)
		if (i->qp_num == f->num || (p && i->qp_num == p->num))
			disconnect_ids(i);
	break_after = -1;
}

void fake_net_break_all(void)
{
	sv_lock(&net_lock);
	for (struct fqp *f = qps; f; f = f->next)
		if (f->peer && f->state != QP_ERR)
			break_pair(f);
	sv_unlock(&net_lock);
}

/* One side's device goes: its QPs are in the error state, only its ids
 * hear of it, and its later disconnects reach nobody (the peer's QP stays
 * up, as when the DREQ cannot be sent). */
static bool device_lost[3];

/* With net_lock. */
static bool lost_device_of(const struct fid *f)
{
	for (struct fqp *q = qps; q; q = q->next)
		if (q->num == f->qp_num)
			return device_lost[q->side];
	return false;
}

void fake_net_lose_device(enum fake_side side)
{
	sv_lock(&net_lock);
	device_lost[side] = true;
	for (struct fqp *f = qps; f; f = f->next) {
		if (f->side != side || f->state == QP_ERR)
			continue;
		qp_error(f);
		for (struct fid *i = ids; i; i = i->next) {
			if (i->qp_num == f->num && i->connected && !i->disconnected) {
				i->disconnected = true;
				queue_event(i, RDMA_CM_EVENT_DEVICE_REMOVAL, 0, NULL, NULL, 0);
			}
		}
	}
	sv_unlock(&net_lock);
}

void fake_net_use(void)
{
	sv_lock(&net_lock);
	violations = 0;
	why[0] = '\0';
	no_route = false;
	refuse_moves = false;
	cm_refused = 0;
	cred_gen = 0;
	any_channel = false;
	change_in_move = false;
	reflect_challenge = false;
	rdma_links = false;
	fork_keeps = false;
	break_after = -1;
	refuse_after = -1;
	hold_side = FAKE_NONE;
	device_lost[FAKE_CLIENT] = device_lost[FAKE_SERVER] = false;
	sv_unlock(&net_lock);
	fake_net_start_now();
	sv_cm_use(&fake_ops);
}

unsigned fake_net_violations(void)
{
	return violations;
}

const char *fake_net_why(void)
{
	return why;
}

void fake_net_fork_keeps(bool on)
{
	fork_keeps = on;
}

void fake_net_rdma_links(bool on)
{
	rdma_links = on;
}

void fake_net_slow_start(void)
{
	pthread_mutex_lock(&start_mu);
	start_gated = true;
	pthread_mutex_unlock(&start_mu);
}

bool fake_net_start_held(void)
{
	pthread_mutex_lock(&start_mu);
	bool held = start_gated;
	pthread_mutex_unlock(&start_mu);
	return held;
}

void fake_net_start_now(void)
{
	pthread_mutex_lock(&start_mu);
	start_gated = false;
	pthread_cond_broadcast(&start_cv);
	pthread_mutex_unlock(&start_mu);
}

void fake_net_creds_change(void)
{
	sv_lock(&net_lock);
	/* Threads made after a change share their maker's credentials: with
	 * no channel open yet, nothing is refused later. */
	if (any_channel)
		cred_gen++;
	sv_unlock(&net_lock);
	sv_helper_creds_changed("a test");
}

void fake_net_creds_change_in_next_move(void)
{
	sv_lock(&net_lock);
	change_in_move = true;
	sv_unlock(&net_lock);
}



void fake_net_refuse_moves(bool on)
{
	sv_lock(&net_lock);
	refuse_moves = on;
	sv_unlock(&net_lock);
}

unsigned fake_net_live_ids(void)
{
	unsigned n = 0;
	sv_lock(&net_lock);
	for (struct fid *f = ids; f; f = f->next)
		n += !f->destroyed;
	sv_unlock(&net_lock);
	return n;
}

unsigned fake_net_cm_refused(void)
{
	sv_lock(&net_lock);
	unsigned n = cm_refused;
	sv_unlock(&net_lock);
	return n;
}

void fake_net_no_route(bool on)
{
	sv_lock(&net_lock);
	no_route = on;
	sv_unlock(&net_lock);
}

uint64_t fake_net_delivered(void)
{
	sv_lock(&net_lock);
	uint64_t n = delivered;
	sv_unlock(&net_lock);
	return n;
}

void fake_net_refuse_posts_after(long n)
{
	sv_lock(&net_lock);
	refuse_after = n;
	sv_unlock(&net_lock);
}

void fake_net_break_after(long n)
{
	sv_lock(&net_lock);
	break_after = n;
	sv_unlock(&net_lock);
}

void fake_net_reflect_challenge(bool on)
{
	sv_lock(&net_lock);
	reflect_challenge = on;
	sv_unlock(&net_lock);
}

void fake_net_hold(enum fake_side side)
{
	sv_lock(&net_lock);
	hold_side = side;
	for (struct fqp *f = qps; f; f = f->next)
		f->hold = f->side == side;
	sv_unlock(&net_lock);
}

void fake_net_release(void)
{
	sv_lock(&net_lock);
	hold_side = FAKE_NONE;
	for (struct fqp *f = qps; f; f = f->next) {
		f->hold = false;
		while (f->fl_head) {
			struct flight *m = f->fl_head;
			f->fl_head = m->next;
			deliver(f, m->slot, m->bytes, m->len);
			free(m->bytes);
			free(m);
		}
		f->fl_tail = NULL;
	}
	sv_unlock(&net_lock);
}

unsigned fake_net_in_flight(void)
{
	unsigned n = 0;
	sv_lock(&net_lock);
	for (struct fqp *f = qps; f; f = f->next)
		for (struct flight *m = f->fl_head; m; m = m->next)
			n++;
	sv_unlock(&net_lock);
	return n;
}

unsigned fake_net_qps_created(void)
{
	return qps_created;
}

/* Review: one side's QPs fail as on a link that went down (retries
 * exhausted): the error state and flushed completions, and no rdma_cm
 * event at all (the DREQ could not be sent either). */
void fake_net_qp_error_quiet(enum fake_side side)
{
	sv_lock(&net_lock);
	for (struct fqp *f = qps; f; f = f->next)
		if (f->side == side && f->state != QP_ERR)
			qp_error(f);
	sv_unlock(&net_lock);
}
