/* What the kernel says of another process's sockets: whether it holds one
 * (its /proc fd links) and which socket a TCP connection is (sock_diag).
 * Neither call can be made to wait by the process looked at: procfs and
 * netlink answer from the kernel's own tables. */
#ifndef SV_PROCFD_H
#define SV_PROCFD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Has pid exited (not reaped yet)? */
bool sv_pid_zombie(pid_t pid);

/* How many of process pid's fds are the socket whose inode is ino, up to
 * max? Unknown (no access to its fds) counts as max; an ended process
 * holds none. Async-signal-safe (no allocation). */
int sv_pid_fds(pid_t pid, uint64_t ino, int max);
static inline bool sv_pid_holds(pid_t pid, uint64_t ino)
{
	return sv_pid_fds(pid, ino, 1) > 0;
}

/* Only what could be seen: false when pid's fds cannot be listed. */
bool sv_pid_surely_holds(pid_t pid, uint64_t ino);

/* The inode of the TCP socket of this network namespace whose own address
 * is local and whose peer's is peer (IPv4, IPv6 or v4-mapped), in *ino:
 * 0, -ENOENT when there is none, or -errno. */
int sv_tcp_inode(const struct sockaddr_storage *local, const struct sockaddr_storage *peer,
		 uint64_t *ino);

#endif
