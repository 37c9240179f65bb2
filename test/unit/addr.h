/* Socket addresses for the unit tests, from text. */
#ifndef SV_TEST_ADDR_H
#define SV_TEST_ADDR_H

#include <arpa/inet.h>
#include <stdint.h>
#include <sys/socket.h>

static inline struct sockaddr_storage v4(const char *ip, unsigned port)
{
	struct sockaddr_storage ss = {0};
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	in->sin_family = AF_INET;
	in->sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, ip, &in->sin_addr);
	return ss;
}

static inline struct sockaddr_storage v6(const char *ip, unsigned port)
{
	struct sockaddr_storage ss = {0};
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons((uint16_t)port);
	inet_pton(AF_INET6, ip, &in6->sin6_addr);
	return ss;
}

#endif
