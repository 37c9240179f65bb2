/* Fuzz target: the rdma_cm private data decoders (src/cmdata.c). Whatever a
 * connect request, an accept or a rejection carries (the peer's, or a
 * foreign rdma_cm user's), decoding must stay inside the bytes it is
 * given, say -EPROTO or -EPROTONOSUPPORT for what it refuses, and for what
 * it takes give fields that encode back to the same bytes.
 *
 * The input is used whole as each kind of private data in turn, as a
 * registration sovia-warden reads (warden.h), and as a script of
 * registrations, listeners that close and lookups for the warden's table
 * (tools/warden_table.c), which must answer only for a live listener a
 * connection reaches, its very address first. */
#include "fuzz.h"

#include "cmdata.h"
#include "warden_table.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(int line, const char *cond, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));

static void fail(int line, const char *cond, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "fuzz_cmdata.c:%d: %s: ", line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

#define CHECK(c, ...)                                     \
	do {                                              \
		if (!(c))                                 \
			fail(__LINE__, #c, __VA_ARGS__); \
	} while (0)

static bool is_ours(const uint8_t *in, size_t len)
{
	return in && len >= 5 && in[0] == (SV_CM_MAGIC & 0xff) &&
	       in[1] == (SV_CM_MAGIC >> 8 & 0xff) && in[2] == (SV_CM_MAGIC >> 16 & 0xff) &&
	       in[3] == (SV_CM_MAGIC >> 24 & 0xff);
}

static bool both_v4(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	return a->ss_family == AF_INET && b->ss_family == AF_INET;
}

/* An IPv6 address that is IPv4-mapped: it encodes as IPv4. */
static bool mapped(const struct sockaddr_storage *a)
{
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;
	return a->ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr);
}

static void check_addr_relations(const struct sockaddr_storage *a,
				 const struct sockaddr_storage *b)
{
	CHECK(sv_addr_equal(a, a) && sv_addr_same_host(a, a), "an address differs from itself");
	CHECK(sv_addr_equal(a, b) == sv_addr_equal(b, a), "equality is not symmetric");
	CHECK(sv_addr_same_host(a, b) == sv_addr_same_host(b, a), "same host is not symmetric");
	CHECK(!sv_addr_equal(a, b) || sv_addr_same_host(a, b), "equal, but not the same host");
}

static void fuzz_req(const uint8_t *in, size_t len)
{
	struct sv_cm_req r;
	memset(&r, 0xEE, sizeof(r));
	int d = sv_cm_req_decode(in, len, &r);
	CHECK(d == 0 || d == -EPROTO || d == -EPROTONOSUPPORT, "req_decode returned %d", d);
	if (d == -EPROTONOSUPPORT) {
		CHECK(is_ours(in, len) && r.version == in[4] && r.version != SV_CM_VERSION,
		      "another version (%u) that is not one", r.version);
		return;
	}
	if (d < 0) {
		/* Ours with the right version but too short or of an unknown
		 * family; or not ours at all. */
		CHECK(!is_ours(in, len) || in[4] == SV_CM_VERSION, "a refusal of our version");
		return;
	}
	CHECK(is_ours(in, len) && r.version == SV_CM_VERSION, "took a request that is not ours");
	CHECK(in[5] == 4 || in[5] == 6, "took family %u", in[5]);
	CHECK(len >= (in[5] == 4 ? 32u : 56u), "took %zu bytes of family %u", len, in[5]);
	CHECK(r.client.ss_family == (in[5] == 4 ? AF_INET : AF_INET6) &&
		      r.server.ss_family == r.client.ss_family,
	      "family %u gave address families %u, %u", in[5], r.client.ss_family,
	      r.server.ss_family);
	check_addr_relations(&r.client, &r.server);

	/* It encodes back to the bytes it came from, but for IPv4-mapped IPv6
	 * addresses, which go as IPv4. */
	uint8_t out[SV_CM_REQ_MAX];
	int n = sv_cm_req_encode(&r, out);
	CHECK(n == 32 || n == 56, "req_encode returned %d", n);
	bool shrinks = in[5] == 6 && mapped(&r.client) && mapped(&r.server);
	if (!shrinks) {
		CHECK(n == (in[5] == 4 ? 32 : 56), "family %u encoded in %d bytes", in[5], n);
		CHECK(memcmp(out, in, (size_t)n) == 0,
		      "a request does not encode back to its bytes");
	}
	struct sv_cm_req r2;
	CHECK(sv_cm_req_decode(out, (size_t)n, &r2) == 0, "its own encoding is refused");
	CHECK(r2.version == r.version && r2.nrecv == r.nrecv && r2.buf_size == r.buf_size &&
		      memcmp(r2.challenge, r.challenge, SV_CHALLENGE_SIZE) == 0,
	      "fields changed on the way round");
	CHECK(sv_addr_equal(&r2.client, &r.client) && sv_addr_equal(&r2.server, &r.server),
	      "addresses changed on the way round");
	CHECK(both_v4(&r2.client, &r2.server) == (n == 32), "an IPv4 encoding decodes as IPv6");
}

static void fuzz_rep(const uint8_t *in, size_t len)
{
	struct sv_cm_rep r;
	memset(&r, 0xEE, sizeof(r));
	int d = sv_cm_rep_decode(in, len, &r);
	CHECK(d == 0 || d == -EPROTO || d == -EPROTONOSUPPORT, "rep_decode returned %d", d);
	if (d == -EPROTONOSUPPORT)
		CHECK(is_ours(in, len) && r.version == in[4] && r.version != SV_CM_VERSION,
		      "another version (%u) that is not one", r.version);
	if (d < 0)
		return;
	CHECK(is_ours(in, len) && len >= SV_CM_REP_LEN && r.version == SV_CM_VERSION,
	      "took an accept that is not ours (%zu bytes)", len);
	/* Byte 5 is reserved: sent as 0, not looked at. */
	uint8_t out[SV_CM_REP_LEN];
	sv_cm_rep_encode(&r, out);
	CHECK(out[5] == 0, "the reserved byte is %u", out[5]);
	CHECK(memcmp(out, in, 5) == 0 && memcmp(out + 6, in + 6, SV_CM_REP_LEN - 6) == 0,
	      "an accept does not encode back to its bytes");
}

static void fuzz_rej(const uint8_t *in, size_t len)
{
	int d = sv_cm_rej_decode(in, len);
	if (d < 0) {
		CHECK(d == -EPROTO || d == -EPROTONOSUPPORT, "rej_decode returned %d", d);
		CHECK(d != -EPROTONOSUPPORT || (is_ours(in, len) && in[4] != SV_CM_VERSION),
		      "another version that is not one");
		return;
	}
	CHECK(is_ours(in, len) && len >= 6 && in[4] == SV_CM_VERSION && d == in[5],
	      "rej_decode gave %d", d);
	/* A reason from a newer peer is passed on as it is; only ours encode. */
	if (d != SV_CM_REJ_NO && d != SV_CM_REJ_WRITE_FIRST)
		return;
	uint8_t out[SV_CM_REJ_LEN];
	sv_cm_rej_encode((enum sv_cm_rej)d, out);
	CHECK(memcmp(out, in, 6) == 0 && out[6] == 0 && out[7] == 0,
	      "a rejection does not encode back to its bytes");
	CHECK(sv_cm_rej_decode(out, sizeof(out)) == d, "its own encoding decodes otherwise");
}

/* A registration sovia-warden reads from any local user (warden.h): what
 * it takes encodes back to the same 8 bytes. */
static void fuzz_warden(const uint8_t *in, size_t len)
{
	uint16_t port = 0;
	int d = sv_warden_msg_decode(in, len, &port);
	CHECK(d == 0 || d == -EPROTO, "warden_msg_decode returned %d", d);
	if (d < 0)
		return;
	uint8_t out[SV_WARDEN_MSG_LEN];
	sv_warden_msg_encode(port, out);
	CHECK(len == SV_WARDEN_MSG_LEN && port != 0 && memcmp(out, in, len) == 0,
	      "a registration does not encode back to its bytes");
}

/* ---- The warden's table, against a model of it ---- */

#define W_MAX 64
struct w_entry {
	struct sv_warden_listener l;
	uid_t uid;
	uint16_t port;
	bool dead;
	bool used;
};
static struct w_entry shadow[W_MAX];

static int fake_alive(void *arg, const struct sockaddr_storage *addr, uint64_t cookie)
{
	(void)arg;
	(void)addr;
	for (int i = 0; i < W_MAX; i++)
		if (shadow[i].used && shadow[i].l.cookie == cookie)
			return !shadow[i].dead;
	return 0;
}

/* A small address space, so that registrations and lookups meet. */
static struct sockaddr_storage w_addr(uint8_t b)
{
	struct sockaddr_storage ss = {0};
	uint16_t port = (uint16_t)(7000 + (b & 3));
	switch ((b >> 2) & 3) {
	case 0: { /* 10.0.0.x */
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		in->sin_addr.s_addr = htonl(0x0a000000u | (b >> 4 & 3));
		break;
	}
	case 1: { /* 0.0.0.0 */
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		break;
	}
	case 2: { /* :: */
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		break;
	}
	default: { /* ::ffff:10.0.0.x, or fd00::x */
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		if (b & 0x40) {
			in6->sin6_addr.s6_addr[0] = 0xfd;
		} else {
			in6->sin6_addr.s6_addr[10] = in6->sin6_addr.s6_addr[11] = 0xff;
			in6->sin6_addr.s6_addr[12] = 10;
		}
		in6->sin6_addr.s6_addr[15] = (uint8_t)(b >> 4 & 3);
		break;
	}
	}
	return ss;
}

/* Does a listener at l take a connection to server: 2 exactly, 1 as a
 * wildcard, 0 not (the model's own reading of the rules). */
static int w_match(const struct sv_warden_listener *l, const struct sockaddr_storage *server)
{
	if (sv_addr_port((const struct sockaddr *)&l->addr) !=
	    sv_addr_port((const struct sockaddr *)server))
		return 0;
	if (sv_addr_equal(&l->addr, server))
		return 2;
	uint8_t a[16], sv[16];
	uint16_t pa, ps;
	int a4, s4;
	if (sv_addr16(&l->addr, a, &pa, &a4) < 0 || sv_addr16(server, sv, &ps, &s4) < 0)
		return 0;
	static const uint8_t any4[16] = {[10] = 0xff, [11] = 0xff}, any6[16];
	if (l->addr.ss_family == AF_INET)
		return s4 && !memcmp(a, any4, 16);
	return !memcmp(a, any6, 16) && (!s4 || !l->v6only);
}

static void fuzz_warden_table(const uint8_t *in, size_t len)
{
	struct sv_warden_table *t = sv_warden_table_new();
	CHECK(t, "no table");
	memset(shadow, 0, sizeof(shadow));
	for (size_t i = 0; i + 3 <= len; i += 3) {
		uint8_t op = in[i], a = in[i + 1], b = in[i + 2];
		int k = b % W_MAX;
		if (op % 4 == 0) { /* a registration of socket k */
			struct sv_warden_listener l = {.addr = w_addr(a), .v6only = (op >> 2) & 1,
						       .cookie = (uint64_t)k + 1};
			uid_t uid = (uid_t)(op >> 3 & 3);
			uint16_t port = (uint16_t)(100 + (op >> 5) + 8 * (unsigned)k);
			int r = sv_warden_table_add(t, uid, &l, port);
			CHECK(r == 0, "a registration refused: %d", r);
			shadow[k] = (struct w_entry){l, uid, port, false, true};
		} else if (op % 4 == 1) { /* socket k closes */
			shadow[k].dead = true;
		} else if (op % 4 == 2) { /* a lookup */
			struct sockaddr_storage server = w_addr(a);
			uint16_t got = sv_warden_table_lookup(t, &server, fake_alive, NULL);
			int best = 0;
			for (int j = 0; j < W_MAX; j++) {
				int m = shadow[j].used && !shadow[j].dead ? w_match(&shadow[j].l, &server) : 0;
				best = m > best ? m : best;
			}
			CHECK(!best == !got, "answered %u where the best live match is %d", got, best);
			if (!got)
				continue;
			bool found = false;
			for (int j = 0; j < W_MAX; j++)
				found |= shadow[j].used && !shadow[j].dead && shadow[j].port == got &&
					 w_match(&shadow[j].l, &server) == best;
			CHECK(found, "port %u is no live listener's of the best match %d", got, best);
		} else { /* a sweep */
			sv_warden_table_sweep(t, fake_alive, NULL);
			size_t live = 0;
			for (int j = 0; j < W_MAX; j++)
				live += shadow[j].used && !shadow[j].dead;
			CHECK(sv_warden_table_count(t) == live, "a sweep left %zu for %zu live",
			      sv_warden_table_count(t), live);
		}
	}
	sv_warden_table_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_req(data, size);
	fuzz_rep(data, size);
	fuzz_rej(data, size);
	fuzz_warden(data, size);
	fuzz_warden_table(data, size);
	return 0;
}
