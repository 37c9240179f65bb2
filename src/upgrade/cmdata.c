#include "cmdata.h"

#include "le.h"
#include "warden.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

/* Request layout:
 *   0  magic      u32
 *   4  version    u8
 *   5  family     u8   4 or 6
 *   6  nrecv      u16
 *   8  buf_size   u32
 *  12  client port u16 (network order, as in sockaddr)
 *  14  server port u16
 *  16  challenge  8 bytes
 *  24  client addr, server addr: 4+4 (IPv4) or 16+16 (IPv6)   -> 32 or 56 bytes */

static void make_addr(struct sockaddr_storage *ss, const uint8_t *a, int v4, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	if (v4) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		memcpy(&in->sin_addr, a, 4);
		in->sin_port = port;
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
		in6->sin6_family = AF_INET6;
		memcpy(&in6->sin6_addr, a, 16);
		in6->sin6_port = port;
	}
}

int sv_cm_req_encode(const struct sv_cm_req *r, uint8_t *out)
{
	uint8_t c[16], s[16];
	uint16_t cp, sp;
	int cv4, sv4;
	if (sv_addr16(&r->client, c, &cp, &cv4) < 0 || sv_addr16(&r->server, s, &sp, &sv4) < 0)
		return -EAFNOSUPPORT;
	int v4 = cv4 && sv4;
	memset(out, 0, SV_CM_REQ_MAX);
	sv_put32(out, SV_CM_MAGIC);
	out[4] = r->version;
	out[5] = v4 ? 4 : 6;
	sv_put16(out + 6, r->nrecv);
	sv_put32(out + 8, r->buf_size);
	memcpy(out + 12, &cp, 2);
	memcpy(out + 14, &sp, 2);
	memcpy(out + 16, r->challenge, SV_CHALLENGE_SIZE);
	if (v4) {
		memcpy(out + 24, c + 12, 4);
		memcpy(out + 28, s + 12, 4);
		return 32;
	}
	memcpy(out + 24, c, 16);
	memcpy(out + 40, s, 16);
	return 56;
}

int sv_cm_req_decode(const uint8_t *in, size_t len, struct sv_cm_req *r)
{
	memset(r, 0, sizeof(*r));
	if (!in || len < 5 || sv_get32(in) != SV_CM_MAGIC)
		return -EPROTO;
	r->version = in[4];
	if (r->version != SV_CM_VERSION)
		return -EPROTONOSUPPORT;
	if (len < 32)
		return -EPROTO;
	int fam = in[5];
	if (fam != 4 && fam != 6)
		return -EPROTO;
	if (fam == 6 && len < 56)
		return -EPROTO;
	r->nrecv = sv_get16(in + 6);
	r->buf_size = sv_get32(in + 8);
	uint16_t cp, sp;
	memcpy(&cp, in + 12, 2);
	memcpy(&sp, in + 14, 2);
	memcpy(r->challenge, in + 16, SV_CHALLENGE_SIZE);
	if (fam == 4) {
		make_addr(&r->client, in + 24, 1, cp);
		make_addr(&r->server, in + 28, 1, sp);
	} else {
		make_addr(&r->client, in + 24, 0, cp);
		make_addr(&r->server, in + 40, 0, sp);
	}
	return 0;
}

/* Accept layout: magic u32, version u8, reserved u8, nrecv u16,
 * buf_size u32, challenge 8 bytes: 20 bytes. */
void sv_cm_rep_encode(const struct sv_cm_rep *r, uint8_t out[SV_CM_REP_LEN])
{
	memset(out, 0, SV_CM_REP_LEN);
	sv_put32(out, SV_CM_MAGIC);
	out[4] = r->version;
	sv_put16(out + 6, r->nrecv);
	sv_put32(out + 8, r->buf_size);
	memcpy(out + 12, r->challenge, SV_CHALLENGE_SIZE);
}

int sv_cm_rep_decode(const uint8_t *in, size_t len, struct sv_cm_rep *r)
{
	memset(r, 0, sizeof(*r));
	if (!in || len < 5 || sv_get32(in) != SV_CM_MAGIC)
		return -EPROTO;
	r->version = in[4];
	if (r->version != SV_CM_VERSION)
		return -EPROTONOSUPPORT;
	if (len < SV_CM_REP_LEN)
		return -EPROTO;
	r->nrecv = sv_get16(in + 6);
	r->buf_size = sv_get32(in + 8);
	memcpy(r->challenge, in + 12, SV_CHALLENGE_SIZE);
	return 0;
}

void sv_cm_rej_encode(enum sv_cm_rej why, uint8_t out[SV_CM_REJ_LEN])
{
	memset(out, 0, SV_CM_REJ_LEN);
	sv_put32(out, SV_CM_MAGIC);
	out[4] = SV_CM_VERSION;
	out[5] = (uint8_t)why;
}

void sv_cm_rej_encode_redirect(uint16_t port, uint8_t out[SV_CM_REJ_LEN])
{
	sv_cm_rej_encode(SV_CM_REJ_REDIRECT, out);
	sv_put16(out + 6, port);
}

uint16_t sv_cm_rej_port(const uint8_t *in, size_t len)
{
	if (len < SV_CM_REJ_LEN || sv_cm_rej_decode(in, len) != SV_CM_REJ_REDIRECT)
		return 0;
	return sv_get16(in + 6);
}

int sv_cm_rej_decode(const uint8_t *in, size_t len)
{
	if (!in || len < 6 || sv_get32(in) != SV_CM_MAGIC)
		return -EPROTO;
	if (in[4] != SV_CM_VERSION)
		return -EPROTONOSUPPORT;
	return in[5];
}

void sv_warden_msg_encode(uint16_t rdma_port, uint8_t out[SV_WARDEN_MSG_LEN])
{
	sv_put32(out, SV_WARDEN_MAGIC);
	out[4] = SV_WARDEN_VERSION;
	out[5] = 0;
	sv_put16(out + 6, rdma_port);
}

int sv_warden_msg_decode(const uint8_t *in, size_t len, uint16_t *rdma_port)
{
	if (!in || len != SV_WARDEN_MSG_LEN || sv_get32(in) != SV_WARDEN_MAGIC ||
	    in[4] != SV_WARDEN_VERSION || in[5] != 0 || sv_get16(in + 6) == 0)
		return -EPROTO;
	*rdma_port = sv_get16(in + 6);
	return 0;
}
