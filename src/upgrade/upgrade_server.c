/* The server's half of the upgrade: an RDMA listener beside each listening
 * socket, and connect requests matched to the connections the application
 * accepted (docs/protocol.md, section 3, step 3). A fork's child that
 * accepts on a listening socket it inherited opens an RDMA listener of its
 * own, on any port, and the port's owner redirects the requests for its
 * connections there (holders.h). */
#include "upgrade_int.h"

#include "addr.h"
#include "clock.h"
#include "config.h"
#include "helper.h"
#include "holders.h"
#include "log.h"
#include "real.h"
#include "warden.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>


static struct sv_listener *adopters;

/* A connect request waiting for the application to accept its TCP side. */
struct pending_req {
	struct rdma_cm_id *id;
	struct sv_cm_req req;
	struct sv_listener *l; /* held */
	uint64_t holders_seen; /* the holders' table's adds at our last look */
	uint64_t deadline;
	bool revive_tried; /* a connection back on TCP here was looked for */
	struct pending_req *next;
};

/* An accepted connection a request may still come for. */
struct unmatched {
	struct sv_stream *s;   /* held */
	struct sockaddr_storage local, peer;
	struct sv_listener *l; /* held until the request came or the wait ended */
	uint64_t deadline;
	int slot; /* its entry in the holders' table, or -1 */
	struct unmatched *next;
};

static struct pending_req *pending;

/* Requests kept waiting for their accept(), in all and from one host.
 * Each costs an rdma_cm id and a look at every wake-up of the helper,
 * and anyone who reaches the port over RDMA can send them: past these a
 * request is told to ask again (SV_CM_REJ_BUSY). A flood from one host
 * then delays that host's upgrades, not another's. The bounds are those
 * of an accept queue (net.core.somaxconn's default). */
#define SV_PENDING_MAX 4096u
#define SV_PENDING_PER_HOST 1024u

/* Is there no room for one more request like r? With up_lock. */
static bool pending_full(const struct sv_cm_req *r)
{
	unsigned all = 0, host = 0;
	for (const struct pending_req *p = pending; p; p = p->next) {
		all++;
		host += sv_addr_same_host(&p->req.client, &r->client);
	}
	if (all < SV_PENDING_MAX && host < SV_PENDING_PER_HOST)
		return false;
	static atomic_bool told;
	if (!atomic_exchange(&told, true))
		sv_warn("%u upgrade requests wait for their accept() (%u from one host): more "
			"are told to ask again", all, host);
	return true;
}
static struct unmatched *unmatched;
/* Finished entries whose holds are dropped once up_lock is released and
 * every event taken is acknowledged: the last reference of a stream takes
 * up_lock itself, and a listener's id may not be destroyed inside its own
 * CONNECT_REQUEST event. */
static struct unmatched *release_later;


static void release_unmatched(struct unmatched *u)
{
	struct sv_hand hand;
	if (sv_up_conns.holding(u->s, &hand) == SV_HOLD_ADOPTED)
		sv_holders_drop(&hand); /* served, or gone */
	else if (u->slot == SV_HOLDERS_TOLD)
		(void)sv_holders_tell(&u->local, &u->peer, 0, true);
	else if (u->slot >= 0 && u->l->holders)
		sv_holders_remove(u->l->holders, u->slot);
	u->slot = -1;
	u->next = release_later;
	release_later = u;
}

void sv_up_run_releases(void)
{
	sv_lock(&sv_up_lock);
	struct unmatched *list = release_later;
	release_later = NULL;
	for (struct unmatched *u = list; u; u = u->next)
		sv_up_listener_put(u->l);
	sv_unlock(&sv_up_lock);
	while (list) {
		struct unmatched *n = list->next;
		sv_up_conns.put(list->s);
		free(list);
		list = n;
	}
}

/* ---- Listeners' holders ------------------------------------------------------- */

/* An inherited listener's accepted connections go into the holders' table
 * once its RDMA listener is open. With up_lock. */
void sv_up_enter_holders(struct sv_listener *l)
{
	if (!l->inherited || !l->side_port || !l->holders)
		return;
	for (struct unmatched *u = unmatched; u; u = u->next) {
		if (u->l != l || u->slot >= 0)
			continue;
		struct sv_hand hand;
		enum sv_conn_holding h = sv_up_conns.holding(u->s, &hand);
		if (h == SV_HOLD_ADOPTED) {
			/* Handed to us: claimed; the owner redirects once we
			 * hold it alone. */
			sv_holders_claim(&hand, l->side_port);
			u->slot = hand.slot; /* done */
			continue;
		}
		if (h == SV_HOLD_GIVEN)
			continue; /* we handed it to a child of ours: it claims it */
		if (l->holders_era != sv_holders_era())
			/* A listener of the family this process left (it
			 * changed its ids): its maker enters it once checked. */
			u->slot = sv_holders_tell(&u->local, &u->peer, l->side_port, false);
		else
			u->slot = sv_holders_add(l->holders, &u->local, &u->peer, l->side_port);
		if (u->slot == -ENOTCONN || u->slot == -EAGAIN)
			sv_info("the family's channel is closed or full: an accepted connection's "
				"upgrade request will not find us");
		else if (u->slot < 0)
			sv_info("the holders' table is full: an accepted connection's upgrade "
				"request will not find us");
	}
}

/* ---- Accepted connections and requests ----------------------------------------- */

/* How long a request waits for the application's first use of its
 * connection (accept_request), from now. An accept-then-fork server forks
 * within milliseconds of its accept; a server that leaves a connection
 * unused for longer (a queue for a pool of workers; a read libsovia does
 * not see) still gets its upgrade: a second, or half the upgrade's
 * timeout if that is shorter. A listener whose process forked with it (a
 * postmaster, a prefork master) waits for half the timeout: the fork that
 * follows an accept may be late there, on a loaded host. */
uint64_t sv_upgrade_first_use_wait(const struct sv_holders *h)
{
	uint64_t half = (uint64_t)sv_cfg.upgrade_timeout_ms * 500u;
	if (h && sv_holders_forked(h))
		return half;
	return half < 1000000u ? half : 1000000u;
}

bool sv_upgrade_accepted(struct sv_listener *l, struct sv_stream *s,
			 const struct sockaddr_storage *local,
			 const struct sockaddr_storage *peer, uint64_t deadline)
{
	struct unmatched *u = malloc(sizeof(*u));
	if (!u)
		return false;
	sv_up_conns.get(s);
	*u = (struct unmatched){.s = s, .local = *local, .peer = *peer, .l = l,
				.deadline = deadline, .slot = -1};
	sv_lock(&sv_up_lock);
	l->refs++;
	u->next = unmatched;
	unmatched = u;
	sv_up_enter_holders(l);
	sv_unlock(&sv_up_lock);
	sv_upgrade_will_accept(l); /* a child's own RDMA listener, if not open yet */
	return true;
}

bool sv_upgrade_adopted(struct sv_stream *s, const struct sockaddr_storage *local,
			const struct sockaddr_storage *peer, struct sv_holders *h,
			uint64_t deadline)
{
	sv_lock(&sv_up_lock);
	struct sv_listener *l = adopters;
	while (l && !sv_addr_equal(&l->addr, local))
		l = l->next_adopter;
	if (!l && (l = calloc(1, sizeof(*l)))) {
		l->fd = -1;
		l->addr = *local;
		l->holders = h;
		l->holders_era = sv_holders_era();
		l->inherited = true;
		l->adopter = true;
		l->refs = 1; /* the list's, for the process's life */
		l->next_adopter = adopters;
		adopters = l;
	}
	sv_unlock(&sv_up_lock);
	return l && sv_upgrade_accepted(l, s, local, peer, deadline);
}

/* A request and the accepted connections. */
enum match_result {
	NO_MATCH,   /* not accepted yet */
	MATCHED,    /* accepted, or rejected: settled */
	MATCH_LATER /* its connection is not used yet, or its buffers wait for room */
};

/* The accepted stream a request that came to listener l is for: one
 * accepted on l's socket (a child's on the inherited socket are its own
 * listener's). With up_lock. */
static struct unmatched **find_unmatched(const struct sv_cm_req *req, const struct sv_listener *l)
{
	for (struct unmatched **pp = &unmatched; *pp; pp = &(*pp)->next) {
		if ((*pp)->l == l && sv_addr_equal(&(*pp)->local, &req->server) &&
		    sv_addr_equal(&(*pp)->peer, &req->client))
			return pp;
	}
	return NULL;
}

/* Try to match a request to an accepted connection. A refused id is left
 * in *destroy. */
static enum match_result match_request(struct rdma_cm_id *id, const struct sv_cm_req *req,
				       struct sv_listener *l, struct rdma_cm_id **destroy)
{
	struct unmatched **pp = find_unmatched(req, l);
	if (!pp)
		return NO_MATCH;
	struct unmatched *u = *pp;
	enum sv_accept_result r = sv_up_conns.take_request(u->s, id, req);
	if (r == SV_ACCEPT_LATER)
		return MATCH_LATER; /* both wait: the stream stays unmatched */
	if (r == SV_NOT_HERE) {
		*pp = u->next;
		release_unmatched(u);
		return NO_MATCH; /* the holders' table tells where */
	}
	if (r == SV_REFUSED) {
		sv_cm->reject(id, NULL, 0);
		*destroy = id;
	}
	*pp = u->next;
	release_unmatched(u);
	return MATCHED;
}

/* Does the application's accept() wait for the client's first bytes
 * (TCP_DEFER_ACCEPT, as Apache and nginx's "deferred" set it, on the
 * listening socket, before or after listen())? */
static bool accept_waits_for_data(const struct sv_listener *l)
{
	int v = 0;
	socklen_t len = sizeof(v);
	return l && l->fd >= 0 &&
	       SV_REAL(getsockopt)(l->fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, &len) == 0 && v > 0;
}

/* Another process of the server holds the connection: the client asks at
 * its port. True when redirected (the id is the caller's to destroy). */
static bool redirect(struct rdma_cm_id *id, const struct sv_cm_req *req, struct sv_listener *l,
		     uint64_t *seen)
{
	if (!l || l->inherited || !l->holders || !sv_holders_forked(l->holders))
		return false;
	/* Nothing entered since the last look: a flood of waiting requests
	 * costs no scans. */
	uint64_t adds = sv_holders_adds(l->holders);
	if (seen && *seen == adds)
		return false;
	if (seen)
		*seen = adds;
	uint16_t port = sv_holders_find(l->holders, &req->server, &req->client);
	if (!port)
		return false;
	sv_dbg("upgrade request: another process holds its connection: redirected to port %u",
	       port);
	uint8_t pd[SV_CM_REJ_LEN];
	sv_cm_rej_encode_redirect(port, pd);
	sv_cm->reject(id, pd, sizeof(pd));
	return true;
}

/* The request must come from the TCP peer's host. */
static bool from_tcp_peer(struct rdma_cm_id *id, const struct sv_cm_req *req)
{
	struct sockaddr *peer = sv_cm->peer_addr(id);
	struct sockaddr_storage ps = {0};
	memcpy(&ps, peer, peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						       : sizeof(struct sockaddr_in));
	return sv_addr_same_host(&ps, &req->client);
}

void sv_up_connect_request(struct rdma_cm_event *ev, struct rdma_cm_id **destroy)
{
	struct rdma_cm_id *id = ev->id;
	struct sv_cm_req req;
	int r = sv_cm_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
				 &req);
	if (r < 0) {
		/* Not ours (an rsockets peer, say), or another version. */
		sv_dbg("upgrade request: not libsovia's or another version (%d): rejected", r);
		sv_upgrade_reject(id, r == -EPROTONOSUPPORT, SV_CM_REJ_NO);
		*destroy = id;
		return;
	}
	if (!from_tcp_peer(id, &req)) {
		sv_warn("an upgrade request from another host than its TCP peer: refused");
		sv_upgrade_reject(id, false, SV_CM_REJ_NO);
		*destroy = id;
		return;
	}
	struct sv_listener *l = (void *)((uintptr_t)id->context & ~SV_LISTENER_TAG);
	id->context = NULL;
	enum match_result m = match_request(id, &req, l, destroy);
	if (m == MATCHED)
		return;
	uint64_t seen = 0;
	if (m == NO_MATCH)
		sv_holders_collect(); /* what the family's leavers told */
	if (m == NO_MATCH && redirect(id, &req, l, &seen)) {
		*destroy = id;
		return;
	}
	if (m == NO_MATCH && l && l->inherited) {
		/* Only a request its owner redirected comes here, for a
		 * connection we entered: it is gone. */
		sv_dbg("upgrade request at our own port: no such connection here: rejected");
		sv_upgrade_reject(id, false, SV_CM_REJ_NO);
		*destroy = id;
		return;
	}
	if (m == NO_MATCH && accept_waits_for_data(l)) {
		/* It would wait for ever if the client holds its first
		 * writes for RDMA: they go on TCP first, then it asks again. */
		sv_dbg("upgrade request before accept(), which waits for data: the client writes "
		       "first");
		sv_upgrade_reject(id, true, SV_CM_REJ_WRITE_FIRST);
		*destroy = id;
		return;
	}
	sv_dbg("upgrade request: %s",
	       m == NO_MATCH ? "no accepted connection yet; waiting for accept()"
			     : "waiting for its connection's first use or for locked memory");
	if (pending_full(&req)) {
		sv_upgrade_reject(id, true, SV_CM_REJ_BUSY);
		*destroy = id;
		return;
	}
	struct pending_req *p = malloc(sizeof(*p));
	if (!p) {
		sv_upgrade_reject(id, false, SV_CM_REJ_NO);
		*destroy = id;
		return;
	}
	*p = (struct pending_req){.id = id, .req = req, .l = l, .holders_seen = seen,
				  .deadline = sv_upgrade_deadline(sv_now_us()), .next = pending};
	if (l)
		l->refs++;
	pending = p;
}

/* How often the owner of a listening socket its children inherited looks
 * again at the requests it could not match: a child enters its connection
 * only once its own RDMA listener is open, which nothing here hears of. */
#define SV_HOLDERS_LOOK_US 5000u

/* Requests that waited for their accept(), or for room in the locked-memory
 * budget: matched now, or timed out. At every wake-up of the helper (a
 * give-back of locked memory after a refusal wakes it: pinned.h). */
static uint64_t pending_timers(uint64_t now)
{
	uint64_t next = 0;
	/* Once a look, not once a waiting request: a flood of them costs no
	 * system call each. */
	if (pending)
		sv_holders_collect();
	for (struct pending_req **pp = &pending; *pp;) {
		struct pending_req *p = *pp;
		struct rdma_cm_id *refused = NULL;
		enum match_result m = match_request(p->id, &p->req, p->l, &refused);
		bool settled = m == MATCHED;
		if (refused)
			sv_cm->destroy_id(refused); /* its event was acknowledged long ago */
		if (m == NO_MATCH && redirect(p->id, &p->req, p->l, &p->holders_seen)) {
			sv_cm->destroy_id(p->id);
			settled = true;
		}
		if (!settled && now >= p->deadline) {
			sv_dbg("upgrade request: no matching accepted connection in time: rejected");
			sv_upgrade_reject(p->id, false, SV_CM_REJ_NO);
			sv_cm->destroy_id(p->id);
			settled = true;
		}
		if (settled) {
			*pp = p->next;
			if (p->l)
				sv_up_listener_put(p->l);
			free(p);
			continue;
		}
		uint64_t at = p->deadline;
		if (p->l && p->l->holders && sv_holders_forked(p->l->holders) &&
		    now + SV_HOLDERS_LOOK_US < at)
			at = now + SV_HOLDERS_LOOK_US;
		if (!next || at < next)
			next = at;
		pp = &p->next;
	}
	return next;
}

/* Requests that found no accepted connection: one that went back to
 * plain TCP here may move to RDMA again, as a new stream (src/share/redo.c)
 * the request then matches. Each looks without up_lock (making the
 * successor takes it), once. One that a fork's child of ours still holds
 * (its owner looks again) is told "later" (SV_CM_REJ_LATER): its client
 * asks again, and is matched once we hold it alone. One back for good (its
 * fd is the kernel's) is refused at once, not held until its deadline. */
#define SV_REVIVE_BATCH 8
struct revive_look {
	struct sv_cm_req req;
	struct sv_listener *l;
	const struct pending_req *p;
};

static int revive_looks(struct revive_look *out)
{
	int n = 0;
	for (struct pending_req *p = pending; p && n < SV_REVIVE_BATCH; p = p->next) {
		if (p->revive_tried || !p->l)
			continue;
		p->revive_tried = true;
		p->l->refs++;
		out[n++] = (struct revive_look){.req = p->req, .l = p->l, .p = p};
	}
	return n;
}

static void revive_parked(struct revive_look *looks, int n)
{
	int r[SV_REVIVE_BATCH];
	for (int i = 0; i < n; i++)
		r[i] = sv_up_conns.revive ? sv_up_conns.revive(&looks[i].req.server,
							     &looks[i].req.client, looks[i].l)
					  : -1;
	sv_lock(&sv_up_lock);
	for (int i = 0; i < n; i++) {
		sv_up_listener_put(looks[i].l);
		bool later = r[i] == 0, never = r[i] == -2;
		for (struct pending_req **pp = &pending; (later || never) && *pp;
		     pp = &(*pp)->next) {
			struct pending_req *p = *pp;
			if (p != looks[i].p)
				continue;
			sv_dbg("upgrade request: its connection is back on TCP %s",
			       later ? "and shared with a fork's child of ours: later"
				     : "here for good: refused");
			sv_upgrade_reject(p->id, true, later ? SV_CM_REJ_LATER : SV_CM_REJ_NO);
			sv_cm->destroy_id(p->id);
			*pp = p->next;
			sv_up_listener_put(p->l);
			free(p);
			break;
		}
	}
	sv_unlock(&sv_up_lock);
}

uint64_t sv_upgrade_timers(uint64_t now)
{
	struct revive_look looks[SV_REVIVE_BATCH];
	sv_lock(&sv_up_lock);
	int nlooks = revive_looks(looks);
	sv_unlock(&sv_up_lock);
	revive_parked(looks, nlooks);
	sv_lock(&sv_up_lock);
	uint64_t next = pending_timers(now);
	for (struct unmatched **pp = &unmatched; *pp;) {
		struct unmatched *u = *pp;
		/* A connection handed to a fork's child keeps its listener
		 * (the application may close its listening socket right after
		 * the fork) until its request came, to be redirected. */
		uint64_t use_wait = 0;
		bool gone = now >= u->deadline ||
			    sv_up_conns.waiting(u->s, now, &use_wait) == SV_WAIT_GONE;
		if (gone) {
			*pp = u->next;
			release_unmatched(u);
			continue;
		}
		if (!next || u->deadline < next)
			next = u->deadline;
		if (use_wait && use_wait < next)
			next = use_wait;
		pp = &u->next;
	}
	sv_unlock(&sv_up_lock);
	sv_up_run_releases();
	return next;
}

void sv_upgrade_atfork_child(void)
{
	/* The parent's requests and connections are the parent's. */
	sv_lock_reinit(&sv_up_lock);
	pending = NULL;
	unmatched = NULL;
	release_later = NULL;
	adopters = NULL;
	sv_warden_atfork_child();
}
