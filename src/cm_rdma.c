/* The connection manager the library uses: librdmacm, and a verbs QP on
 * libsovia's own device context for each connection (verbs.c). */
#include "cm.h"

#include "ownfd.h"
#include "verbs.h"

/* librdmacm opens every device once and keeps its context for the
 * process: those files are libsovia's, not the application's, and a
 * daemon's close-all must not take them (ownfd.h). */
static struct rdma_event_channel *create_event_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	int n = 0;
	struct ibv_context **ctxs = ch ? rdma_get_devices(&n) : NULL;
	if (ctxs) {
		for (int i = 0; i < n; i++) {
			sv_ownfd_add(ctxs[i]->cmd_fd);
			sv_ownfd_add(ctxs[i]->async_fd);
		}
		rdma_free_devices(ctxs);
	}
	return ch;
}

static int create_qp(struct sv_qp **out, struct rdma_cm_id *id, const struct sv_proto_params *prm)
{
	struct sv_verbs *v;
	int r = sv_verbs_create(&v, id, prm);
	*out = r < 0 ? NULL : sv_verbs_qp(v);
	return r;
}

const struct sv_cm_ops sv_cm_rdma = {
	.create_event_channel = create_event_channel,
	.create_id = rdma_create_id,
	.destroy_id = rdma_destroy_id,
	.resolve_addr = rdma_resolve_addr,
	.resolve_route = rdma_resolve_route,
	.connect = rdma_connect,
	.accept = rdma_accept,
	.reject = rdma_reject,
	.establish = rdma_establish,
	.disconnect = rdma_disconnect,
	.bind_addr = rdma_bind_addr,
	.listen = rdma_listen,
	.get_event = rdma_get_cm_event,
	.ack_event = rdma_ack_cm_event,
	.peer_addr = rdma_get_peer_addr,
	.local_addr = rdma_get_local_addr,
	.create_qp = create_qp,
	.atfork_child = sv_verbs_atfork_child,
};

const struct sv_cm_ops *sv_cm = &sv_cm_rdma;

void sv_cm_use(const struct sv_cm_ops *ops)
{
	sv_cm = ops;
}
