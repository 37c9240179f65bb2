/* sovia-warden's own side of the registration (src/upgrade/warden.h has
 * the wire format and the library's side): what it takes as proof that a
 * registrant holds a listening socket, and the table it answers clients
 * from. */
#ifndef SV_WARDEN_TABLE_H
#define SV_WARDEN_TABLE_H

#include "warden.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Is fd a listening TCP socket of the caller's network namespace? 0 and
 * its address (*v6only: an IPv6 socket that takes no IPv4), or -errno. */
int sv_warden_check_listener(int fd, struct sockaddr_storage *addr, bool *v6only);

struct sv_warden_table;
struct sv_warden_table *sv_warden_table_new(void);
void sv_warden_table_free(struct sv_warden_table *t);
/* Enter a registration of owner's (the Unix connection it came on): one
 * per owner. 0, -EEXIST (the owner has one), -ENOSPC (full), -ENOMEM. */
int sv_warden_table_add(struct sv_warden_table *t, int owner, const struct sockaddr_storage *addr,
			bool v6only, uint16_t rdma_port);
void sv_warden_table_drop(struct sv_warden_table *t, int owner);
/* The RDMA port of the listener a TCP connection to `server` reached: the
 * newest registration of that address and port, else of a wildcard
 * address on that port. 0: none. */
uint16_t sv_warden_table_lookup(const struct sv_warden_table *t,
				const struct sockaddr_storage *server);
size_t sv_warden_table_count(const struct sv_warden_table *t);

#endif
