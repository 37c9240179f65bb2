/* Which of this host's addresses are on an RDMA device's network, and
 * whether a peer shares that link (links.h).
 *
 * The netdevs come from sysfs: a RoCE port's GID table names the netdev of
 * each entry (gid_attrs/ndevs, VLAN interfaces included), and an IPoIB
 * interface has the InfiniBand link type. getifaddrs() gives their
 * addresses and prefixes. All of it is read once per process, at the first
 * question: an interface set up later is not seen, which costs only the
 * first-contact hold (stream_switch.c). */
#include "links.h"

#include <dirent.h>
#include <net/if.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define SV_LINKS_MAX 32
#define SV_NDEVS_MAX 32
/* GID entries read per port after its last named one: a table is filled
 * from its start, so a run of empty ones is its end. */
#define SV_GID_GAP 8
#define SV_GID_MAX 1024

struct link {
	sa_family_t family;
	uint8_t addr[16], mask[16];
};

static struct link links[SV_LINKS_MAX];
static unsigned nlinks;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static char ndevs[SV_NDEVS_MAX][IF_NAMESIZE];
static unsigned nndevs;

/* The first line of a small file, without its newline; false if none. */
static bool read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	bool ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok && buf[0];
}

static void add_ndev(const char *name)
{
	for (unsigned i = 0; i < nndevs; i++)
		if (strcmp(ndevs[i], name) == 0)
			return;
	if (nndevs < SV_NDEVS_MAX && strlen(name) < IF_NAMESIZE)
		strcpy(ndevs[nndevs++], name);
}

static void read_port(const char *dev, const char *port)
{
	char path[640], name[64];
	unsigned gap = 0;
	for (unsigned i = 0; i < SV_GID_MAX && gap < SV_GID_GAP; i++) {
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%s/gid_attrs/ndevs/%u",
			 dev, port, i);
		if (read_line(path, name, sizeof(name))) {
			add_ndev(name);
			gap = 0;
		} else {
			gap++;
		}
	}
}

static void read_ndevs(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[300];
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports", e->d_name);
		DIR *pd = opendir(path);
		if (!pd)
			continue;
		struct dirent *pe;
		while ((pe = readdir(pd)))
			if (pe->d_name[0] != '.')
				read_port(e->d_name, pe->d_name);
		closedir(pd);
	}
	closedir(d);
}

static bool rdma_netdev(const char *name)
{
	for (unsigned i = 0; i < nndevs; i++)
		if (strcmp(ndevs[i], name) == 0)
			return true;
	char path[128], type[16];
	snprintf(path, sizeof(path), "/sys/class/net/%s/type", name);
	/* 32: ARPHRD_INFINIBAND */
	return read_line(path, type, sizeof(type)) && strcmp(type, "32") == 0;
}

/* An address as 16 bytes (IPv4 in the first 4) and its family. */
static bool addr_bytes(const struct sockaddr *sa, sa_family_t *fam, uint8_t b[16])
{
	memset(b, 0, 16);
	if (sa->sa_family == AF_INET) {
		memcpy(b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		*fam = AF_INET;
		return true;
	}
	if (sa->sa_family != AF_INET6)
		return false;
	const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
	if (IN6_IS_ADDR_V4MAPPED(a)) {
		memcpy(b, a->s6_addr + 12, 4);
		*fam = AF_INET;
	} else {
		memcpy(b, a->s6_addr, 16);
		*fam = AF_INET6;
	}
	return true;
}

static void read_links(void)
{
	read_ndevs();
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return;
	for (struct ifaddrs *i = ifs; i && nlinks < SV_LINKS_MAX; i = i->ifa_next) {
		struct link l;
		sa_family_t mf;
		if (!i->ifa_addr || !i->ifa_netmask || !(i->ifa_flags & IFF_UP) ||
		    !addr_bytes(i->ifa_addr, &l.family, l.addr) ||
		    !addr_bytes(i->ifa_netmask, &mf, l.mask) || mf != l.family ||
		    !rdma_netdev(i->ifa_name))
			continue;
		links[nlinks++] = l;
	}
	freeifaddrs(ifs);
}

bool sv_links_on_rdma(const struct sockaddr_storage *local, const struct sockaddr_storage *peer)
{
	pthread_once(&once, read_links);
	sa_family_t lf, pf;
	uint8_t la[16], pa[16];
	if (!addr_bytes((const struct sockaddr *)local, &lf, la) ||
	    !addr_bytes((const struct sockaddr *)peer, &pf, pa) || lf != pf)
		return false;
	for (unsigned i = 0; i < nlinks; i++) {
		const struct link *l = &links[i];
		if (l->family != lf || memcmp(l->addr, la, 16) != 0)
			continue;
		bool same = true;
		for (int b = 0; b < 16 && same; b++)
			same = ((la[b] ^ pa[b]) & l->mask[b]) == 0;
		if (same)
			return true;
	}
	return false;
}
