/* The in-process fake transport: see fake_xport.h. */
#include "fake_xport.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void violation(struct fake_ep *ep, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void violation(struct fake_ep *ep, const char *fmt, ...)
{
	if (ep->violations++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ep->why, sizeof(ep->why), fmt, ap);
		va_end(ap);
	}
}

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);
	if (!p)
		abort();
	return p;
}

static void evq_push(struct fake_evq *q, struct fake_ev ev)
{
	if (q->count == q->cap) {
		size_t ncap = q->cap ? 2 * q->cap : 64;
		struct fake_ev *n = xcalloc(ncap, sizeof(*n));
		for (size_t i = 0; i < q->count; i++)
			n[i] = q->ev[(q->head + i) % q->cap];
		free(q->ev);
		q->ev = n;
		q->head = 0;
		q->cap = ncap;
	}
	q->ev[(q->head + q->count) % q->cap] = ev;
	q->count++;
}

static bool evq_pop(struct fake_evq *q, struct fake_ev *ev)
{
	if (q->count == 0)
		return false;
	*ev = q->ev[q->head];
	q->head = (q->head + 1) % q->cap;
	q->count--;
	return true;
}

/* ---- The transport operations ------------------------------------------ */

static void *op_recv_buf(void *xp, uint32_t i)
{
	struct fake_ep *ep = xp;
	if (i >= ep->nrecv) {
		violation(ep, "recv_buf(%u): only %u receive buffers", i, ep->nrecv);
		return ep->scratch;
	}
	return ep->rbuf[i];
}

static void *op_send_buf(void *xp, uint32_t i)
{
	struct fake_ep *ep = xp;
	if (i >= ep->nsend) {
		violation(ep, "send_buf(%u): only %u send buffers", i, ep->nsend);
		return ep->scratch;
	}
	return ep->sbuf[i];
}

static int op_post_recv(void *xp, uint32_t i, bool big)
{
	struct fake_ep *ep = xp;
	if (big && !ep->rgrown) {
		violation(ep, "post_recv(%u): at buf_size before grow(recv)", i);
		return -EINVAL;
	}
	if (i >= ep->nrecv) {
		violation(ep, "post_recv(%u): only %u receive buffers", i, ep->nrecv);
		return -EINVAL;
	}
	if (ep->rstate[i] == FAKE_RB_POSTED) {
		violation(ep, "post_recv(%u): already posted", i);
		return -EINVAL;
	}
	if (ep->rstate[i] == FAKE_RB_FILLED) {
		violation(ep, "post_recv(%u): its completion was not delivered yet", i);
		return -EINVAL;
	}
	ep->rstate[i] = FAKE_RB_POSTED;
	ep->rsize[i] = ep->start_size && !big ? ep->start_size : ep->buf_size;
	ep->rfifo[(ep->rhead + ep->rcount) % ep->nrecv] = i;
	ep->rcount++;
	ep->recv_posts++;
	return 0;
}

static void log_msg(struct fake_ep *ep, const struct fake_msg *m, const uint8_t *payload,
		    uint32_t plen)
{
	if (ep->nlog == ep->caplog) {
		size_t ncap = ep->caplog ? 2 * ep->caplog : 64;
		struct fake_msg *n = xcalloc(ncap, sizeof(*n));
		if (ep->nlog)
			memcpy(n, ep->log, ep->nlog * sizeof(*n));
		free(ep->log);
		ep->log = n;
		ep->caplog = ncap;
	}
	ep->log[ep->nlog] = *m;
	ep->log[ep->nlog].payload_off = ep->nsent;
	ep->nlog++;
	if (m->h.type != SV_MSG_DATA || plen == 0)
		return;
	if (ep->nsent + plen > ep->capsent) {
		size_t ncap = ep->capsent ? ep->capsent : 4096;
		while (ncap < ep->nsent + plen)
			ncap *= 2;
		uint8_t *n = xcalloc(ncap, 1);
		if (ep->nsent)
			memcpy(n, ep->sent, ep->nsent);
		free(ep->sent);
		ep->sent = n;
		ep->capsent = ncap;
	}
	memcpy(ep->sent + ep->nsent, payload, plen);
	ep->nsent += plen;
}

static int op_post_send(void *xp, uint32_t slot, uint32_t len, const struct iovec *iov,
			int iovcnt)
{
	struct fake_ep *ep = xp;
	struct fake_ep *peer = ep->peer;

	if (ep->fail_sends > 0) {
		ep->fail_sends--;
		return -EIO;
	}
	if (slot >= ep->nsend) {
		violation(ep, "post_send: slot %u of %u", slot, ep->nsend);
		return -EINVAL;
	}
	if (ep->sbusy[slot]) {
		violation(ep, "post_send: slot %u reused before its completion", slot);
		return -EINVAL;
	}
	if (iovcnt < 0 || (iovcnt > 0 && !iov)) {
		violation(ep, "post_send: bad iov (%d)", iovcnt);
		return -EINVAL;
	}
	uint64_t total = len;
	for (int k = 0; k < iovcnt; k++)
		total += iov[k].iov_len;
	uint32_t ssize = ep->start_size && !ep->sbig[slot] ? ep->start_size : ep->buf_size;
	if (len > ssize) {
		violation(ep, "post_send: %u bytes in a %u-byte send buffer", len, ssize);
		return -EMSGSIZE;
	}
	if (peer->rcount && total > peer->rsize[peer->rfifo[peer->rhead]]) {
		violation(ep, "post_send: %llu bytes do not fit a %u-byte buffer (message %zu)",
			  (unsigned long long)total, peer->rsize[peer->rfifo[peer->rhead]],
			  ep->nlog);
		return -EMSGSIZE;
	}
	if (total < SV_HDR_SIZE) {
		violation(ep, "post_send: %llu bytes, shorter than a header",
			  (unsigned long long)total);
		return -EINVAL;
	}
	if (peer->rcount == 0) {
		violation(ep, "post_send: the peer has no posted receive buffer "
			      "(message %zu)", ep->nlog);
		return -ENOBUFS;
	}

	/* The message as it lands at the peer. */
	uint32_t rb = peer->rfifo[peer->rhead];
	peer->rhead = (peer->rhead + 1) % peer->nrecv;
	peer->rcount--;
	uint8_t *dst = peer->rbuf[rb];
	memcpy(dst, ep->sbuf[slot], len);
	size_t off = len;
	for (int k = 0; k < iovcnt; k++) {
		if (iov[k].iov_len)
			memcpy(dst + off, iov[k].iov_base, iov[k].iov_len);
		off += iov[k].iov_len;
	}
	peer->rstate[rb] = FAKE_RB_FILLED;

	struct fake_msg m = {.total = (uint32_t)total, .slot = slot, .iovcnt = iovcnt};
	sv_hdr_decode(dst, &m.h);
	if ((uint64_t)m.h.len + SV_HDR_SIZE != total)
		violation(ep, "post_send: header says %u payload bytes, message has %llu",
			  m.h.len, (unsigned long long)(total - SV_HDR_SIZE));
	uint32_t plen = total - SV_HDR_SIZE;
	if (plen > m.h.len)
		plen = m.h.len;
	log_msg(ep, &m, dst + SV_HDR_SIZE, plen);

	evq_push(&peer->cq, (struct fake_ev){FAKE_EV_RECV, rb, (uint32_t)total});
	ep->sbusy[slot] = 1;
	struct fake_ev done = {FAKE_EV_SEND, slot, 0};
	evq_push(ep->hold_send_done ? &ep->held : &ep->cq, done);
	ep->posts++;
	if (iovcnt > 0)
		ep->zcopy_posts++;
	return 0;
}

static int op_grow(void *xp, bool recv)
{
	struct fake_ep *ep = xp;
	if (!ep->start_size) {
		violation(ep, "grow: the buffers are at their size from the start");
		return -EINVAL;
	}
	if (ep->refuse_grow)
		return -ENOBUFS;
	if (recv ? ep->rgrown : ep->sgrown)
		violation(ep, "grow(%s) twice", recv ? "recv" : "send");
	*(recv ? &ep->rgrown : &ep->sgrown) = true;
	ep->grows++;
	return 0;
}

static void op_send_big(void *xp, uint32_t slot)
{
	struct fake_ep *ep = xp;
	if (!ep->sgrown || slot >= ep->nsend || ep->sbusy[slot])
		violation(ep, "send_big(%u): not grown, out of range or in flight", slot);
	else
		ep->sbig[slot] = 1;
}

static void op_shrink(void *xp, bool recv)
{
	struct fake_ep *ep = xp;
	if (!ep->start_size || !(recv ? ep->rgrown : ep->sgrown)) {
		violation(ep, "shrink(%s): not grown", recv ? "recv" : "send");
		return;
	}
	if (recv) {
		for (uint32_t i = 0; i < ep->nrecv; i++)
			if (ep->rsize[i] == ep->buf_size)
				violation(ep, "shrink(recv): buffer %u is at buf_size (%s)", i,
					  ep->rstate[i] == FAKE_RB_POSTED ? "posted" : "in use");
		ep->rgrown = false;
	} else {
		for (uint32_t i = 0; i < ep->nsend; i++)
			if (ep->sbusy[i])
				violation(ep, "shrink(send): send buffer %u in flight", i);
		memset(ep->sbig, 0, ep->nsend);
		ep->sgrown = false;
	}
	ep->shrinks++;
}

static const struct sv_xport_ops fake_ops = {
	.recv_buf = op_recv_buf,
	.send_buf = op_send_buf,
	.post_recv = op_post_recv,
	.post_send = op_post_send,
	.grow = op_grow,
	.send_big = op_send_big,
	.shrink = op_shrink,
};

void fake_ep_grows(struct fake_ep *ep, uint32_t start_size)
{
	ep->start_size = start_size;
}

uint64_t fake_clock_us = 1;
unsigned fake_clock_reads;

uint64_t fake_clock_read(void)
{
	fake_clock_reads++;
	return fake_clock_us;
}

/* ---- Set-up ------------------------------------------------------------- */

static void ep_init(struct fake_ep *ep, uint32_t nrecv, uint32_t nsend, uint32_t buf_size)
{
	memset(ep, 0, sizeof(*ep));
	ep->nrecv = nrecv;
	ep->nsend = nsend;
	ep->buf_size = buf_size;
	ep->rbuf = xcalloc(nrecv, sizeof(*ep->rbuf));
	ep->sbuf = xcalloc(nsend, sizeof(*ep->sbuf));
	/* Distinct garbage in every buffer, so that a core reading bytes it
	 * did not write (or a header it did not receive) shows. */
	for (uint32_t i = 0; i < nrecv; i++) {
		ep->rbuf[i] = xcalloc(buf_size, 1);
		memset(ep->rbuf[i], 0xA5, buf_size);
	}
	for (uint32_t i = 0; i < nsend; i++) {
		ep->sbuf[i] = xcalloc(buf_size, 1);
		memset(ep->sbuf[i], 0x5A, buf_size);
	}
	ep->scratch = xcalloc(buf_size, 1);
	ep->rstate = xcalloc(nrecv, 1);
	ep->sbusy = xcalloc(nsend, 1);
	ep->rfifo = xcalloc(nrecv, sizeof(*ep->rfifo));
	ep->rsize = xcalloc(nrecv, sizeof(*ep->rsize));
	ep->sbig = xcalloc(nsend, 1);
}

static void ep_destroy(struct fake_ep *ep)
{
	for (uint32_t i = 0; i < ep->nrecv; i++)
		free(ep->rbuf[i]);
	for (uint32_t i = 0; i < ep->nsend; i++)
		free(ep->sbuf[i]);
	free(ep->rbuf);
	free(ep->sbuf);
	free(ep->scratch);
	free(ep->rstate);
	free(ep->sbusy);
	free(ep->rfifo);
	free(ep->rsize);
	free(ep->sbig);
	free(ep->cq.ev);
	free(ep->held.ev);
	free(ep->log);
	free(ep->sent);
	memset(ep, 0, sizeof(*ep));
}

int fake_pair_init2(struct fake_pair *fp, const uint32_t nrecv[2], const uint32_t nsend[2],
		    const uint32_t buf_size[2])
{
	for (int k = 0; k < 2; k++)
		if (nrecv[k] == 0 || nsend[k] == 0 || buf_size[k] < SV_HDR_SIZE)
			return -EINVAL;
	for (int k = 0; k < 2; k++)
		ep_init(&fp->ep[k], nrecv[k], nsend[k], buf_size[k]);
	fp->ep[0].peer = &fp->ep[1];
	fp->ep[1].peer = &fp->ep[0];
	return 0;
}

int fake_pair_init(struct fake_pair *fp, uint32_t nrecv, uint32_t nsend, uint32_t buf_size)
{
	const uint32_t r[2] = {nrecv, nrecv}, s[2] = {nsend, nsend}, b[2] = {buf_size, buf_size};
	return fake_pair_init2(fp, r, s, b);
}

void fake_pair_destroy(struct fake_pair *fp)
{
	ep_destroy(&fp->ep[0]);
	ep_destroy(&fp->ep[1]);
}

struct sv_xport fake_xport(struct fake_ep *ep)
{
	return (struct sv_xport){.ops = &fake_ops, .ctx = ep};
}

/* ---- Completions -------------------------------------------------------- */

int fake_poll(struct fake_ep *ep, struct sv_proto *p, uint64_t now_us)
{
	int n = 0, err = 0;
	struct fake_ev ev;
	struct sv_clock clk = {.us = now_us, .source = fake_clock_read};
	while (evq_pop(&ep->cq, &ev)) {
		int r;
		if (ev.kind == FAKE_EV_RECV) {
			ep->rstate[ev.idx] = FAKE_RB_OWNED;
			r = sv_proto_on_recv(p, ev.idx, ev.byte_len, &clk);
		} else {
			ep->sbusy[ev.idx] = 0;
			r = sv_proto_on_send_done(p, ev.idx, &clk);
		}
		ep->delivered++;
		n++;
		if (r < 0 && err == 0)
			err = r;
		if (n > 1000000) {
			violation(ep, "fake_poll: completions never stop");
			return -ELOOP;
		}
	}
	if (err && ep->poll_err == 0)
		ep->poll_err = err;
	return err ? err : n;
}

size_t fake_pending(const struct fake_ep *ep)
{
	return ep->cq.count;
}

size_t fake_pending_recvs(const struct fake_ep *ep)
{
	size_t n = 0;
	for (size_t i = 0; i < ep->cq.count; i++)
		if (ep->cq.ev[(ep->cq.head + i) % ep->cq.cap].kind == FAKE_EV_RECV)
			n++;
	return n;
}

size_t fake_held(const struct fake_ep *ep)
{
	return ep->held.count;
}

size_t fake_release_sends(struct fake_ep *ep, size_t n)
{
	size_t moved = 0;
	struct fake_ev ev;
	while (moved < n && evq_pop(&ep->held, &ev)) {
		evq_push(&ep->cq, ev);
		moved++;
	}
	return moved;
}

uint32_t fake_posted(const struct fake_ep *ep)
{
	return ep->rcount;
}

size_t fake_count(const struct fake_ep *ep, int type)
{
	size_t n = 0;
	for (size_t i = 0; i < ep->nlog; i++)
		if (type == 0 || ep->log[i].h.type == type)
			n++;
	return n;
}

const struct fake_msg *fake_msg_at(const struct fake_ep *ep, size_t n)
{
	return n < ep->nlog ? &ep->log[n] : NULL;
}

const struct fake_msg *fake_last(const struct fake_ep *ep)
{
	return ep->nlog ? &ep->log[ep->nlog - 1] : NULL;
}

/* ---- Injection ---------------------------------------------------------- */

int fake_inject(struct fake_ep *ep, const void *bytes, uint32_t nbytes, uint32_t byte_len)
{
	if (nbytes > ep->buf_size || byte_len > ep->buf_size)
		return -EINVAL;
	if (ep->rcount == 0)
		return -ENOBUFS;
	uint32_t rb = ep->rfifo[ep->rhead];
	ep->rhead = (ep->rhead + 1) % ep->nrecv;
	ep->rcount--;
	if (nbytes)
		memcpy(ep->rbuf[rb], bytes, nbytes);
	ep->rstate[rb] = FAKE_RB_FILLED;
	evq_push(&ep->cq, (struct fake_ev){FAKE_EV_RECV, rb, byte_len});
	return 0;
}

int fake_inject_msg(struct fake_ep *ep, const struct sv_hdr *h, const void *payload,
		    uint32_t plen, uint32_t byte_len)
{
	if ((uint64_t)plen + SV_HDR_SIZE > ep->buf_size)
		return -EINVAL;
	uint8_t *msg = xcalloc(ep->buf_size, 1);
	sv_hdr_encode(h, msg);
	if (plen)
		memcpy(msg + SV_HDR_SIZE, payload, plen);
	int r = fake_inject(ep, msg, SV_HDR_SIZE + plen, byte_len);
	free(msg);
	return r;
}
