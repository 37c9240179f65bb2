/* sovia-warden's own side of the registration (src/upgrade/warden.h has
 * the wire format and the library's side): what it takes as proof that a
 * registrant holds a listening socket, how it confirms later that the
 * socket still listens, and the table it answers clients from.
 *
 * Nothing here may block on what a user controls: a registrant's socket
 * is only asked with getsockopt and getsockname (a file of another kind
 * answers ENOTSOCK at once, where fstat could wait on a FUSE server), and
 * the kernel's socket diagnostics (NETLINK_SOCK_DIAG) answer for the
 * rest, as they answer ss(8). Closing a registrant's fd is the caller's
 * affair (sovia_warden.c closes them in processes of their own). */
#ifndef SV_WARDEN_TABLE_H
#define SV_WARDEN_TABLE_H

#include "warden.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* A registrant's listening socket, as the warden keeps it: its address
 * and the kernel's cookie for it (SO_COOKIE), which no other socket
 * bears while the host runs. */
struct sv_warden_listener {
	struct sockaddr_storage addr;
	bool v6only;     /* an IPv6 socket that takes no IPv4 */
	uint64_t cookie;
};

/* The socket diagnostics' netlink socket of the caller's network
 * namespace (non-blocking, close-on-exec), or -errno. */
int sv_warden_diag_open(void);
/* Does the socket with this cookie still listen at addr, in the network
 * namespace of `diag`? 1, 0 (gone, or another socket listens there), or
 * -errno (the diagnostics did not answer). */
int sv_warden_alive(int diag, const struct sockaddr_storage *addr, uint64_t cookie);
/* Is fd a listening TCP socket of diag's network namespace? Asked with
 * calls that cannot wait on anything of the registrant's. 0 and *out, or
 * -errno: -ENOTSOCK, -EPROTOTYPE (not TCP), -EINVAL (not listening),
 * -EXDEV (not listening in our namespace, as the diagnostics see it). */
int sv_warden_check_listener(int diag, int fd, struct sv_warden_listener *out);

/* How many registrations the table takes: in all, and of one user. */
#define SV_WARDEN_TABLE_MAX 16384u
#define SV_WARDEN_TABLE_PER_UID 1024u

struct sv_warden_table;
struct sv_warden_table *sv_warden_table_new(void);
void sv_warden_table_free(struct sv_warden_table *t);
/* Enter uid's registration of listener l, whose RDMA listener is at
 * rdma_port: it replaces one of the same socket (cookie). 0, -ENOSPC (the
 * table, or uid's share of it, is full), -ENOMEM. */
int sv_warden_table_add(struct sv_warden_table *t, uid_t uid, const struct sv_warden_listener *l,
			uint16_t rdma_port);
/* Whether an entry's socket still listens: as sv_warden_alive (the
 * warden's), or a test's. */
typedef int (*sv_warden_alive_fn)(void *arg, const struct sockaddr_storage *addr,
				  uint64_t cookie);
/* The RDMA port of the listener a TCP connection to `server` reaches now:
 * a live registration of that very address and port first, else of a
 * wildcard of its family on that port (:: takes IPv4 too unless
 * v6only); the newest among equals. An entry whose socket no longer
 * listens is dropped on the way; one that cannot be confirmed is passed
 * over. 0: none. */
uint16_t sv_warden_table_lookup(struct sv_warden_table *t, const struct sockaddr_storage *server,
				sv_warden_alive_fn alive, void *arg);
/* Drop every entry whose socket no longer listens: how many went. */
size_t sv_warden_table_sweep(struct sv_warden_table *t, sv_warden_alive_fn alive, void *arg);
size_t sv_warden_table_count(const struct sv_warden_table *t);
size_t sv_warden_table_count_uid(const struct sv_warden_table *t, uid_t uid);

#endif
