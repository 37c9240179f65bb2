/* sovia-hostile: a hostile peer for libsovia, one attack per mode. The
 * victim is a real program preloaded with libsovia; the test
 * (test/integration/hostile.sh) judges the victim: its bytes, its
 * statistics, its exit and its memory. This program says what it did and
 * what it saw, ending with one line MODE_RESULT key=value...
 *
 *   sovia-hostile pattern -n BYTES          our stream's first BYTES, to stdout
 *   sovia-hostile flood -a IP -p PORT [-n REQUESTS] [-t WAIT_S]
 *   sovia-hostile garbage -a IP -p PORT [-n REQUESTS] [-t WAIT_S]
 *   sovia-hostile to-rdma-max -a IP -p PORT [-o FILE] [-t SECS]
 *   sovia-hostile back0 -a IP -p PORT [-n SERVER_BYTES] [-o FILE] [-t SECS]
 *   sovia-hostile ignore-back -a IP -p PORT [-n BYTES] [-t SECS]
 *   sovia-hostile withhold -a IP -p PORT [-R RNR_RETRY] [-o FILE] [-t SECS]
 *   sovia-hostile rogue -a IP -p PORT [-x | -s] [-t SECS]
 *
 * -o FILE: the server's stream as it reached us. ignore-back -n: our DATA
 * in all (default 4 GiB), then silence. -R: the RNR retries our
 * upgrade request asks of the server's QP (default 7, "for ever": an
 * attacker asks what it likes). -s: the rogue answers the client's
 * TO_RDMA with its own at the same offset, and DATA; -x: the same, and its
 * challenge is the client's own. Exit status 1 only when the attack could not be made. */
#include "hostile.h"

#include "le.h"

#include <errno.h>
#include <getopt.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)
#define RECORD_SIZE 24 /* the resume record, protocol.md 11 */

/* ---- Helpers (hostile.h) ------------------------------------------------- */

void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint8_t pattern_byte(uint64_t off)
{
	/* A byte that depends on the whole offset: a stream shifted or
	 * spliced anywhere compares different. */
	return (uint8_t)((off * 0x9E3779B97F4A7C15ull) >> 56);
}

void pattern_fill(uint64_t off, uint8_t *buf, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = pattern_byte(off + i);
}

int bytes_add(struct bytes *b, const void *data, size_t n)
{
	if (!n)
		return 0;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 65536;
		while (cap < b->len + n)
			cap *= 2;
		uint8_t *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
	return 0;
}

void bytes_free(struct bytes *b)
{
	free(b->p);
	*b = (struct bytes){0};
}

int cm_wait(struct rdma_event_channel *ch, int ms, struct rdma_cm_event **out)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	if (poll(&p, 1, ms) <= 0)
		return -1;
	return rdma_get_cm_event(ch, out) == 0 ? 0 : -1;
}

/* ---- The modes --------------------------------------------------------------- */

struct args {
	const char *mode, *ip, *out;
	int port, secs, rnr;
	long long n;
	bool reflect, switch_back;
};

static struct hc_opts opts(const struct args *a)
{
	/* Buffers as large as libsovia's grow to, so bulk moves in few
	 * messages under emulation. */
	return (struct hc_opts){
		.qp = {.nrecv = 16, .rbuf = 65536 + SV_HDR_SIZE, .post = 16, .repost = true,
		       .nsend = 17, .sbuf = 131072 + SV_HDR_SIZE},
		.rnr_retry = a->rnr,
		.timeout_ms = 60000,
	};
}

static const char *tcp_end(const struct hc *c)
{
	if (!c->tcp_eof)
		return "open";
	return c->tcp_err == ECONNRESET ? "reset" : c->tcp_err ? "error" : "eof";
}

/* Why the server is done with us, or NULL. */
static const char *ended(const struct hc *c)
{
	if (c->srv_reset)
		return "reset-message";
	if (hq_failed(c->q))
		return "qp-error";
	if (c->disconnected)
		return "disconnected";
	if (c->tcp_eof)
		return c->tcp_err == ECONNRESET ? "tcp-reset" : "tcp-end";
	return NULL;
}

/* A genuine upgrade after `pre` bytes on TCP, both directions on the QP. */
static int upgraded(struct hc *c, const struct args *a, const struct hc_opts *o, size_t pre)
{
	if (hc_open(c, a->ip, a->port, pre) < 0 || hc_request(c, o) != 0 ||
	    hc_switch(c, c->snd_nxt, true) < 0)
		return -1;
	return hc_wait_proven(c, 60000);
}

static int mode_to_rdma_max(const struct args *a)
{
	struct hc c;
	struct hc_opts o = opts(a);
	if (hc_open(&c, a->ip, a->port, 4096) < 0 || hc_request(&c, &o) != 0 ||
	    hc_switch(&c, UINT64_MAX, false) < 0) {
		say("TORDMAMAX_RESULT upgrade=failed");
		hc_close(&c);
		return 1;
	}
	/* The last offset a stream could have: no TCP peer ever gets there,
	 * so there is no echo to write either. TCP carries on. */
	say("to-rdma-max: TO_RDMA at 2^64-1 sent after %llu bytes on TCP",
	    (unsigned long long)c.snd_nxt);
	uint64_t deadline = now_ms() + (uint64_t)a->secs * 1000u;
	if (hc_tcp_write_pattern(&c, 65536) < 0 || shutdown(c.tcp, SHUT_WR) < 0)
		say("to-rdma-max: writing on TCP after it failed");
	while (!c.tcp_eof && now_ms() < deadline)
		hc_pump(&c, 100);
	int r = hc_save_stream(&c, a->out, 0);
	say("TORDMAMAX_RESULT upgrade=accepted sent_tcp=%llu got_tcp=%zu got_qp=%zu "
	    "server_reset=%s server_switch=%s tcp_end=%s",
	    (unsigned long long)c.snd_nxt, c.tcp_in.len, c.srv_qp.len, c.srv_reset ? "yes" : "no",
	    c.srv_switch ? "yes" : "no", tcp_end(&c));
	hc_close(&c);
	return r < 0;
}

/* Bytes both ways over the QP: ours out, the server's in. */
static void exchange(struct hc *c, uint64_t tx, uint64_t rx, uint64_t deadline)
{
	static uint8_t chunk[131072];
	while ((c->snd_nxt < tx || (c->srv_qp.len < rx && !c->srv_fin)) && !ended(c) &&
	       now_ms() < deadline) {
		long s = 0;
		if (c->snd_nxt < tx) {
			size_t n = tx - c->snd_nxt < sizeof(chunk) ? tx - c->snd_nxt : sizeof(chunk);
			pattern_fill(c->snd_nxt, chunk, n);
			s = hq_send_bytes(c->q, SV_MSG_DATA, c->snd_nxt, chunk, n);
			if (s > 0)
				c->snd_nxt += (uint64_t)s;
		}
		hc_pump(c, s > 0 ? 0 : 20);
	}
}

/* After our BACK: if the server answers with its own, give it back every
 * byte from X = 0 to its BACK, as RETURNs of our own making, and read
 * what it writes on TCP. Returns the bytes given back. */
static uint64_t return_all(struct hc *c, uint64_t deadline)
{
	static uint8_t junk[131072];
	memset(junk, 'R', sizeof(junk));
	uint64_t returned = 0, quiet_since = now_ms();
	size_t seen = c->tcp_in.len;
	while (!ended(c) && now_ms() < deadline) {
		long n = 0;
		if (c->srv_back && returned < c->srv_back_seq) {
			uint64_t left = c->srv_back_seq - returned;
			n = hq_send_bytes(c->q, SV_MSG_RETURN, returned, junk,
					  left < sizeof(junk) ? left : sizeof(junk));
			if (n > 0)
				returned += (uint64_t)n;
		}
		hc_pump(c, n > 0 ? 0 : 20);
		if (c->tcp_in.len != seen) {
			seen = c->tcp_in.len;
			quiet_since = now_ms();
		}
		/* All given back and TCP quiet: it wrote what it would. No
		 * answer at all for a long while: it never will. */
		uint64_t quiet = now_ms() - quiet_since;
		if ((c->srv_back && returned >= c->srv_back_seq && quiet > 5000) ||
		    (!c->srv_back && quiet > 30000))
			break;
	}
	return returned;
}

static int mode_back0(const struct args *a)
{
	struct hc c;
	struct hc_opts o = opts(a);
	uint64_t deadline = now_ms() + (uint64_t)a->secs * 1000u;
	if (upgraded(&c, a, &o, 0) < 0) {
		say("BACK0_RESULT upgrade=failed");
		hc_close(&c);
		return 1;
	}
	exchange(&c, 256u * 1024u, a->n ? (uint64_t)a->n : 4u * MIB, deadline);
	say("back0: over the QP we sent %llu bytes and got %zu of the server's",
	    (unsigned long long)c.snd_nxt, c.srv_qp.len);
	/* "My application consumed none of your bytes": X = 0, however much
	 * of the server's stream we acknowledged. */
	uint8_t x[SV_BACK_PAYLOAD] = {0};
	int r;
	while ((r = hq_send(c.q, SV_MSG_BACK, c.snd_nxt, x, sizeof(x))) == -EAGAIN &&
	       !ended(&c) && now_ms() < deadline)
		hc_pump(&c, 10);
	size_t at_back = c.tcp_in.len;
	say("back0: BACK %s at our offset %llu with X=0; we acknowledged %llu of the server's stream",
	    r == 0 ? "sent" : "NOT sent", (unsigned long long)c.snd_nxt,
	    (unsigned long long)hq_ack(c.q));
	uint64_t returned = r == 0 ? return_all(&c, deadline) : 0;
	/* Our junk coming back on TCP: only if we gave any back (the stream's
	 * own bytes on TCP after the BACK start with 'R' once in 256 times). */
	size_t rewritten = 0;
	while (returned && at_back + rewritten < c.tcp_in.len &&
	       c.tcp_in.p[at_back + rewritten] == 'R')
		rewritten++;
	int rc = hc_save_stream(&c, a->out, SIZE_MAX); /* what came before the BACK */
	say("BACK0_RESULT upgrade=ok back_sent=%s sent_qp=%llu got_qp=%zu server_back=%s "
	    "server_back_seq=%llu returned=%llu tcp_after_back=%zu rewritten=%zu ended=%s tcp_end=%s",
	    r == 0 ? "yes" : "no", (unsigned long long)c.snd_nxt, c.srv_qp.len,
	    c.srv_back ? "yes" : "no", (unsigned long long)c.srv_back_seq,
	    (unsigned long long)returned, c.tcp_in.len - at_back, rewritten,
	    ended(&c) ? ended(&c) : "no", tcp_end(&c));
	hc_close(&c);
	return r < 0 || rc < 0;
}

/* DATA at the next offset, our pattern while the application may read it;
 * the bytes sent, or 0. */
static long send_data(struct hc *c, uint64_t limit)
{
	static uint8_t chunk[131072];
	size_t n = limit - c->snd_nxt < sizeof(chunk) ? limit - c->snd_nxt : sizeof(chunk);
	if (!n)
		return 0;
	if (!c->srv_back) /* what follows the BACK is never the application's */
		pattern_fill(c->snd_nxt, chunk, n);
	long s = hq_send_bytes(c->q, SV_MSG_DATA, c->snd_nxt, chunk, n);
	if (s <= 0)
		return 0;
	c->snd_nxt += (uint64_t)s;
	return s;
}

/* The server's BACK is never answered: DATA goes on up to -n bytes in all,
 * then we stay silent, until the server ends the connection or the time
 * is up. */
static int mode_ignore_back(const struct args *a)
{
	struct hc c;
	struct hc_opts o = opts(a);
	uint64_t limit = a->n ? (uint64_t)a->n : 4096ull * MIB;
	uint64_t deadline = now_ms() + (uint64_t)a->secs * 1000u, at_back = 0;
	if (upgraded(&c, a, &o, 0) < 0) {
		say("IGNOREBACK_RESULT upgrade=failed");
		hc_close(&c);
		return 1;
	}
	const char *why;
	while (!(why = ended(&c))) {
		if (now_ms() > deadline) {
			why = "time";
			break;
		}
		if (c.srv_back && !at_back) {
			at_back = c.snd_nxt;
			say("ignore-back: the server's BACK (its offset %llu, X=%llu) after we sent "
			    "%llu bytes; we go on as if it never came",
			    (unsigned long long)c.srv_back_seq, (unsigned long long)c.srv_back_x,
			    (unsigned long long)at_back);
		}
		long s = send_data(&c, limit);
		/* Where it stands, for a run the test stops from outside. */
		if (s > 0 && at_back && (c.snd_nxt - at_back) / (32u * MIB) !=
					    (c.snd_nxt - at_back - (uint64_t)s) / (32u * MIB))
			say("ignore-back: %llu MiB sent after the BACK",
			    (unsigned long long)((c.snd_nxt - at_back) / MIB));
		hc_pump(&c, s > 0 ? 0 : c.snd_nxt < limit ? 20 : 200);
	}
	say("IGNOREBACK_RESULT upgrade=ok server_back=%s sent=%llu sent_after_back=%llu "
	    "returned_to_us=%llu ended=%s tcp_end=%s",
	    c.srv_back ? "yes" : "no", (unsigned long long)c.snd_nxt,
	    (unsigned long long)(c.srv_back ? c.snd_nxt - at_back : 0),
	    (unsigned long long)c.returned_to_us, why, tcp_end(&c));
	hc_close(&c);
	return 0;
}

/* The server's resume record, once it is on TCP after its echo; our own
 * in answer. 1 when it came, 0 when not (in time), -1 on failure. */
static int resume_records(struct hc *c, uint64_t deadline, uint64_t *rcv, uint64_t *end)
{
	size_t at = (size_t)c->srv_switch_seq + SV_CHALLENGE_SIZE;
	while (c->tcp_in.len < at + RECORD_SIZE && !c->tcp_eof && now_ms() < deadline)
		hc_pump(c, 100);
	if (c->tcp_in.len < at + RECORD_SIZE)
		return 0;
	const uint8_t *rec = c->tcp_in.p + at;
	*rcv = sv_get64(rec + 8);
	*end = sv_get64(rec + 16);
	if (memcmp(rec, "SVRS", 4) != 0 || rec[4] != 1) {
		say("withhold: TCP after the echo is not a resume record");
		return -1;
	}
	/* The server's bytes we hold: TCP before its switch, then the QP's. */
	uint8_t mine[RECORD_SIZE] = {'S', 'V', 'R', 'S', 1};
	sv_put64(mine + 8, c->srv_switch_seq + c->srv_qp.len);
	sv_put64(mine + 16, c->snd_nxt);
	return hc_tcp_write(c, mine, sizeof(mine)) < 0 ? -1 : 1;
}

static int mode_withhold(const struct args *a)
{
	struct hc c;
	struct hc_opts o = opts(a);
	o.qp.post = SV_RESERVE; /* room for the server's TO_RDMA, then nothing */
	o.qp.repost = false;
	if (upgraded(&c, a, &o, 4096) < 0) {
		say("WITHHOLD_RESULT upgrade=failed");
		hc_close(&c);
		return 1;
	}
	say("withhold: on the QP with %u of the %u buffers we advertised posted, none to be "
	    "posted again; our request asked for rnr_retry %d",
	    o.qp.post, o.qp.nrecv, a->rnr);
	uint64_t t0 = now_ms(), rcv = 0, end = 0;
	int got = resume_records(&c, t0 + (uint64_t)a->secs * 1000u, &rcv, &end);
	uint64_t waited = now_ms() - t0;
	if (got > 0) {
		say("withhold: the server's resume record after %llu ms: rcv=%llu end=%llu",
		    (unsigned long long)waited, (unsigned long long)rcv, (unsigned long long)end);
		/* The rest of its stream, to its end. Ours stays open meanwhile:
		 * nc -l, say, quits when its peer's stream ends. */
		uint64_t deadline = now_ms() + 120000;
		while (!c.tcp_eof && now_ms() < deadline)
			hc_pump(&c, 100);
	}
	int r = got > 0 ? hc_save_stream(&c, a->out, SV_CHALLENGE_SIZE + RECORD_SIZE) : 0;
	say("WITHHOLD_RESULT upgrade=ok record=%s rcv=%llu end=%llu our_end=%llu waited_ms=%llu "
	    "got_qp=%zu stream=%zu tcp_end=%s",
	    got > 0 ? "yes" : got < 0 ? "bad" : "none", (unsigned long long)rcv,
	    (unsigned long long)end, (unsigned long long)c.snd_nxt, (unsigned long long)waited,
	    c.srv_qp.len, c.tcp_in.len, tcp_end(&c));
	hc_close(&c);
	return r < 0;
}

static int mode_pattern(const struct args *a)
{
	uint8_t buf[65536];
	for (uint64_t off = 0; off < (uint64_t)a->n;) {
		size_t k = (uint64_t)a->n - off < sizeof(buf) ? (size_t)((uint64_t)a->n - off)
							     : sizeof(buf);
		pattern_fill(off, buf, k);
		if (fwrite(buf, 1, k, stdout) != k)
			return 1;
		off += k;
	}
	return fflush(stdout) != 0;
}

/* ---- Options --------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: sovia-hostile pattern|flood|garbage|to-rdma-max|back0|ignore-back|"
			"withhold|rogue -a IP -p PORT [-n N] [-t SECS] [-o FILE] [-R RNR] [-x|-s]\n");
	exit(2);
}

static void parse(int argc, char **argv, struct args *a)
{
	if (argc < 2)
		usage();
	*a = (struct args){.mode = argv[1], .secs = 120, .rnr = 7};
	int o;
	optind = 2;
	while ((o = getopt(argc, argv, "a:p:n:t:o:R:xs")) != -1) {
		switch (o) {
		case 'a': a->ip = optarg; break;
		case 'p': a->port = atoi(optarg); break;
		case 'n': a->n = atoll(optarg); break;
		case 't': a->secs = atoi(optarg); break;
		case 'o': a->out = optarg; break;
		case 'R': a->rnr = atoi(optarg); break;
		case 'x': a->reflect = a->switch_back = true; break;
		case 's': a->switch_back = true; break;
		default: usage();
		}
	}
	if (strcmp(a->mode, "pattern") != 0 && (!a->ip || a->port <= 0))
		usage();
}

int main(int argc, char **argv)
{
	struct args a;
	parse(argc, argv, &a);
	if (!strcmp(a.mode, "pattern"))
		return mode_pattern(&a);
	if (!strcmp(a.mode, "flood"))
		return cm_flood(a.ip, a.port, a.n ? (int)a.n : 2000, a.secs, false);
	if (!strcmp(a.mode, "garbage"))
		return cm_flood(a.ip, a.port, a.n ? (int)a.n : 300, a.secs, true);
	if (!strcmp(a.mode, "to-rdma-max"))
		return mode_to_rdma_max(&a);
	if (!strcmp(a.mode, "back0"))
		return mode_back0(&a);
	if (!strcmp(a.mode, "ignore-back"))
		return mode_ignore_back(&a);
	if (!strcmp(a.mode, "withhold"))
		return mode_withhold(&a);
	if (!strcmp(a.mode, "rogue"))
		return cm_rogue(a.ip, a.port, a.secs, a.reflect, a.switch_back);
	usage();
}
