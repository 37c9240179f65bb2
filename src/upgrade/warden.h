/* sovia-warden: a privileged daemon on a server's host that tells clients
 * where the server's libsovia listens (docs/design.md, "The warden").
 *
 * rdma_cm has a port space of its own: any local user may listen on a
 * server's port there before the server's libsovia does, and a client
 * that asks that port would take the squatter for the server. Below 1024
 * rdma_cm lets only a process with CAP_NET_BIND_SERVICE listen, so an
 * answer from the warden's port (SOVIA_WARDEN_PORT) is the host's own. A
 * server's libsovia proves to the warden, over a Unix socket, that it
 * holds the TCP listening socket (it passes the socket itself) and names
 * its RDMA listener's port; the warden answers a client's upgrade request
 * with a redirect to that port (cmdata.h, SV_CM_REJ_REDIRECT) or with
 * SV_CM_REJ_UNKNOWN.
 *
 * The registration, one per Unix connection (SOCK_SEQPACKET), 8 bytes:
 *   0-3  magic "SOVW"
 *   4    version (1)
 *   5    zero
 *   6-7  the RDMA listener's port (little-endian)
 * with exactly one fd (SCM_RIGHTS): the listening TCP socket. The warden
 * answers one byte, 'y' or 'n'. The registration lasts as long as the
 * connection: the registrant's process keeps it open while its RDMA
 * listener lives (a fork's child closes its copies). */
#ifndef SV_WARDEN_H
#define SV_WARDEN_H

#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* In a directory of root's, under /run where only root may create one: no
 * other user can listen there first and be handed listening sockets. */
#define SV_WARDEN_SOCKET "/run/sovia/warden.sock"
#define SV_WARDEN_MAGIC 0x57564f53u /* "SOVW" on the wire */
#define SV_WARDEN_VERSION 1
#define SV_WARDEN_MSG_LEN 8
/* SV_WARDEN_PORT (config.h): SOVIA_WARDEN_PORT's default, and the
 * warden's. */

/* The registration's wire format (cmdata.c). */
void sv_warden_msg_encode(uint16_t rdma_port, uint8_t out[SV_WARDEN_MSG_LEN]);
/* The port a registration names: 0, or -EPROTO. */
int sv_warden_msg_decode(const uint8_t *in, size_t len, uint16_t *rdma_port);

/* ---- The library's side (warden.c) ---- */

/* Register the application's listening socket listen_fd, whose RDMA
 * listener is at rdma_port, with the warden at `path` (SV_WARDEN_SOCKET in
 * the library), which must be root's or the caller's own user's. Waits up
 * to timeout_ms for the answer (0: not at all, the registration is taken
 * for made). A handle (>= 0),
 * or -errno: -ENOENT when no warden runs, -EACCES when it refused. The
 * caller serializes the calls (the upgrade makes them with its lock). */
int sv_warden_register(const char *path, int listen_fd, uint16_t rdma_port, int timeout_ms);
/* Where the library registers: SV_WARDEN_SOCKET (the stream-layer tests
 * put their own warden's). */
extern const char *sv_warden_path;
/* The RDMA listener is gone: so is its registration. */
void sv_warden_unregister(int handle);
/* In a fork's child: the parent's registrations are the parent's (the
 * child's copies of their connections are closed, so that the warden
 * forgets each when the parent lets it go). */
void sv_warden_atfork_child(void);

#endif
