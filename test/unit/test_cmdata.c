/* The rdma_cm private data of an upgrade: layout, limits, refusals. */
#include "cmdata.h"
#include "addr.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

TestSuite(cmdata, .timeout = 10);



Test(cmdata, ipv4_request_round_trip_and_layout)
{
	struct sv_cm_req r = {.version = SV_CM_VERSION, .nrecv = 36, .buf_size = 32768,
			      .client = v4("10.77.0.2", 40001), .server = v4("10.77.0.1", 5001)};
	memcpy(r.challenge, "ABCDEFGH", 8);
	uint8_t pd[SV_CM_REQ_MAX];
	cr_assert_eq(sv_cm_req_encode(&r, pd), 32);
	cr_assert_eq(pd[0], 0x53); /* "SOVA", little-endian magic */
	cr_assert_eq(pd[4], SV_CM_VERSION);
	cr_assert_eq(pd[5], 4);
	cr_assert_eq(pd[6], 36);
	cr_assert_eq(pd[12], 40001 >> 8); /* ports in network order */
	cr_assert_eq(memcmp(pd + 16, "ABCDEFGH", 8), 0);
	cr_assert_eq(pd[24], 10);
	cr_assert_eq(pd[27], 2);
	struct sv_cm_req d;
	cr_assert_eq(sv_cm_req_decode(pd, 32, &d), 0);
	cr_assert(sv_addr_equal(&d.client, &r.client));
	cr_assert(sv_addr_equal(&d.server, &r.server));
	cr_assert_eq(d.nrecv, 36);
	cr_assert_eq(d.buf_size, 32768);
	cr_assert_eq(memcmp(d.challenge, r.challenge, 8), 0);
}

Test(cmdata, ipv6_request_fits_the_56_byte_limit)
{
	struct sv_cm_req r = {.version = SV_CM_VERSION, .nrecv = 1024, .buf_size = 1 << 20,
			      .client = v6("fd00::2", 40001), .server = v6("fd00::1", 5001)};
	uint8_t pd[SV_CM_REQ_MAX];
	cr_assert_eq(sv_cm_req_encode(&r, pd), 56);
	struct sv_cm_req d;
	cr_assert_eq(sv_cm_req_decode(pd, 56, &d), 0);
	cr_assert(sv_addr_equal(&d.client, &r.client));
	cr_assert(sv_addr_equal(&d.server, &r.server));
	cr_assert_eq(sv_cm_req_decode(pd, 40, &d), -EPROTO, "a truncated IPv6 request");
}

Test(cmdata, foreign_and_other_version_are_told_apart)
{
	uint8_t junk[56] = "rsockets or anything else";
	struct sv_cm_req d;
	cr_assert_eq(sv_cm_req_decode(junk, sizeof(junk), &d), -EPROTO);
	cr_assert_eq(sv_cm_req_decode(NULL, 0, &d), -EPROTO);
	struct sv_cm_req r = {.version = SV_CM_VERSION, .client = v4("1.2.3.4", 1),
			      .server = v4("1.2.3.5", 2)};
	uint8_t pd[SV_CM_REQ_MAX];
	sv_cm_req_encode(&r, pd);
	pd[4] = SV_CM_VERSION + 1;
	cr_assert_eq(sv_cm_req_decode(pd, 32, &d), -EPROTONOSUPPORT);
	cr_assert_eq(d.version, SV_CM_VERSION + 1);
	pd[4] = SV_CM_VERSION;
	pd[5] = 5; /* no such family */
	cr_assert_eq(sv_cm_req_decode(pd, 32, &d), -EPROTO);
}

Test(cmdata, reply_round_trip)
{
	struct sv_cm_rep r = {.version = SV_CM_VERSION, .nrecv = 20, .buf_size = 4096};
	memcpy(r.challenge, "12345678", 8);
	uint8_t pd[SV_CM_REP_LEN];
	sv_cm_rep_encode(&r, pd);
	struct sv_cm_rep d;
	cr_assert_eq(sv_cm_rep_decode(pd, sizeof(pd), &d), 0);
	cr_assert_eq(d.nrecv, 20);
	cr_assert_eq(d.buf_size, 4096);
	cr_assert_eq(memcmp(d.challenge, "12345678", 8), 0);
	cr_assert_eq(sv_cm_rep_decode(pd, 10, &d), -EPROTO);
}

Test(cmdata, mapped_ipv4_equals_ipv4)
{
	struct sockaddr_storage a = v4("10.0.0.1", 80), b = v6("::ffff:10.0.0.1", 80),
				c = v6("::ffff:10.0.0.1", 81);
	cr_assert(sv_addr_equal(&a, &b));
	cr_assert_not(sv_addr_equal(&a, &c));
	cr_assert(sv_addr_same_host(&a, &c));
}

/* A redirect names the port to ask at; any other rejection names none. */
Test(cmdata, a_redirect_carries_its_port)
{
	uint8_t pd[SV_CM_REJ_LEN];
	sv_cm_rej_encode_redirect(60957, pd);
	cr_assert_eq(sv_cm_rej_decode(pd, sizeof(pd)), SV_CM_REJ_REDIRECT);
	cr_assert_eq(sv_cm_rej_port(pd, sizeof(pd)), 60957);
	cr_assert_eq(pd[6], 60957 & 0xff, "the port is little-endian at offset 6");
	cr_assert_eq(sv_cm_rej_port(pd, 6), 0, "a short rejection names no port");
	sv_cm_rej_encode(SV_CM_REJ_BUSY, pd);
	cr_assert_eq(sv_cm_rej_port(pd, sizeof(pd)), 0, "busy is no redirect");
}
