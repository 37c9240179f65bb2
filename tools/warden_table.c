/* The warden's table (warden_table.h): what it checks of a registration,
 * how it confirms that a registered socket still listens, and the
 * listeners it answers clients from. sovia-warden's own, and the unit
 * tests'; not part of the preload module. */
#include "warden_table.h"

#include "cmdata.h"

#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- The kernel's socket diagnostics ------------------------------------------------- */

int sv_warden_diag_open(void)
{
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_SOCK_DIAG);
	return fd < 0 ? -errno : fd;
}

/* The reply to one request, read until it comes (the kernel answers a
 * request in its send, so it is there at once; stale replies of an
 * earlier request are passed over by their sequence number). */
static int diag_reply(int diag, uint32_t seq, struct inet_diag_msg *out)
{
	for (int tries = 0; tries < 8; tries++) {
		union {
			char buf[4096];
			struct nlmsghdr align;
		} rb;
		ssize_t n = recv(diag, rb.buf, sizeof(rb.buf), MSG_DONTWAIT);
		if (n < 0)
			return errno == EINTR ? -EAGAIN : -errno;
		for (struct nlmsghdr *h = &rb.align; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_seq != seq)
				continue;
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error ? e->error : -ENOENT;
			}
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
			    h->nlmsg_len < NLMSG_LENGTH(sizeof(*out)))
				return -EPROTO;
			memcpy(out, NLMSG_DATA(h), sizeof(*out));
			return 0;
		}
	}
	return -EPROTO;
}

int sv_warden_alive(int diag, const struct sockaddr_storage *addr, uint64_t cookie)
{
	static uint32_t seq;
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
	} req = {
		.nh = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		       .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = ++seq},
		.r = {.sdiag_family = (uint8_t)addr->ss_family, .sdiag_protocol = IPPROTO_TCP,
		      .idiag_states = 1u << TCP_LISTEN},
	};
	/* One socket by its address and cookie: the kernel finds the
	 * listener a connection there reaches and answers it only if its
	 * cookie is this one. */
	if (addr->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
		req.r.id.idiag_sport = in->sin_port;
		memcpy(req.r.id.idiag_src, &in->sin_addr, 4);
	} else if (addr->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
		req.r.id.idiag_sport = in6->sin6_port;
		memcpy(req.r.id.idiag_src, &in6->sin6_addr, 16);
	} else {
		return -EAFNOSUPPORT;
	}
	req.r.id.idiag_cookie[0] = (uint32_t)cookie;
	req.r.id.idiag_cookie[1] = (uint32_t)(cookie >> 32);
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	if (sendto(diag, &req, sizeof(req), MSG_DONTWAIT, (struct sockaddr *)&kernel,
		   sizeof(kernel)) < 0)
		return -errno;
	struct inet_diag_msg m;
	int r = diag_reply(diag, req.nh.nlmsg_seq, &m);
	if (r == -ENOENT || r == -ESTALE)
		return 0;
	if (r < 0)
		return r;
	uint64_t got = (uint64_t)m.id.idiag_cookie[0] | (uint64_t)m.id.idiag_cookie[1] << 32;
	return got == cookie && m.idiag_state == TCP_LISTEN;
}

/* ---- A registrant's socket ------------------------------------------------------------- */

static int get_int(int fd, int level, int name, int *v)
{
	socklen_t len = sizeof(*v);
	return getsockopt(fd, level, name, v, &len) < 0 ? -errno : 0;
}

int sv_warden_check_listener(int diag, int fd, struct sv_warden_listener *out)
{
	/* getsockopt first: on a file of any other kind it fails with
	 * ENOTSOCK without looking at the file. */
	int domain, type, proto, listening, r;
	if ((r = get_int(fd, SOL_SOCKET, SO_DOMAIN, &domain)) < 0 ||
	    (r = get_int(fd, SOL_SOCKET, SO_TYPE, &type)) < 0 ||
	    (r = get_int(fd, SOL_SOCKET, SO_PROTOCOL, &proto)) < 0 ||
	    (r = get_int(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening)) < 0)
		return r;
	if ((domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM ||
	    proto != IPPROTO_TCP)
		return -EPROTOTYPE;
	if (!listening)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	socklen_t len = sizeof(out->addr);
	if (getsockname(fd, (struct sockaddr *)&out->addr, &len) < 0)
		return -errno;
	int only = 0;
	if (domain == AF_INET6 && (r = get_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only)) < 0)
		return r;
	out->v6only = only != 0;
	len = sizeof(out->cookie);
	if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &out->cookie, &len) < 0)
		return -errno;
	/* Our diagnostics see our network namespace only: a listener in a
	 * namespace of the registrant's own making holds its port there. */
	r = sv_warden_alive(diag, &out->addr, out->cookie);
	return r < 0 ? r : r ? 0 : -EXDEV;
}

/* ---- The table ----------------------------------------------------------------------------- */

struct entry {
	struct sv_warden_listener l;
	uid_t uid;
	uint64_t order; /* newer registrations have higher */
	uint16_t rdma_port;
};

/* A warden serves one host's listeners: a few thousand at most (the
 * limits above), so a list is looked through. */
struct sv_warden_table {
	struct entry *e;
	size_t n, cap;
	uint64_t next_order;
};

struct sv_warden_table *sv_warden_table_new(void)
{
	return calloc(1, sizeof(struct sv_warden_table));
}

void sv_warden_table_free(struct sv_warden_table *t)
{
	if (t)
		free(t->e);
	free(t);
}

size_t sv_warden_table_count(const struct sv_warden_table *t)
{
	return t->n;
}

size_t sv_warden_table_count_uid(const struct sv_warden_table *t, uid_t uid)
{
	size_t n = 0;
	for (size_t i = 0; i < t->n; i++)
		n += t->e[i].uid == uid;
	return n;
}

static void drop(struct sv_warden_table *t, size_t i)
{
	t->e[i] = t->e[--t->n];
}

int sv_warden_table_add(struct sv_warden_table *t, uid_t uid, const struct sv_warden_listener *l,
			uint16_t rdma_port)
{
	for (size_t i = 0; i < t->n; i++) {
		if (t->e[i].l.cookie == l->cookie) {
			/* Its listener registered again (a new RDMA listener
			 * of the process that holds it): the newest word. */
			t->e[i] = (struct entry){*l, uid, t->next_order++, rdma_port};
			return 0;
		}
	}
	if (t->n >= SV_WARDEN_TABLE_MAX || sv_warden_table_count_uid(t, uid) >= SV_WARDEN_TABLE_PER_UID)
		return -ENOSPC;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 16;
		struct entry *e = realloc(t->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		t->e = e;
		t->cap = cap;
	}
	t->e[t->n++] = (struct entry){*l, uid, t->next_order++, rdma_port};
	return 0;
}

/* How well a listener at e answers a connection to server: 2 its very
 * address, 1 a wildcard of its family (:: also takes IPv4 unless
 * v6only), 0 not at all. */
static int match(const struct entry *e, const struct sockaddr_storage *server)
{
	const struct sockaddr_storage *a = &e->l.addr;
	if (sv_addr_port((const struct sockaddr *)a) != sv_addr_port((const struct sockaddr *)server))
		return 0;
	if (sv_addr_equal(a, server))
		return 2;
	uint8_t x[16], s[16];
	uint16_t px, ps;
	int x4, s4;
	if (sv_addr16(a, x, &px, &x4) < 0 || sv_addr16(server, s, &ps, &s4) < 0)
		return 0;
	if (a->ss_family == AF_INET) {
		static const uint8_t any4[16] = {[10] = 0xff, [11] = 0xff};
		return s4 && memcmp(x, any4, 16) == 0;
	}
	static const uint8_t any6[16];
	return memcmp(x, any6, 16) == 0 && (!s4 || !e->l.v6only);
}

uint16_t sv_warden_table_lookup(struct sv_warden_table *t, const struct sockaddr_storage *server,
				sv_warden_alive_fn alive, void *arg)
{
	/* The best match first, then the next: a candidate whose socket is
	 * gone leaves the table, and can never shadow a live one. */
	for (;;) {
		size_t best = t->n;
		int best_m = 0;
		for (size_t i = 0; i < t->n; i++) {
			int m = match(&t->e[i], server);
			if (m > best_m || (m && m == best_m && t->e[i].order > t->e[best].order)) {
				best = i;
				best_m = m;
			}
		}
		if (best == t->n)
			return 0;
		int r = alive(arg, &t->e[best].l.addr, t->e[best].l.cookie);
		if (r > 0)
			return t->e[best].rdma_port;
		if (r < 0)
			return 0; /* not confirmed: nobody is vouched for */
		drop(t, best);
	}
}

size_t sv_warden_table_sweep(struct sv_warden_table *t, sv_warden_alive_fn alive, void *arg)
{
	size_t gone = 0;
	for (size_t i = 0; i < t->n;) {
		if (alive(arg, &t->e[i].l.addr, t->e[i].l.cookie) == 0) {
			drop(t, i);
			gone++;
		} else {
			i++;
		}
	}
	return gone;
}
