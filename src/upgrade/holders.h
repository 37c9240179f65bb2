/* Which process of a server holds an accepted connection that the port's
 * owner cannot match (docs/protocol.md, section 3, "Redirects").
 *
 * The RDMA listener on a port belongs to the process that called listen()
 * (rdma_cm's port space has one listener per port). Prefork servers (nginx,
 * Apache, gunicorn) accept in children that inherited the listening
 * socket, so the client's upgrade request reaches a process that does not
 * hold the connection. The listening process makes this table in shared
 * memory (a sealed memfd, MAP_SHARED) before it forks; each child that
 * accepts on the inherited socket opens an RDMA listener of its own on the
 * same address, any port, and enters its connections with that port. The
 * owner answers a request it cannot match by telling the client to ask at
 * that port instead.
 *
 * The table is a hint, never trusted for correctness: the process at the
 * port still matches the request to a connection it accepted, and the echo
 * on TCP still proves the peer. A wrong or stale entry costs one upgrade. */
#ifndef SV_HOLDERS_H
#define SV_HOLDERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct sv_holders;

/* The process's table, made at its first call (by a process that listens,
 * before it forks); NULL when it cannot be had (the caller does without). */
struct sv_holders *sv_holders_get(void);

/* The memfd behind the process's own table (sv_holders_get), or -1: none
 * could be made (an anonymous mapping then, which an exec loses), or h is
 * another table (sv_holders_attach's caller has its fd). An exec'd image
 * that inherits a copy of it finds the entries its predecessor adopted
 * (inetd-style servers: accept, fork, exec). The fd is one of libsovia's
 * own (ownfd.h), close-on-exec, so the application's close-all loops keep
 * it and only a deliberate copy crosses an exec. */
int sv_holders_fd(const struct sv_holders *h);

/* In an exec'd image: map the table whose memfd it inherited, to check
 * and claim the connections handed across the exec. Not the process's own
 * table (sv_holders_get): this image's listeners make a fresh one. NULL
 * unless fd is a sealed table of this layout, owned and made by this
 * image's user and group (real and effective alike), so that a program
 * run as another user cannot forge claims in a root server's table. The
 * caller keeps, and may close, fd; the mapping stays. */
struct sv_holders *sv_holders_attach(int fd);
/* Is fd a holders' table's file (whoever made it)? An exec'd image closes
 * only such an fd, never an application's file that took the number. */
bool sv_holders_is_table(int fd);

/* The process changed its user or group ids (preload/creds.c): it may
 * not write to what its family reads, nor read what they write. Its own
 * table is replaced in place by a fresh one (shared with the children it
 * forks from now on, its memfd for the images they exec), and an
 * attached one by private zeros; entries, hands and claims in them are
 * gone here. The caller spoils its hands first, so that the family's
 * port owner stops waiting for them. 0, or -errno: a mapping could not
 * be replaced (the process then still shares it). */
int sv_holders_leave_family(void);

/* A process that left its family (sv_holders_leave_family) still serves
 * the connections it accepts on a listening socket it inherited; the
 * family's table is closed to it, so it tells them to the table's maker
 * over the family's channel, which enters each one only once the kernel
 * confirms that the sender holds it.
 *
 * How many times this process left a family: a listener whose table was
 * had in an earlier era tells its entries (sv_holders_tell) instead of
 * adding them. */
unsigned sv_holders_era(void);
/* Tell (server, client) as held here at `port`, or (gone) no longer:
 * SV_HOLDERS_TOLD (an entry number that no table has, for the caller to
 * keep as its slot), or -errno (-ENOTCONN: this process left no family
 * with a channel). */
#define SV_HOLDERS_TOLD 0x7fffffff
int sv_holders_tell(const struct sockaddr_storage *server, const struct sockaddr_storage *client,
		    uint16_t port, bool gone);
/* In the maker of the process's table: enter what its family's leavers
 * told, checked (a bounded batch; with the lookups' lock). Nothing in
 * another process. */
void sv_holders_collect(void);

/* A child of the table's process inherited a listening socket: the owner
 * looks for holders from now on (sv_holders_forked). */
void sv_holders_mark_forked(struct sv_holders *h);
bool sv_holders_forked(const struct sv_holders *h);
/* Entries made so far, by every process of the family: a lookup that
 * failed cannot succeed before it changes. */
uint64_t sv_holders_adds(const struct sv_holders *h);

/* Enter the accepted connection (server, client) as held by this process,
 * whose RDMA listener for it is at `port` (of the server's address). The
 * entry's index, or -ENOSPC when the table is full. */
int sv_holders_add(struct sv_holders *h, const struct sockaddr_storage *server,
		   const struct sockaddr_storage *client, uint16_t port);
/* Remove this process's entry. */
void sv_holders_remove(struct sv_holders *h, int slot);
/* The port of the process holding (server, client), or 0. Entries of
 * processes that exited are dropped on the way. */
uint16_t sv_holders_find(struct sv_holders *h, const struct sockaddr_storage *server,
			 const struct sockaddr_storage *client);

/* A connection handed to a fork's child (accept-then-fork servers: the
 * parent accepts, forks, closes its copy; docs/design.md, "Copies of a
 * connection"). Both processes hold it after the fork, so it stays on
 * plain TCP until the child holds it alone: the parent enters it before
 * the fork, the child adopts it and claims it with the port of its own
 * RDMA listener, and the port's owner redirects the client there only
 * once the parent has released its copy (or exited) and nobody else
 * took it or did I/O on the parent's copy. */
struct sv_hand {
	struct sv_holders *h; /* NULL: none */
	int slot;
	uint64_t gen;
	/* The stream's offsets less the kernel's counts of the socket, each
	 * way (modulo 2^64): zero unless the connection was on RDMA before
	 * it was handed (the QP's bytes never passed the kernel). Constant
	 * from the hand on (TCP carries both); an exec'd image, which reads
	 * the kernel's counts, adds them. */
	uint64_t dtx, drx;
};
/* Enter (server, client) as handed by this process (before the fork).
 * 0 or -errno. Marks the table forked. */
int sv_holders_hand(struct sv_holders *h, const struct sockaddr_storage *server,
		    const struct sockaddr_storage *client, struct sv_hand *out);
/* In the child: take it. False when the entry is gone or another child
 * took it first (it then stays TCP for good: three holders). */
bool sv_holders_adopt(const struct sv_hand *hd);
/* The child's RDMA listener for it is at `port`. */
void sv_holders_claim(const struct sv_hand *hd, uint16_t port);
/* In an exec'd image, before it trusts what it was told: is hd's entry
 * (the same generation) still a connection handed and adopted by this
 * process (exec keeps the pid), not spoiled, between exactly server and
 * client? */
bool sv_holders_check(const struct sv_hand *hd, const struct sockaddr_storage *server,
		      const struct sockaddr_storage *client);
/* The parent released its copy (close). */
void sv_holders_release_first(const struct sv_hand *hd);
/* Another copy or I/O the child's counts miss: it stays TCP. */
void sv_holders_spoil(const struct sv_hand *hd);
/* Does this process, the adopting child, hold it alone now? */
bool sv_holders_sole(const struct sv_hand *hd);
/* Remove it, if it is still hd's and this process is one of its holders
 * (the child once it is served or gone; the parent after a failed fork). */
void sv_holders_drop(const struct sv_hand *hd);

/* In a fork's child: the table stays (the family shares it). */

#endif
