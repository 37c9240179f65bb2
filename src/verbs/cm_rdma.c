/* The connection manager the library uses: librdmacm, and a verbs QP on
 * libsovia's own device context for each connection (verbs.c). */
#include "cm.h"

#include "links.h"
#include "ownfd.h"
#include "verbs.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/* librdmacm keeps process-wide state under its own mutex (its device list,
 * each device's protection domain as ids come and go: every id that binds,
 * resolves, gets a connect request or is destroyed takes it). A fork while
 * another thread holds it (the helper answers a connect request while a
 * prefork server forks its workers) would leave it held in the child for
 * ever, and the child's first upgrade would wait on it for ever. So every
 * librdmacm call is made under a read lock that a fork takes for writing
 * (pthread_atfork): the fork waits for the calls in flight, none of which
 * blocks (the event channel is non-blocking). */
static pthread_rwlock_t calls = PTHREAD_RWLOCK_INITIALIZER;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT; /* kept across forks */

static void fork_prepare(void)
{
	pthread_rwlock_wrlock(&calls);
}

static void fork_parent(void)
{
	pthread_rwlock_unlock(&calls);
}

static void fork_child(void)
{
	/* The writer is the forking thread, under another thread id here
	 * (an unlock would count it a reader's): the only thread starts
	 * with a free lock. */
	pthread_rwlock_init(&calls, NULL);
}

static void guard_install(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void sv_cm_calls_enter(void)
{
	pthread_once(&guard_once, guard_install);
	pthread_rwlock_rdlock(&calls);
}

void sv_cm_calls_leave(void)
{
	int saved = errno;
	pthread_rwlock_unlock(&calls);
	errno = saved;
}

/* librdmacm opens every device once and keeps its context for the
 * process: those files are libsovia's, not the application's, and a
 * daemon's close-all must not take them (ownfd.h). */
static struct rdma_event_channel *create_event_channel(void)
{
	sv_cm_calls_enter();
	struct rdma_event_channel *ch = rdma_create_event_channel();
	int n = 0;
	struct ibv_context **ctxs = ch ? rdma_get_devices(&n) : NULL;
	if (ctxs) {
		for (int i = 0; i < n; i++) {
			sv_ownfd_add(ctxs[i]->cmd_fd);
			sv_ownfd_add(ctxs[i]->async_fd);
		}
		rdma_free_devices(ctxs);
	}
	sv_cm_calls_leave();
	return ch;
}

static void destroy_event_channel(struct rdma_event_channel *ch)
{
	sv_ownfd_del(ch->fd); /* librdmacm closes it */
	sv_cm_calls_enter();
	rdma_destroy_event_channel(ch);
	sv_cm_calls_leave();
}

/* Every id of the process not destroyed yet, for move_ids: librdmacm keeps
 * no list of its own that we may read. Ids come from create_id and from
 * connect requests (get_cm_event). */
static struct {
	pthread_mutex_t mu;
	struct rdma_cm_id **v;
	size_t n, cap;
} live = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int live_add(struct rdma_cm_id *id)
{
	int r = 0;
	pthread_mutex_lock(&live.mu);
	if (live.n == live.cap) {
		size_t cap = live.cap ? live.cap * 2 : 64;
		struct rdma_cm_id **v = realloc(live.v, cap * sizeof(*v));
		if (v) {
			live.v = v;
			live.cap = cap;
		}
	}
	if (live.n < live.cap)
		live.v[live.n++] = id;
	else
		r = -ENOMEM;
	pthread_mutex_unlock(&live.mu);
	return r;
}

static int move_ids(struct rdma_event_channel *ch)
{
	int r = 0;
	sv_cm_calls_enter();
	pthread_mutex_lock(&live.mu);
	for (size_t i = 0; i < live.n && r == 0; i++)
		if (live.v[i]->channel != ch)
			r = rdma_migrate_id(live.v[i], ch);
	pthread_mutex_unlock(&live.mu);
	sv_cm_calls_leave();
	return r;
}

#define GUARDED(name, params, args)                                                         \
	static int g_##name params                                                          \
	{                                                                                   \
		sv_cm_calls_enter();                                                        \
		int r_ = rdma_##name args;                                                  \
		sv_cm_calls_leave();                                                        \
		return r_;                                                                  \
	}

GUARDED(create_id,
	(struct rdma_event_channel * ch, struct rdma_cm_id **id, void *ctx, enum rdma_port_space ps),
	(ch, id, ctx, ps))
GUARDED(destroy_id, (struct rdma_cm_id * id), (id))
GUARDED(get_cm_event, (struct rdma_event_channel * ch, struct rdma_cm_event **ev), (ch, ev))

static int create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx,
		     enum rdma_port_space ps)
{
	if (g_create_id(ch, id, ctx, ps) < 0)
		return -1;
	if (live_add(*id) < 0) {
		g_destroy_id(*id);
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

/* The id leaves the list only once it is gone: a destroy the kernel
 * refused (the credentials changed) leaves it whole, to be moved to the
 * next channel and destroyed there. Callers hold the upgrade's lock, as
 * move_ids' do: nobody takes an event meanwhile, for which the destroy
 * would wait. */
static int destroy_id(struct rdma_cm_id *id)
{
	pthread_mutex_lock(&live.mu);
	int r = g_destroy_id(id);
	if (r == 0)
		for (size_t i = live.n; i-- > 0;)
			if (live.v[i] == id) {
				live.v[i] = live.v[--live.n];
				break;
			}
	pthread_mutex_unlock(&live.mu);
	return r;
}

static int get_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev)
{
	if (g_get_cm_event(ch, ev) < 0)
		return -1;
	/* A request's id is new; one we could not note is never moved to
	 * another channel: after a credential change it fails its calls,
	 * and its connection stays on TCP. */
	if ((*ev)->event == RDMA_CM_EVENT_CONNECT_REQUEST)
		(void)live_add((*ev)->id);
	return 0;
}
GUARDED(resolve_addr, (struct rdma_cm_id * id, struct sockaddr *src, struct sockaddr *dst, int ms),
	(id, src, dst, ms))
GUARDED(resolve_route, (struct rdma_cm_id * id, int ms), (id, ms))
GUARDED(connect, (struct rdma_cm_id * id, struct rdma_conn_param *p), (id, p))
GUARDED(accept, (struct rdma_cm_id * id, struct rdma_conn_param *p), (id, p))
GUARDED(reject, (struct rdma_cm_id * id, const void *pd, uint8_t len), (id, pd, len))
GUARDED(establish, (struct rdma_cm_id * id), (id))
GUARDED(disconnect, (struct rdma_cm_id * id), (id))
GUARDED(bind_addr, (struct rdma_cm_id * id, struct sockaddr *a), (id, a))
GUARDED(listen, (struct rdma_cm_id * id, int backlog), (id, backlog))
GUARDED(set_option, (struct rdma_cm_id * id, int level, int name, void *val, size_t len),
	(id, level, name, val, len))
GUARDED(ack_cm_event, (struct rdma_cm_event * ev), (ev))

static int set_afonly(struct rdma_cm_id *id, int afonly)
{
	return g_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly, sizeof(afonly));
}

static int create_qp(struct sv_qp **out, struct rdma_cm_id *id, const struct sv_proto_params *prm)
{
	struct sv_verbs *v;
	int r = sv_verbs_create(&v, id, prm);
	*out = r < 0 ? NULL : sv_verbs_qp(v);
	return r;
}

static void atfork_child(void)
{
	/* The parent's ids are the parent's (and its list may have been
	 * in a realloc of another thread's: left as it is). */
	pthread_mutex_init(&live.mu, NULL);
	live.v = NULL;
	live.n = live.cap = 0;
	sv_verbs_atfork_child();
}

/* Kernels since 5.13 copy a pinned page for the child at a fork, so the
 * parent's registered buffers stay where its QPs write; libibverbs then
 * says fork support is not needed. With RDMAV_FORK_SAFE on a kernel
 * without that, the buffers are not in the child at all (MADV_DONTFORK):
 * the parent's would still be intact, but the answer is kept simple. */
static bool fork_keeps_qp(void)
{
	return ibv_is_fork_initialized() == IBV_FORK_UNNEEDED;
}

const struct sv_cm_ops sv_cm_rdma = {
	.create_event_channel = create_event_channel,
	.destroy_event_channel = destroy_event_channel,
	.move_ids = move_ids,
	.create_id = create_id,
	.destroy_id = destroy_id,
	.resolve_addr = g_resolve_addr,
	.resolve_route = g_resolve_route,
	.connect_id = g_connect,
	.accept_id = g_accept,
	.reject = g_reject,
	.establish = g_establish,
	.disconnect = g_disconnect,
	.bind_addr = g_bind_addr,
	.set_afonly = set_afonly,
	.listen_id = g_listen,
	.get_event = get_event,
	.ack_event = g_ack_cm_event,
	.peer_addr = rdma_get_peer_addr,
	.local_addr = rdma_get_local_addr,
	.create_qp = create_qp,
	.on_rdma_link = sv_links_on_rdma,
	.fork_keeps_qp = fork_keeps_qp,
	.atfork_child = atfork_child,
};

const struct sv_cm_ops *sv_cm = &sv_cm_rdma;

void sv_cm_use(const struct sv_cm_ops *ops)
{
	sv_cm = ops;
}
