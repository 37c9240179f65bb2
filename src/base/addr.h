/* Socket addresses: IPv4 and IPv6 alike, an IPv4 address and its
 * IPv4-mapped IPv6 form being the same. No I/O. */
#ifndef SV_ADDR_H
#define SV_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* The address as 16 bytes (IPv4 as IPv4-mapped IPv6) and its port (network
 * order); *v4 says which it was. -1 for another family. */
int sv_addr16(const struct sockaddr_storage *ss, uint8_t out[16], uint16_t *port, int *v4);
/* The port (host order) of an IPv4 or IPv6 address, and a copy's. */
uint16_t sv_addr_port(const struct sockaddr *sa);
void sv_addr_set_port(struct sockaddr_storage *ss, uint16_t port);
/* Same address and port? (IPv4 and IPv4-mapped IPv6 compare equal.) */
bool sv_addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* Same address, ports ignored. */
bool sv_addr_same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* An IPv4-mapped IPv6 address (a dual-stack socket's view of an IPv4
 * peer) as the plain IPv4 address it is: rdma_cm routes and binds only the
 * latter. Any other address is left as it is. */
void sv_addr_unmap(struct sockaddr_storage *ss);
/* "address:port", "[v6 address]:port". */
void sv_addr_str(const struct sockaddr_storage *ss, char *out, size_t len);

#endif
