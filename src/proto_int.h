/* Internal to the protocol core: what proto.c shares with proto_back.c
 * (the way back, BACK and RETURN). Not for the stream layer: proto.h is the
 * core's contract. */
#ifndef SV_PROTO_INT_H
#define SV_PROTO_INT_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Receive buffers posted by this side (window + reserve). */
uint32_t sv_pr_nrecv(const struct sv_proto *p);
/* The connection is broken with err: every later call returns it. */
void sv_pr_fail(struct sv_proto *p, int err);
/* Post one message from send buffer `slot` (header written here, payload
 * already in place, or zero copy from zc); carries the credit report. */
int sv_pr_post(struct sv_proto *p, uint32_t slot, uint8_t type, uint64_t seq, uint32_t len,
	       const struct iovec *zc, int zccnt);
/* A free send buffer, or -EAGAIN. */
int sv_pr_take_slot(struct sv_proto *p, uint32_t *slot);
/* DATA may go: a credit above the reserve and a free send buffer. */
bool sv_pr_can_send_data(const struct sv_proto *p);
/* A receive buffer's data was consumed (small: below coalesce_size). */
void sv_pr_consumed(struct sv_proto *p, bool small);
/* The ACK policy (docs/protocol.md, section 6). */
int sv_pr_ack_policy(struct sv_proto *p, uint64_t now);
/* Send the coalescing buffer now; -EAGAIN without a data credit. */
int sv_pr_flush_pending(struct sv_proto *p, enum sv_flush_reason why);
/* Repost a receive buffer whose contents are done with. */
int sv_pr_repost_control(struct sv_proto *p, uint32_t buf);
/* Repost the buffer the last receive call emptied (p->rx_held), if any. */
int sv_pr_rx_release(struct sv_proto *p);
/* Append to the bytes we give back to the peer. */
int sv_pr_ret_append(struct sv_proto *p, const void *data, size_t len);
/* proto_back.c: once every returned byte is in, the bytes that never
 * went over the QP (collected without a credit) follow them. */
int sv_pr_owed_tail(struct sv_proto *p);

#endif
