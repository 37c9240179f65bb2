/* rxe's doorbell over ioctl, for a post whose write() the kernel refused
 * (credentials changed since the device file was opened): verbs_db.c. */
#ifndef SV_VERBS_DB_H
#define SV_VERBS_DB_H

struct ibv_qp;

/* Start the sends qp's provider queued: 0, or -EINVAL when the device is
 * not rxe (nothing is started), or another -errno. */
int sv_verbs_ring_rxe(struct ibv_qp *qp);

#endif
