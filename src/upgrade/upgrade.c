/* The upgrade over rdma_cm: the client asks the server's libsovia, on the
 * same address and port (RDMA_PS_TCP), or where the server host's warden
 * says, to attach an RC queue pair to a TCP connection both already have;
 * the server matches the request to a connection its application accepted
 * (upgrade_server.c). Each side puts a random challenge in the private
 * data; the other side echoes it on TCP at its switch point, proving the
 * RDMA peer is the TCP peer (docs/protocol.md). This file has the
 * module's start, its lock, the events' dispatch and the ids' end; a
 * connection's own part is the stream's (stream_cm.c). */
#include "upgrade_int.h"

#include "addr.h"
#include "helper.h"
#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sv_lock sv_up_lock = SV_LOCK_INIT(SV_RANK_UPGRADE);
struct sv_upgrade_conns sv_up_conns;

void sv_upgrade_lock(void)
{
	sv_lock(&sv_up_lock);
}

void sv_upgrade_unlock(void)
{
	sv_unlock(&sv_up_lock);
}

void sv_upgrade_init(void)
{
	sv_helper_serve_cm(sv_upgrade_events, sv_upgrade_lock, sv_upgrade_unlock);
	sv_helper_each_round(SV_HELPER_AFTER_LOOKS, sv_upgrade_timers);
}

void sv_upgrade_serve_conns(const struct sv_upgrade_conns *conns)
{
	int (*revive)(const struct sockaddr_storage *, const struct sockaddr_storage *,
		      struct sv_listener *) = sv_up_conns.revive;
	sv_up_conns = *conns;
	if (!sv_up_conns.revive)
		sv_up_conns.revive = revive;
}

void sv_upgrade_serve_revive(int (*revive)(const struct sockaddr_storage *local,
					   const struct sockaddr_storage *peer,
					   struct sv_listener *l))
{
	sv_up_conns.revive = revive;
}

void sv_upgrade_reject(struct rdma_cm_id *id, bool say, enum sv_cm_rej why)
{
	uint8_t pd[SV_CM_REJ_LEN];
	sv_cm_rej_encode(why, pd);
	sv_cm->reject(id, say ? pd : NULL, say ? sizeof(pd) : 0);
}

/* ---- Hosts without a warden ------------------------------------------------------- */

/* Hosts whose warden's port had no listener, remembered for a while: a
 * process's next connections there ask the server's port at once, as
 * they would after the warden's "no listener", without that round trip
 * (it made a new connection's time to RDMA 1.7x). A warden started later
 * is asked once the memory ends. With up_lock; a few hosts, the oldest
 * forgotten first. */
#define SV_NO_WARDEN_HOSTS 16
#define SV_NO_WARDEN_MEMO_US (10u * 1000000u)
static struct {
	struct sockaddr_storage host;
	uint64_t until;
} no_warden_memo[SV_NO_WARDEN_HOSTS];

bool sv_upgrade_no_warden_known(const struct sockaddr_storage *host, uint64_t now)
{
	for (int i = 0; i < SV_NO_WARDEN_HOSTS; i++)
		if (no_warden_memo[i].until > now && sv_addr_same_host(&no_warden_memo[i].host, host))
			return true;
	return false;
}

void sv_upgrade_no_warden_learn(const struct sockaddr_storage *host, uint64_t now)
{
	int at = 0;
	for (int i = 0; i < SV_NO_WARDEN_HOSTS; i++) {
		if (no_warden_memo[i].until && sv_addr_same_host(&no_warden_memo[i].host, host)) {
			at = i;
			break;
		}
		if (no_warden_memo[i].until < no_warden_memo[at].until)
			at = i;
	}
	no_warden_memo[at].host = *host;
	no_warden_memo[at].until = now + SV_NO_WARDEN_MEMO_US;
}

/* ---- Events ------------------------------------------------------------------------ */

/* One event; with up_lock. It is acknowledged here. */
static void handle_event(struct rdma_cm_event *ev)
{
	struct rdma_cm_id *destroy = NULL;
	uintptr_t ctx = (uintptr_t)ev->id->context;
	sv_dbg("rdma_cm: %s (status %d) for %s", rdma_event_str(ev->event), ev->status,
	       ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? "a listener"
	       : !ctx                                  ? "nobody"
	       : (ctx & SV_LISTENER_TAG)               ? "a listener"
						       : "a stream");
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
		sv_up_connect_request(ev, &destroy);
	else if (ctx && !(ctx & SV_LISTENER_TAG))
		sv_up_conns.event((struct sv_stream *)ctx, ev, &destroy);
	/* else a listener's own event, or a stream that is gone */
	sv_cm->ack_event(ev);
	if (destroy)
		sv_cm->destroy_id(destroy);
}

void sv_upgrade_events(struct rdma_event_channel *ch)
{
	/* Events are taken from the channel with up_lock held: rdma_destroy_id
	 * (always called with up_lock) waits for every event already taken for
	 * its id to be acknowledged, so none may be in a hand that waits for
	 * the lock. */
	sv_lock(&sv_up_lock);
	struct rdma_cm_event *ev;
	while (sv_cm->get_event(ch, &ev) == 0)
		handle_event(ev);
	sv_unlock(&sv_up_lock);
	sv_up_run_releases();
}

/* ---- The ids' end ------------------------------------------------------------------- */

static void destroy_job(void *arg, int rdma_err);

/* Destroy id now, with up_lock. A destroy the kernel refused because the
 * credentials changed again since the helper followed them goes again on
 * the helper, which follows first at its next wake-up. */
static void destroy_or_again(struct rdma_cm_id *id)
{
	if (sv_cm->destroy_id(id) < 0 && errno == EACCES && !sv_helper_creds_stale())
		sv_helper_defer(destroy_job, id);
}

static void destroy_job(void *arg, int rdma_err)
{
	(void)rdma_err;
	sv_lock(&sv_up_lock);
	destroy_or_again(arg);
	sv_unlock(&sv_up_lock);
}

void sv_upgrade_destroy_id(struct rdma_cm_id *id)
{
	id->context = NULL; /* its events, if any come first, are nobody's */
	if (!sv_helper_may_call_cm() && sv_helper_defer(destroy_job, id) == 0)
		return;
	destroy_or_again(id);
}
