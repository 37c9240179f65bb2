/* The data calls of an fd entry that go to the kernel's socket while its
 * connection may get a successor (stream.h, struct sv_kcalls): counted, so
 * that a successor takes its counts only once none is under way, and once
 * it took the fd over, passed on to it. */
#include "stream.h"

#include "helper.h"

struct sv_stream *sv_kcalls_enter(struct sv_kcalls *k)
{
	/* Counted first: a successor that took the fd after our look at
	 * `next` waits for us (sequentially consistent, both). */
	atomic_fetch_add(&k->n, 1);
	struct sv_stream *n = atomic_load(&k->next);
	if (!n)
		return NULL;
	sv_stream_get(n);
	sv_kcalls_leave(k);
	return n;
}

void sv_kcalls_leave(struct sv_kcalls *k)
{
	if (atomic_fetch_sub(&k->n, 1) != 1)
		return;
	/* The last: a successor that waits for it looks again. It lives as
	 * long as k, which the caller's fd entry holds. */
	struct sv_stream *n = atomic_load(&k->next);
	if (n)
		sv_helper_watch(n);
}

void sv_kcalls_took(struct sv_kcalls *k, struct sv_stream *n)
{
	sv_stream_get(n);
	sv_stream_put(atomic_exchange(&k->next, n));
}

void sv_kcalls_forget(struct sv_kcalls *k)
{
	sv_stream_put(atomic_exchange(&k->next, NULL));
}
