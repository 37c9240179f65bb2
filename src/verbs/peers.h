/* Which peers speak libsovia: a small table shared by the user's processes
 * (a file in /dev/shm, mapped), so that a fresh process knows before its
 * first byte whether a new connection's peer will take it to RDMA.
 *
 * Its entries are hints, never trusted for correctness: the upgrade still
 * proves the RDMA peer is the TCP peer, and a hint only decides whether a
 * new connection holds its first writes for its QP (bounded by
 * SOVIA_PEER_HOLD_MS) and starts its upgrade at once. A wrong or lost
 * entry costs one connection its first bytes on TCP, or one bounded hold.
 *
 * Four kinds of entry. Keyed by address: a host whose libsovia took a
 * connection to RDMA, with the time that took (or, for a minute, a host
 * with no RDMA route); a host's port where no libsovia listened (a plain
 * server), so that its clients neither wait nor try for a minute; and a
 * host whose client did not ask for RDMA while a server held its first
 * writes (a plain client), so that the server does not hold for it again.
 * And one of the user's own: the longest this host's rdma_cm took to
 * start, which tells how long a first contact may hold. */
#ifndef SV_PEERS_H
#define SV_PEERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Does a new connection to (client) or from (!client) this peer expect
 * RDMA? True when its host took a connection to RDMA lately and, for a
 * client, the peer's port is not known to be plain. *setup_us: how long
 * that connection took from its start to its first byte on the QP. */
bool sv_peers_expect(const struct sockaddr_storage *peer, bool client, uint32_t *setup_us);

/* Is a client's connection to this peer known, within the last minute, to
 * have no libsovia listener at its port or no RDMA route to its host? It
 * then need not try: the kernel keeps it, at the kernel's cost. (After a
 * minute it tries again: a server may have been restarted with libsovia.) */
bool sv_peers_plain(const struct sockaddr_storage *peer);

/* A connection with this peer reached RDMA `setup_us` after its start.
 * A client's port is no longer plain. */
void sv_peers_learn(const struct sockaddr_storage *peer, bool client, uint32_t setup_us);

/* A client found no libsovia at this peer's port: its next connections
 * there do not wait. */
void sv_peers_plain_port(const struct sockaddr_storage *peer);

/* No RDMA path to this peer's host (now): it is forgotten as a libsovia
 * host, and known to have no route for a minute. */
void sv_peers_no_route(const struct sockaddr_storage *peer);

/* Is a connection from this client's host a first contact: nothing
 * known of it (neither libsovia nor a plain client) within a day? */
bool sv_peers_first_contact(const struct sockaddr_storage *peer);

/* A client of this host did not ask for RDMA while our first writes
 * waited for it: a first contact from there holds no more, for a day (or
 * until a connection with it reaches RDMA). */
void sv_peers_plain_client(const struct sockaddr_storage *peer);

/* This process's rdma_cm took `us` microseconds to start. */
void sv_peers_note_startup(uint32_t us);

/* The longest rdma_cm start-up of the user's processes on this host
 * within a day, or of this process and the processes it was forked from
 * (microseconds; 0: none known). */
uint32_t sv_peers_startup(void);

/* Use the table at `path` (created 0600 if missing) instead of the
 * default one, or a table of this process only (path NULL): for tests.
 * Before any other call. */
void sv_peers_use(const char *path);

#endif
