/* A stream's statistics (SOVIA_STATS): one line per connection on stderr,
 * at close, exit or the end of the way back. */
#include "addr.h"
#include "stream_int.h"

#include "log.h"
#include "regcache.h"

#include <arpa/inet.h>
#include <stdio.h>

void sv_stream_first_on_qp(struct sv_stream *s, struct sv_clock *clk)
{
	uint64_t now = sv_clock_now(clk);
	s->st.to_rdma_us = now > s->st.born_us ? now - s->st.born_us : 1;
}

void sv_stream_count_sleep(struct sv_stream *s, uint64_t from, uint64_t to, bool timeout,
			   bool chan, bool kick)
{
	uint64_t us = to > from ? to - from : 0;
	s->st.waits_slept++;
	s->st.slept_us += us;
	if (us > s->st.slept_max_us)
		s->st.slept_max_us = us;
	s->st.woken_timeout += timeout;
	s->st.woken_chan += chan;
	s->st.woken_kick += kick;
}

#define U(x) ((unsigned long long)(x))

void sv_stream_print_stats(struct sv_stream *s, const char *when)
{
	if (s->st.printed)
		return;
	s->st.printed = true;
	char local[64], peer[64], line[1536];
	sv_addr_str(&s->tuple.local, local, sizeof(local));
	sv_addr_str(&s->tuple.peer, peer, sizeof(peer));
	static const struct sv_proto_stats none;
	const struct sv_proto_stats *p = s->proto ? sv_proto_stats(s->proto) : &none;
	/* The device's registration cache, shared by its connections. */
	struct sv_regcache_stats rc = {0};
	if (s->qp && s->qp->ops->regcache_stats)
		s->qp->ops->regcache_stats(s->qp, &rc);
	int n = snprintf(
		line, sizeof(line),
		"libsovia stats [%s] %s -> %s %s state=%s fallback=%s call=%s "
		"rdma_tx_bytes=%llu rdma_rx_bytes=%llu tcp_tx_bytes=%llu tcp_rx_bytes=%llu "
		"rdma_tx_msgs=%llu rdma_rx_msgs=%llu zcopy_tx_bytes=%llu credit_stalls=%llu "
		"acks_sent=%llu acks_piggybacked=%llu coalesced_writes=%llu collected_writes=%llu "
		"flushes=timer:%llu,full:%llu,large:%llu,recv:%llu,close:%llu,idle:%llu,nodelay:%llu "
		"switches=to_rdma:%llu,to_tcp:%llu gave_back_bytes=%llu got_back_bytes=%llu "
		"regcache=hits:%llu,misses:%llu,stale:%llu,uncached:%llu "
		"waits=spun:%llu,slept:%llu,slept_us:%llu,slept_max_us:%llu "
		"woken=chan:%llu,kick:%llu,timeout:%llu helper_polls=%llu helper_looks=%llu "
		"spin_avg_us=%u "
		"time_to_rdma_us=%llu grown=rx:%llu,tx:%llu shrunk=rx:%llu,tx:%llu drains=%llu "
		"grow_refused=%llu pinned_start_bytes=%zu failover=%s resent_bytes=%llu\n",
		when, local, peer, s->is_client ? "client" : "server", sv_conn_state_name(s->state),
		sv_fallback_name(s->fallback),
		s->fallback == SV_FB_UNSUPPORTED && s->unserved ? s->unserved : "-",
		U(p->tx_bytes), U(p->rx_bytes),
		U(s->st.tcp_tx_bytes), U(s->st.tcp_rx_bytes), U(p->tx_msgs), U(p->rx_msgs),
		U(p->tx_zcopy_bytes), U(p->credit_stalls), U(p->updates_sent),
		U(p->acks_piggybacked), U(p->coalesced_writes), U(p->collected_writes),
		U(p->flushes[SV_FLUSH_TIMER]), U(p->flushes[SV_FLUSH_FULL]),
		U(p->flushes[SV_FLUSH_LARGE]), U(p->flushes[SV_FLUSH_RECV]),
		U(p->flushes[SV_FLUSH_CLOSE]), U(p->flushes[SV_FLUSH_IDLE]),
		U(p->flushes[SV_FLUSH_NODELAY]),
		U(s->st.switches_to_rdma), U(s->st.switches_to_tcp), U(p->gave_back),
		U(p->got_back), U(rc.hits), U(rc.misses), U(rc.stale), U(rc.uncached),
		U(s->st.waits_spun), U(s->st.waits_slept), U(s->st.slept_us), U(s->st.slept_max_us),
		U(s->st.woken_chan), U(s->st.woken_kick), U(s->st.woken_timeout),
		U(s->st.helper_polls), U(s->st.helper_looks),
		(unsigned)atomic_load_explicit(&s->wt.wait_avg_us, memory_order_relaxed),
		U(s->st.to_rdma_us), U(p->rx_grows), U(p->tx_grows), U(p->rx_shrinks),
		U(p->tx_shrinks), U(p->drains_sent), U(p->grow_refused), s->pinned,
		sv_failover_name(s->fo.cause), U(p->resent));
	if (n > 0)
		sv_log_raw(line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

/* What carries each direction now: the QP, or TCP (through libsovia or
 * the kernel's alone, or held until the peer proved itself). */
void sv_stream_view(struct sv_stream *s, struct sv_conn_view *v)
{
	sv_lock(&s->lock);
	const struct sv_proto *p = s->proto;
	*v = (struct sv_conn_view){
		/* libsovia's own copy (a dup'ed or lingering connection) is
		 * no fd of the application's. */
		.fd = s->fd_private ? -1 : s->fd,
		.closing = s->cl.app_closed,
		.is_client = s->is_client,
		.tx = sv_stream_tx_medium(s) == SV_MEDIUM_QP ? SV_VIEW_RDMA : SV_VIEW_TCP,
		.rx = sv_stream_rx_medium(s) == SV_MEDIUM_QP ? SV_VIEW_RDMA : SV_VIEW_TCP,
		.state = sv_conn_state_name(s->state),
		.fallback = sv_fallback_name(s->fallback),
		.call = s->fallback == SV_FB_UNSUPPORTED ? s->unserved : NULL,
		.local = s->tuple.local,
		.peer = s->tuple.peer,
		/* The kernel's branch adds to these without the lock. */
		.tcp_tx_bytes = __atomic_load_n(&s->st.tcp_tx_bytes, __ATOMIC_RELAXED),
		.tcp_rx_bytes = __atomic_load_n(&s->st.tcp_rx_bytes, __ATOMIC_RELAXED),
		.time_to_rdma_us = s->st.to_rdma_us,
	};
	if (p) {
		const struct sv_proto_stats *st = sv_proto_stats(p);
		v->rdma_tx_bytes = st->tx_bytes;
		v->rdma_rx_bytes = st->rx_bytes;
		v->credit_stalls = st->credit_stalls;
	}
	sv_unlock(&s->lock);
}
