/* rxe's doorbell, rung through the ioctl interface.
 *
 * rxe (soft-RoCE) queues a send in the user-space ring it shares with the
 * kernel, then rings with a write() of a POST_SEND command with no work
 * requests on the device file. The kernel refuses write() on an RDMA file
 * to a task whose credentials are not the very object that opened it
 * (ib_safe_file_access): after any seteuid or setgroups (ftpd changes euid
 * around each data connection's bind), and from a thread that opened the
 * file under other credentials than its own. ioctl() has no such check, and
 * the kernel's INVOKE_WRITE method runs the same POST_SEND handler: so the
 * send already queued is started that way.
 *
 * The ioctl names rxe as the driver; the kernel refuses it for any other
 * device (EINVAL), so a provider that failed its post for the same reason
 * but queued nothing is never taken for one that did. */
#include "verbs_db.h"

#include "log.h"
#include "real.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

static atomic_bool told; /* once per process */

int sv_verbs_ring_rxe(struct ibv_qp *qp)
{
	struct {
		struct ib_uverbs_ioctl_hdr hdr;
		struct ib_uverbs_attr attr[3];
	} c;
	struct ib_uverbs_post_send in;
	struct ib_uverbs_post_send_resp out;
	memset(&c, 0, sizeof(c));
	memset(&in, 0, sizeof(in));
	memset(&out, 0, sizeof(out));
	in.qp_handle = qp->handle;
	in.wr_count = 0; /* the send is in the ring: only the doorbell */
	in.wqe_size = sizeof(struct ib_uverbs_send_wr);
	c.hdr.length = sizeof(c);
	c.hdr.object_id = UVERBS_OBJECT_DEVICE;
	c.hdr.method_id = UVERBS_METHOD_INVOKE_WRITE;
	c.hdr.num_attrs = 3;
	c.hdr.driver_id = RDMA_DRIVER_RXE;
	c.attr[0] = (struct ib_uverbs_attr){
		.attr_id = UVERBS_ATTR_WRITE_CMD,
		.len = sizeof(uint64_t), /* a constant: always 64 bits, inline */
		.flags = UVERBS_ATTR_F_MANDATORY,
		.data = IB_USER_VERBS_CMD_POST_SEND,
	};
	c.attr[1] = (struct ib_uverbs_attr){
		.attr_id = UVERBS_ATTR_CORE_IN,
		.len = sizeof(in),
		.flags = UVERBS_ATTR_F_MANDATORY,
		.data = (uintptr_t)&in,
	};
	c.attr[2] = (struct ib_uverbs_attr){
		.attr_id = UVERBS_ATTR_CORE_OUT,
		.len = sizeof(out),
		.flags = UVERBS_ATTR_F_MANDATORY,
		.data = (uintptr_t)&out,
	};
	if (SV_REAL(ioctl)(qp->context->cmd_fd, RDMA_VERBS_IOCTL, &c) < 0)
		return errno > 0 ? -errno : -EIO;
	if (!atomic_exchange(&told, true))
		sv_info("verbs: the device file refuses our writes since a credential change: "
			"rxe's doorbell goes through ioctl");
	return 0;
}
