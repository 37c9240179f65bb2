/* Other processes' sockets: see procfd.h. */
#include "procfd.h"

#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Has pid exited (not reaped yet)? Its fds are closed, but an unprivileged
 * parent may not list them (EACCES). */
bool sv_pid_zombie(pid_t pid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = SV_REAL(read)(fd, buf, sizeof(buf) - 1);
	SV_REAL(close)(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	const char *close_paren = strrchr(buf, ')'); /* the name may hold any byte */
	return close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

/* How many of process pid's fds are the socket whose inode is ino, up to
 * max? Unknown (no access to its fds) counts as max. With the directory
 * read by getdents64 into the stack, not opendir: a copy's read or write
 * looks (sv_shares_adopt), and it may be a signal handler's that
 * interrupted malloc. */
static int pid_fds(pid_t pid, uint64_t ino, int max, int unknown)
{
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 0;
	char path[64], link[64], want[40];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "socket:[%" PRIu64 "]", ino);
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) /* ENOENT: it ended meanwhile */
		return errno != ENOENT && !sv_pid_zombie(pid) ? unknown : 0;
	int found = 0;
	_Alignas(8) char buf[2048];
	long n;
	while (found < max && (n = sv_real_syscall()(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n && found < max;) {
			/* struct linux_dirent64: ino 8, off 8, reclen 2, type 1, name */
			unsigned short reclen;
			memcpy(&reclen, buf + off + 16, sizeof(reclen));
			const char *name = buf + off + 19;
			off += reclen;
			if (name[0] == '.')
				continue;
			ssize_t len = readlinkat(dfd, name, link, sizeof(link) - 1);
			if (len <= 0)
				continue;
			link[len] = '\0';
			found += strcmp(link, want) == 0;
		}
	}
	SV_REAL(close)(dfd);
	return found;
}

int sv_pid_fds(pid_t pid, uint64_t ino, int max)
{
	return pid_fds(pid, ino, max, max);
}

bool sv_pid_surely_holds(pid_t pid, uint64_t ino)
{
	return pid_fds(pid, ino, 1, 0) > 0;
}

/* One exact socket by its four addresses: the kernel answers a request
 * without NLM_F_DUMP in its own send, so the reply is there at once. */
int sv_tcp_inode(const struct sockaddr_storage *local, const struct sockaddr_storage *peer,
		 uint64_t *ino)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
	} req = {
		.nh = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		       .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = 1},
		.r = {.sdiag_family = (uint8_t)local->ss_family, .sdiag_protocol = IPPROTO_TCP,
		      .idiag_states = ~0u},
	};
	if (local->ss_family != peer->ss_family)
		return -EAFNOSUPPORT;
	if (local->ss_family == AF_INET) {
		const struct sockaddr_in *l = (const void *)local, *p = (const void *)peer;
		req.r.id.idiag_sport = l->sin_port;
		req.r.id.idiag_dport = p->sin_port;
		memcpy(req.r.id.idiag_src, &l->sin_addr, 4);
		memcpy(req.r.id.idiag_dst, &p->sin_addr, 4);
	} else if (local->ss_family == AF_INET6) {
		const struct sockaddr_in6 *l = (const void *)local, *p = (const void *)peer;
		req.r.id.idiag_sport = l->sin6_port;
		req.r.id.idiag_dport = p->sin6_port;
		memcpy(req.r.id.idiag_src, &l->sin6_addr, 16);
		memcpy(req.r.id.idiag_dst, &p->sin6_addr, 16);
	} else {
		return -EAFNOSUPPORT;
	}
	req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	int fd = SV_REAL(socket)(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
				 NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -errno;
	int r = -EPROTO;
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	if (SV_REAL(sendto)(fd, &req, sizeof(req), 0, (struct sockaddr *)&kernel,
			    sizeof(kernel)) < 0) {
		r = -errno;
		goto close_fd;
	}
	union {
		char buf[1024];
		struct nlmsghdr align;
	} rb;
	ssize_t n = SV_REAL(recv)(fd, rb.buf, sizeof(rb.buf), MSG_DONTWAIT);
	if (n < 0) {
		r = -errno;
		goto close_fd;
	}
	for (struct nlmsghdr *h = &rb.align; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			r = e->error ? e->error : -ENOENT;
			break;
		}
		if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
		    h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
			const struct inet_diag_msg *m = NLMSG_DATA(h);
			*ino = m->idiag_inode;
			r = m->idiag_inode ? 0 : -ENOENT;
			break;
		}
	}
close_fd:
	SV_REAL(close)(fd);
	return r;
}
