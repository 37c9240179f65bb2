/* The rdma_cm private data of an upgrade: the connect request (client to
 * server, at most 56 bytes on RDMA_PS_TCP) and the accept (server to
 * client). Layouts are in docs/protocol.md. All integers little-endian. */
#ifndef SV_CMDATA_H
#define SV_CMDATA_H

#include "addr.h"
#include "proto.h"

#include <stdint.h>
#include <sys/socket.h>

#define SV_CM_MAGIC 0x41564f53u /* "SOVA" on the wire */
/* 3: receive buffers grow, the header's flags give their size, DRAIN gives
 * them back (docs/protocol.md, 5). 4: a lost QP resumes over TCP with the
 * resume records (docs/protocol.md, 11). */
#define SV_CM_VERSION 4
#define SV_CM_REQ_MAX 56

struct sv_cm_req {
	uint8_t version;
	uint16_t nrecv;    /* the client's receive buffers: the server's credits */
	uint32_t buf_size; /* their size */
	struct sockaddr_storage client, server; /* the TCP connection, as the client sees it */
	uint8_t challenge[SV_CHALLENGE_SIZE];    /* the server must echo it on TCP */
};

struct sv_cm_rep {
	uint8_t version;
	uint16_t nrecv;
	uint32_t buf_size;
	uint8_t challenge[SV_CHALLENGE_SIZE]; /* the client must echo it on TCP */
};

/* Encode into out (SV_CM_REQ_MAX bytes); returns the length or -EAFNOSUPPORT. */
int sv_cm_req_encode(const struct sv_cm_req *r, uint8_t *out);
/* Decode; -EPROTO for a foreign or malformed request, -EPROTONOSUPPORT for
 * our magic with another version (r->version says which). */
int sv_cm_req_decode(const uint8_t *in, size_t len, struct sv_cm_req *r);

/* A rejection's private data (8 bytes): magic u32, version u8, reason u8,
 * u16: a redirect's port, else zero. Without it (no private data) the
 * reason is "no". */
enum sv_cm_rej {
	SV_CM_REJ_NO = 0,          /* refused (or another version: see version) */
	SV_CM_REJ_WRITE_FIRST = 1, /* the server's accept() waits for the client's
				    * first bytes (TCP_DEFER_ACCEPT): write them on
				    * TCP and ask again */
	SV_CM_REJ_BUSY = 2,        /* the server holds as many requests waiting
				    * for their accept() as it keeps: ask again */
	SV_CM_REJ_REDIRECT = 3,    /* another process of the server holds the
				    * connection: ask at the port in bytes 6-7 */
	SV_CM_REJ_LATER = 4,       /* the connection, back on TCP, is shared with
				    * another process of the server's for now:
				    * ask again later */
	SV_CM_REJ_UNKNOWN = 5,     /* sovia-warden (warden.h): no libsovia
				    * listener is registered for the server's
				    * address and port (yet) */
};
#define SV_CM_REJ_LEN 8
void sv_cm_rej_encode(enum sv_cm_rej why, uint8_t out[SV_CM_REJ_LEN]);
/* The reason a rejection gives: SV_CM_REJ_*, -EPROTONOSUPPORT for ours of
 * another version, -EPROTO for none or a foreign one. */
int sv_cm_rej_decode(const uint8_t *in, size_t len);
/* A redirect to `port` (host order), and the port a rejection redirects
 * to (0: none). */
void sv_cm_rej_encode_redirect(uint16_t port, uint8_t out[SV_CM_REJ_LEN]);
uint16_t sv_cm_rej_port(const uint8_t *in, size_t len);

#define SV_CM_REP_LEN 20
void sv_cm_rep_encode(const struct sv_cm_rep *r, uint8_t out[SV_CM_REP_LEN]);
int sv_cm_rep_decode(const uint8_t *in, size_t len, struct sv_cm_rep *r);

#endif
