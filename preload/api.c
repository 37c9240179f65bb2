/* The public API (include/sovia.h): a program asks what libsovia does
 * with its connections. Exported with the symbol version SOVIA_1.0
 * (libsovia.map), which the header's run-time lookup asks for; the
 * interposed libc symbols stay unversioned, or the dynamic linker would
 * not let them stand in for glibc's. */
#include "preload.h"

#include "real.h"
#include "stream.h"

#define SOVIA_MODULE_BUILD
#include <sovia.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#ifndef SOVIA_VERSION_STRING
#define SOVIA_VERSION_STRING "?"
#endif

SV_EXPORT const char *sovia_version(void)
{
	return SOVIA_VERSION_STRING;
}

static uint32_t api_medium(enum sv_view_medium m)
{
	return m == SV_VIEW_RDMA ? SOVIA_MEDIUM_RDMA
	       : m == SV_VIEW_TCP ? SOVIA_MEDIUM_TCP
				    : SOVIA_MEDIUM_NONE;
}

static void fill(struct sovia_conn_info *out, const struct sv_conn_view *v)
{
	out->managed = 1;
	out->is_client = v->is_client;
	out->tx_medium = api_medium(v->tx);
	out->rx_medium = api_medium(v->rx);
	snprintf(out->state, sizeof(out->state), "%s", v->state);
	snprintf(out->fallback, sizeof(out->fallback), "%s", v->fallback);
	out->rdma_tx_bytes = v->rdma_tx_bytes;
	out->rdma_rx_bytes = v->rdma_rx_bytes;
	out->tcp_tx_bytes = v->tcp_tx_bytes;
	out->tcp_rx_bytes = v->tcp_rx_bytes;
	out->credit_stalls = v->credit_stalls;
	out->time_to_rdma_us = v->time_to_rdma_us;
}

/* An fd libsovia does not serve: the kernel's TCP carries a TCP socket. */
static void fill_kernel(int fd, struct sovia_conn_info *out)
{
	int type = 0, proto = 0;
	socklen_t l1 = sizeof(type), l2 = sizeof(proto);
	if (SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &l1) == 0 && type == SOCK_STREAM &&
	    SV_REAL(getsockopt)(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l2) == 0 &&
	    proto == IPPROTO_TCP)
		out->tx_medium = out->rx_medium = SOVIA_MEDIUM_TCP;
}

SV_EXPORT int sovia_conn_info(int fd, struct sovia_conn_info *info)
{
	int saved = errno;
	if (!info || info->size < SOVIA_CONN_INFO_SIZE_1)
		return (int)sv_ret(-EINVAL, saved);
	if (SV_REAL(fcntl)(fd, F_GETFD) < 0)
		return -1; /* EBADF */
	struct sovia_conn_info out = {0};
	snprintf(out.fallback, sizeof(out.fallback), "none");
	bool refused;
	/* From a signal handler that interrupted libsovia, an fd it serves
	 * is refused: its view needs the stream's lock. */
	struct sv_fd *f = sv_fd_for_call(fd, &refused);
	if (refused)
		return sv_refuse(fd, "sovia_conn_info", EBUSY);
	if (f && f->ops->view) {
		struct sv_conn_view v;
		sv_enter();
		f->ops->view(f, &v);
		sv_leave();
		fill(&out, &v);
	} else {
		fill_kernel(fd, &out);
	}
	sv_fd_put(f);
	/* Only what the caller's struct holds (an older program's is
	 * shorter); its size field says how much that was. */
	size_t n = info->size < sizeof(out) ? info->size : sizeof(out);
	out.size = (uint32_t)n;
	memcpy(info, &out, n);
	return (int)sv_ret(0, saved);
}
