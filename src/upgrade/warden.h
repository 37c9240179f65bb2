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
 *   4    version (2)
 *   5    zero
 *   6-7  the RDMA listener's port (little-endian)
 * with exactly one fd (SCM_RIGHTS): the listening TCP socket. The warden
 * answers one byte, 'y' or 'n', and closes the connection. The
 * registration lasts as long as that socket listens: the warden keeps the
 * socket's cookie (SO_COOKIE), never the socket, and asks the kernel at
 * every answer whether it still listens there. */
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
/* Version 2: a registration lasts as long as its socket listens (not as
 * long as its connection to the warden). */
#define SV_WARDEN_VERSION 2
#define SV_WARDEN_MSG_LEN 8
/* SV_WARDEN_PORT (config.h): SOVIA_WARDEN_PORT's default, and the
 * warden's. */

/* The registration's wire format (cmdata.c). */
void sv_warden_msg_encode(uint16_t rdma_port, uint8_t out[SV_WARDEN_MSG_LEN]);
/* The port a registration names: 0, or -EPROTO. */
int sv_warden_msg_decode(const uint8_t *in, size_t len, uint16_t *rdma_port);

/* ---- The library's side (warden.c) ---- */

/* Register the application's listening socket listen_fd, whose RDMA
 * listener is at rdma_port, with the warden at sv_warden_path, which must
 * be root's or the caller's own user's: on a thread of libsovia's own, so
 * that no caller waits for a warden that hangs (or does not answer in
 * time). The registration lasts as long as the socket listens: the
 * warden confirms that at every answer. `must`: the RDMA listener is not
 * on the socket's own port (another process holds that in rdma_cm's
 * space), so only the warden's clients find it: done(arg, r) then hears
 * the warden's answer (0; -ENOENT no warden; -EACCES refused; -ETIMEDOUT
 * no answer in SV_WARDEN_WAIT_MS), else the registration is taken for
 * made once sent (r 0) or said once why not. done runs on that thread,
 * with no lock of libsovia's held. 0 when queued, or -errno. No copy of
 * listen_fd is held meanwhile (it would keep the port bound past the
 * application's close): the socket is passed if its number still names
 * it (the same SO_COOKIE), else the registration is dropped (-ECANCELED). */
#define SV_WARDEN_WAIT_MS 500
int sv_warden_register(int listen_fd, uint16_t rdma_port, bool must,
		       void (*done)(void *arg, int r), void *arg);
/* Where the library registers: SV_WARDEN_SOCKET (the stream-layer tests
 * put their own warden's). */
extern const char *sv_warden_path;
/* In a fork's child: the parent's registrations under way are the
 * parent's. */
void sv_warden_atfork_child(void);

#endif
