/* The warden's table (warden_table.h): what it checks of a registration,
 * and the listeners it answers clients from. sovia-warden's own, and the
 * unit tests'; not part of the preload module. */
#include "warden_table.h"

#include "cmdata.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* The socket's network namespace is ours: a listener in a namespace of the
 * registrant's own making holds a port only there. */
static int same_netns(int fd)
{
	int ns = ioctl(fd, SIOCGSKNS);
	if (ns < 0)
		return -errno;
	struct stat a, b;
	int r = fstat(ns, &a) < 0 || stat("/proc/self/ns/net", &b) < 0 ? -errno : 0;
	close(ns);
	if (r < 0)
		return r;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino ? 0 : -EXDEV;
}

static int get_int(int fd, int level, int name, int *v)
{
	socklen_t len = sizeof(*v);
	return getsockopt(fd, level, name, v, &len) < 0 ? -errno : 0;
}

int sv_warden_check_listener(int fd, struct sockaddr_storage *addr, bool *v6only)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
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
	if ((r = same_netns(fd)) < 0)
		return r;
	socklen_t len = sizeof(*addr);
	memset(addr, 0, sizeof(*addr));
	if (getsockname(fd, (struct sockaddr *)addr, &len) < 0)
		return -errno;
	int only = 0;
	if (domain == AF_INET6 && (r = get_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only)) < 0)
		return r;
	*v6only = only != 0;
	return 0;
}

/* A registration. */
struct entry {
	int owner;
	uint64_t order; /* newer registrations have higher */
	struct sockaddr_storage addr;
	bool v6only;
	uint16_t rdma_port;
};

/* A warden serves one host's listeners: a few thousand at most, each
 * registration a connection of its own (tools/sovia_warden.c bounds
 * them), so a list is looked through. */
struct sv_warden_table {
	struct entry *e;
	size_t n, cap;
	uint64_t next_order;
};

#define SV_WARDEN_TABLE_MAX 65536u

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

int sv_warden_table_add(struct sv_warden_table *t, int owner, const struct sockaddr_storage *addr,
			bool v6only, uint16_t rdma_port)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->e[i].owner == owner)
			return -EEXIST;
	if (t->n == SV_WARDEN_TABLE_MAX)
		return -ENOSPC;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 16;
		struct entry *e = realloc(t->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		t->e = e;
		t->cap = cap;
	}
	t->e[t->n++] = (struct entry){owner, t->next_order++, *addr, v6only, rdma_port};
	return 0;
}

void sv_warden_table_drop(struct sv_warden_table *t, int owner)
{
	for (size_t i = 0; i < t->n; i++) {
		if (t->e[i].owner == owner) {
			t->e[i] = t->e[--t->n];
			return;
		}
	}
}

size_t sv_warden_table_count(const struct sv_warden_table *t)
{
	return t->n;
}

/* How well a listener at e answers a connection to server: 2 its very
 * address, 1 a wildcard of its family (:: also takes IPv4 unless
 * v6only), 0 not at all. */
static int match(const struct entry *e, const struct sockaddr_storage *server)
{
	if (sv_addr_port((const struct sockaddr *)&e->addr) !=
	    sv_addr_port((const struct sockaddr *)server))
		return 0;
	if (sv_addr_equal(&e->addr, server))
		return 2;
	uint8_t a[16], s[16];
	uint16_t pa, ps;
	int a4, s4;
	if (sv_addr16(&e->addr, a, &pa, &a4) < 0 || sv_addr16(server, s, &ps, &s4) < 0)
		return 0;
	if (e->addr.ss_family == AF_INET) {
		static const uint8_t any4[16] = {[10] = 0xff, [11] = 0xff};
		return s4 && memcmp(a, any4, 16) == 0;
	}
	static const uint8_t any6[16];
	return memcmp(a, any6, 16) == 0 && (!s4 || !e->v6only);
}

uint16_t sv_warden_table_lookup(const struct sv_warden_table *t,
				const struct sockaddr_storage *server)
{
	const struct entry *best = NULL;
	int best_m = 0;
	for (size_t i = 0; i < t->n; i++) {
		int m = match(&t->e[i], server);
		if (m > best_m || (m && m == best_m && t->e[i].order > best->order)) {
			best = &t->e[i];
			best_m = m;
		}
	}
	return best ? best->rdma_port : 0;
}
