/* Socket addresses: comparing, printing and their ports (sockaddr_in and
 * sockaddr_in6 alike). */
#include "addr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* The address as 16 bytes (IPv4 mapped) and the port; -1 if not IP. */
int sv_addr16(const struct sockaddr_storage *ss, uint8_t out[16], uint16_t *port, int *v4)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &in->sin_addr, 4);
		*port = in->sin_port;
		*v4 = 1;
		return 0;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
		memcpy(out, &in6->sin6_addr, 16);
		*port = in6->sin6_port;
		*v4 = IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr);
		return 0;
	}
	return -1;
}

uint16_t sv_addr_port(const struct sockaddr *sa)
{
	return ntohs(sa->sa_family == AF_INET6 ? ((const struct sockaddr_in6 *)sa)->sin6_port
					       : ((const struct sockaddr_in *)sa)->sin_port);
}

void sv_addr_set_port(struct sockaddr_storage *ss, uint16_t port)
{
	if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)ss)->sin_port = htons(port);
}

/* Compare two addresses as 16 bytes; ports too when with_port. */
static bool addr_cmp(const struct sockaddr_storage *a, const struct sockaddr_storage *b,
		     bool with_port)
{
	uint8_t x[16], y[16];
	uint16_t px, py;
	int vx, vy;
	if (sv_addr16(a, x, &px, &vx) < 0 || sv_addr16(b, y, &py, &vy) < 0)
		return false;
	return (!with_port || px == py) && memcmp(x, y, 16) == 0;
}

void sv_addr_unmap(struct sockaddr_storage *ss)
{
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
	if (ss->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
		return;
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = in6->sin6_port};
	memcpy(&in.sin_addr, &in6->sin6_addr.s6_addr[12], 4);
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, &in, sizeof(in));
}

bool sv_addr_same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	return addr_cmp(a, b, false);
}

bool sv_addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	return addr_cmp(a, b, true);
}

void sv_addr_str(const struct sockaddr_storage *ss, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
	}
	/* [v6]:port, as ss(8) writes it: the port stays apart from the address. */
	snprintf(out, len, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}
