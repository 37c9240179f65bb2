/* Closing: the application's close() returns at once; the helper thread
 * delivers what is still queued, sends FIN, and closes the QP and the TCP
 * socket (SOVIA's close thread). Process exit pushes everything out. */
#include "real.h"
#include "stream_int.h"

#include "config.h"
#include "helper.h"
#include "log.h"
#include "verbs.h"

#include <errno.h>
#include <rdma/rdma_cma.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long a closed connection may take to deliver its last bytes. */
#define SV_LINGER_US (30u * 1000000u)

/* A descriptor number far from the ones the application uses. */
static int high_fd_base(void)
{
	struct rlimit rl;
	int base = 1000;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (rlim_t)base >= rl.rlim_cur)
		base = (int)(rl.rlim_cur > 64 ? rl.rlim_cur - 64 : 3);
	return base;
}

int sv_stream_share(struct sv_stream *s)
{
	int r = 0;
	pthread_mutex_lock(&s->lock);
	if (!s->fd_private) {
		/* The application may close any copy, this one first: the
		 * stream keeps a copy of its own. */
		int keep = SV_REAL(fcntl)(s->fd, F_DUPFD_CLOEXEC, high_fd_base());
		if (keep < 0) {
			r = -errno;
		} else {
			s->fd = keep;
			s->fd_private = true;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

void sv_stream_opened(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	s->opens++;
	pthread_mutex_unlock(&s->lock);
}

int sv_stream_close(struct sv_stream *s, int appfd)
{
	pthread_mutex_lock(&s->lock);
	int r = 0;
	if (s->fd != appfd && SV_REAL(close)(appfd) < 0)
		r = -errno; /* a copy: the stream has its own */
	if (s->opens > 1) {
		s->opens--; /* other copies keep the connection */
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	s->opens = 0;
	s->app_closed = true;
	if (!s->proto_ready || s->state == SV_CONN_FALLBACK || s->state == SV_CONN_DETACHED) {
		/* Nothing of ours to finish: the kernel closes as usual. */
		int fd = s->fd;
		if (sv_cfg.stats)
			sv_stream_print_stats(s, "close");
		s->fd = -1;
		/* Judged under the lock: the helper's start_connect sets id
		 * and state under it. */
		bool helper_part = s->id || s->state == SV_CONN_RESOLVING ||
				   s->state == SV_CONN_REQUESTED || s->state == SV_CONN_DETACHED;
		pthread_mutex_unlock(&s->lock);
		if (helper_part)
			sv_helper_watch(s); /* let the helper drop its part */
		if (SV_REAL(close)(fd) < 0 && r == 0)
			r = -errno;
		return r;
	}
	if (s->fd == appfd) {
		/* The application's fd number is free again at once; the
		 * connection lives on a private copy until it is finished. */
		int keep = SV_REAL(fcntl)(s->fd, F_DUPFD_CLOEXEC, high_fd_base());
		if (keep < 0) {
			r = -errno;
			sv_warn("fd %d: cannot keep the connection for a lingering close (%d)",
				s->fd, r);
		} else {
			if (SV_REAL(close)(s->fd) < 0)
				r = -errno;
			s->fd = keep;
			s->fd_private = true;
		}
	}
	if (s->state == SV_CONN_SWITCHING)
		sv_info("fd %d: closed while switching to RDMA: the switch finishes first", appfd);
	s->linger_deadline_us = sv_now_us() + SV_LINGER_US;
	pthread_mutex_unlock(&s->lock);
	sv_helper_watch(s);
	return r;
}

uint64_t sv_stream_linger(struct sv_stream *s, uint64_t now, bool *done)
{
	struct sv_proto *p = &s->proto;
	bool finished = true;
	if (s->state == SV_CONN_DETACHING) {
		sv_stream_progress(s);
		finished = s->state != SV_CONN_DETACHING;
	} else if (s->proto_ready && s->state != SV_CONN_FALLBACK && s->state != SV_CONN_DETACHED &&
		   !s->error) {
		sv_stream_progress(s);
		if (p->tx_state == SV_TX_OPEN && !s->tx_held)
			sv_proto_send_fin(p, now); /* -EAGAIN: try again after credits */
		bool delivered = p->nfree == sv_proto_nsend(&p->prm);
		/* A switch under way finishes first (the helper pumps the
		 * peer's TCP bytes up to its echo): closed now, the peer's echo
		 * would find our socket closed or unread, and the kernel would
		 * answer with a reset instead of the FIN the peer must see. */
		finished = (p->tx_state != SV_TX_OPEN || s->tx_held) && delivered &&
			   !s->echo_owed && s->state != SV_CONN_SWITCHING;
	}
	if (!finished && now < s->linger_deadline_us) {
		uint64_t next = sv_proto_next_deadline(p, now);
		uint64_t tick = now + 10000; /* completions also wake us */
		return next && next < tick ? next : tick;
	}
	if (!finished)
		sv_info("fd %d: closing with data undelivered after the linger time", s->fd);
	sv_stream_kernel_shut(s);
	if (sv_cfg.stats)
		sv_stream_print_stats(s, "close");
	if (s->id && s->proto_ready)
		sv_upgrade_disconnect(s); /* the peer learns at once, not by timeout */
	if (s->fd >= 0) {
		if (!finished || s->error) {
			/* Like TCP's abortive close: the peer sees a reset. */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};
			SV_REAL(setsockopt)(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		}
		SV_REAL(close)(s->fd);
		s->fd = -1;
	}
	*done = true;
	return 0;
}

void sv_stream_exit_flush(struct sv_stream *s)
{
	pthread_mutex_lock(&s->lock);
	struct sv_proto *p = &s->proto;
	/* A closed connection in the middle of its switch: let it finish,
	 * as its lingering close would have (see sv_stream_linger). */
	uint64_t until = sv_now_us() + 2000000u;
	while (s->app_closed && s->state == SV_CONN_SWITCHING && !s->error &&
	       sv_now_us() < until) {
		sv_stream_progress(s);
		sv_stream_pump_tcp(s);
		if (s->state == SV_CONN_SWITCHING)
			sv_stream_wait(s, 0, sv_now_us() + 1000);
	}
	if (s->proto_ready && s->state != SV_CONN_FALLBACK && !s->error &&
	    p->tx_state == SV_TX_OPEN) {
		sv_stream_drain(s);
		/* A connection the application closed but the helper had not
		 * finished yet: its FIN goes too. */
		uint64_t end = sv_now_us() + 2000000u;
		while (s->app_closed && p->tx_state == SV_TX_OPEN && !s->error &&
		       sv_now_us() < end) {
			sv_stream_progress(s);
			if (sv_proto_send_fin(p, sv_now_us()) != -EAGAIN)
				break;
			sv_stream_wait(s, 0, end);
		}
		sv_stream_drain(s);
	}
	uint64_t end = sv_now_us() + 5000000u;
	while (s->state == SV_CONN_DETACHING && !s->error && sv_now_us() < end) {
		sv_stream_progress(s);
		if (s->state == SV_CONN_DETACHING)
			sv_stream_wait(s, POLLOUT, sv_now_us() + 10000);
	}
	if (sv_cfg.stats && !s->stats_printed)
		sv_stream_print_stats(s, "exit");
	pthread_mutex_unlock(&s->lock);
}
