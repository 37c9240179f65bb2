/* The server's RDMA listeners: one beside each listening socket, on the
 * same address and port (or, where another process holds that port in
 * rdma_cm's space, any port the host's sovia-warden sends clients to:
 * warden.h), and a fork's child's own for the listening socket it
 * inherited (holders.h). The requests they take are matched in
 * upgrade_server.c. */
#include "upgrade_int.h"

#include "config.h"
#include "helper.h"
#include "holders.h"
#include "log.h"
#include "real.h"
#include "warden.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Drop a holder. With up_lock. */
void sv_up_listener_put(struct sv_listener *l)
{
	if (--l->refs > 0)
		return;
	if (l->id)
		sv_upgrade_destroy_id(l->id);
	free(l);
}

/* An RDMA listener's id, bound to `at` and listening. With up_lock. */
static int open_listener_id(struct sv_listener *l, struct sockaddr_storage *at)
{
	if (sv_cm->create_id(sv_helper_channel(), &l->id,
			     (void *)((uintptr_t)l | SV_LISTENER_TAG), RDMA_PS_TCP) < 0)
		return -errno;
	int r = 0;
	/* An IPv6 socket takes IPv4 clients unless IPV6_V6ONLY: its RDMA
	 * listener too, whatever the host's net.ipv6.bindv6only. */
	if ((at->ss_family == AF_INET6 && sv_cm->set_afonly(l->id, l->v6only) < 0) ||
	    sv_cm->bind_addr(l->id, (struct sockaddr *)at) < 0 ||
	    sv_cm->listen_id(l->id, 128) < 0) {
		r = -errno;
		sv_cm->destroy_id(l->id);
		l->id = NULL;
	}
	return r;
}

/* The warden's answer for a listener that only its clients can find (it
 * is not on the application's port): refused, or not given in time, and
 * the RDMA listener goes, as nobody would find it. On the warden's
 * thread (warden.c). */
static void vouched(void *arg, int r)
{
	struct sv_listener *l = arg;
	sv_lock(&sv_up_lock);
	if (r < 0 && l->id) {
		/* A warning: whoever holds the port takes our clients'
		 * requests, and a client writes its echo into our stream for
		 * them. */
		sv_warn("fd %d: another process holds port %u in rdma_cm's space and takes this "
			"server's clients' upgrade requests; no sovia-warden sends them to ours "
			"(%s): run sovia-warden on this host", l->fd,
			sv_addr_port((const struct sockaddr *)&l->addr), strerror(-r));
		sv_upgrade_destroy_id(l->id);
		l->id = NULL;
		l->failed = true;
	}
	sv_up_listener_put(l); /* the registration's hold */
	sv_unlock(&sv_up_lock);
}

/* Register the listener with the host's sovia-warden, so that clients
 * that ask the warden are sent to it: on the warden's own thread, which
 * nobody waits for. `must`: the listener is not on the application's
 * port (another process holds that one in rdma_cm's space), so only the
 * warden's clients can find it: it goes if the warden does not take it
 * (vouched). False when it must and cannot even be asked. With up_lock. */
static bool register_with_warden(struct sv_listener *l, bool must)
{
	if (!sv_cfg.warden_port || l->fd < 0)
		return !must;
	uint16_t port = sv_addr_port(sv_cm->local_addr(l->id));
	if (must)
		l->refs++;
	int r = sv_warden_register(l->fd, port, must, must ? vouched : NULL, l);
	if (r < 0 && must) {
		l->refs--;
		sv_warn("fd %d: another process holds port %u in rdma_cm's space, and sovia-warden "
			"cannot be asked to send our clients to ours (%s)", l->fd,
			sv_addr_port((const struct sockaddr *)&l->addr), strerror(-r));
	}
	return r == 0 || !must;
}

/* Open the RDMA listener on l->addr (an inherited one's on any port).
 * With up_lock. */
static void create_listener(struct sv_listener *l)
{
	/* A dual-stack socket bound to an IPv4 address sees it IPv4-mapped
	 * (::ffff:a.b.c.d, as ftpd's passive listeners): rdma_cm binds
	 * only the IPv4 address its clients ask for. */
	struct sockaddr_storage at = l->addr;
	sv_addr_unmap(&at);
	if (l->inherited)
		sv_addr_set_port(&at, 0);
	int r = open_listener_id(l, &at);
	bool elsewhere = false;
	if (r == -EADDRINUSE && !l->inherited && sv_cfg.warden_port) {
		/* rdma_cm's port space is not the kernel's: anyone may hold
		 * our port there. Any port will do if the warden sends our
		 * clients to it. */
		sv_addr_set_port(&at, 0);
		r = open_listener_id(l, &at);
		elsewhere = true;
	}
	if (r < 0) {
		sv_info("fd %d: no RDMA listener on its address (%s); its connections stay on TCP",
			l->fd, strerror(-r));
		goto failed;
	}
	if (!l->inherited && !register_with_warden(l, elsewhere))
		goto destroy_id;
	if (l->inherited) {
		l->side_port = sv_addr_port(sv_cm->local_addr(l->id));
		sv_dbg("fd %d: inherited: our RDMA listener is at port %u", l->fd, l->side_port);
		sv_up_enter_holders(l);
		return;
	}
	sv_dbg("fd %d: RDMA listener up beside it", l->fd);
	return;

destroy_id:
	sv_cm->destroy_id(l->id);
	l->id = NULL;
failed:
	l->failed = true;
}

static void listen_job(void *arg, int rdma_err)
{
	struct sv_listener *l = arg;
	sv_lock(&sv_up_lock);
	if (rdma_err)
		l->failed = true;
	else if (l->refs > 1)
		create_listener(l); /* the application still listens */
	sv_up_listener_put(l);            /* the job's hold */
	sv_unlock(&sv_up_lock);
}

struct sv_listener *sv_upgrade_listen(int fd)
{
	if (sv_helper_start() < 0)
		return NULL;
	struct sv_listener *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->fd = fd;
	socklen_t len = sizeof(l->addr);
	if (getsockname(fd, (struct sockaddr *)&l->addr, &len) < 0) {
		free(l);
		return NULL;
	}
	int only = 0;
	len = sizeof(only);
	l->v6only = l->addr.ss_family == AF_INET6 &&
		    SV_REAL(getsockopt)(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, &len) == 0 && only;
	l->holders = sv_holders_get(); /* before any fork: the children share it */
	l->holders_era = sv_holders_era();
	l->refs = 2; /* the fd and the job */
	int r = sv_helper_when_ready(listen_job, l);
	if (r == 0)
		return l; /* opened by the helper once rdma_cm is up */
	if (r < 0) {
		free(l);
		return NULL;
	}
	sv_lock(&sv_up_lock);
	l->refs = 1;
	create_listener(l);
	bool failed = l->failed;
	if (failed)
		sv_up_listener_put(l);
	sv_unlock(&sv_up_lock);
	return failed ? NULL : l;
}

struct sv_listener *sv_upgrade_listen_inherited(const struct sv_listener *parent, int fd)
{
	/* The parent's object, as this child's memory holds it: read, never
	 * released (its id is the parent's). */
	if (!parent || parent->failed || !parent->holders)
		return NULL;
	struct sv_listener *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->fd = fd;
	l->addr = parent->addr;
	l->v6only = parent->v6only;
	l->holders = parent->holders;
	l->holders_era = parent->holders_era;
	l->inherited = true;
	l->refs = 1; /* the fd; the RDMA listener opens at the first accept */
	sv_holders_mark_forked(l->holders);
	return l;
}

/* An inherited listener's own RDMA listener, at its first accept. */
static void start_side_listener(struct sv_listener *l)
{
	/* Once: every accept() of the process asks. */
	if (!l->inherited || atomic_load(&l->side_started))
		return;
	sv_lock(&sv_up_lock);
	bool go = !atomic_exchange(&l->side_started, true);
	if (go)
		l->refs++; /* the job's */
	sv_unlock(&sv_up_lock);
	if (!go)
		return;
	int r = sv_helper_start() < 0 ? -1 : sv_helper_when_ready(listen_job, l);
	if (r == 0)
		return;
	sv_lock(&sv_up_lock);
	if (r < 0)
		l->failed = true;
	else
		create_listener(l);
	sv_up_listener_put(l);
	sv_unlock(&sv_up_lock);
}

void sv_upgrade_will_accept(struct sv_listener *l)
{
	if (l)
		start_side_listener(l);
}

bool sv_upgrade_listener_usable(struct sv_listener *l)
{
	sv_lock(&sv_up_lock);
	bool ok = !l->failed;
	sv_unlock(&sv_up_lock);
	return ok;
}

void sv_upgrade_unlisten(struct sv_listener *l)
{
	if (!l)
		return;
	sv_lock(&sv_up_lock);
	l->fd = -1; /* closed: its number may be another file's now */
	sv_up_listener_put(l);
	sv_unlock(&sv_up_lock);
}

struct sv_holders *sv_upgrade_listener_holders(const struct sv_listener *l)
{
	return l ? l->holders : NULL;
}
