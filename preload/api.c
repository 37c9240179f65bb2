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
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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

SV_EXPORT int sovia_conn_info(int fd, struct sovia_conn_info *info)
{
	int saved = errno;
	if (!info || info->size < offsetof(struct sovia_conn_info, state))
		return (int)sv_ret(-EINVAL, saved);
	if (SV_REAL(fcntl)(fd, F_GETFD) < 0)
		return -1; /* EBADF */
	struct sovia_conn_info out = {0};
	snprintf(out.fallback, sizeof(out.fallback), "none");
	bool refused = false;
	struct sv_fd *f = sv_passthrough() ? NULL : sv_fd_for_call(fd, &refused);
	if (refused)
		return sv_refuse(fd, "sovia_conn_info", EBUSY); /* the view needs the stream's lock */
	if (f && f->ops->view) {
		struct sv_conn_view v;
		sv_enter();
		f->ops->view(f, &v);
		sv_leave();
		fill(&out, &v);
	}
	sv_fd_put(f);
	/* Only what the caller's struct holds: an older program's is shorter. */
	size_t n = info->size < sizeof(out) ? info->size : sizeof(out);
	out.size = info->size;
	memcpy(info, &out, n);
	return (int)sv_ret(0, saved);
}
