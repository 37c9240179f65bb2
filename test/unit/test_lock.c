/* libsovia's locks (src/lock.c): the thread that goes first (the helper)
 * is not starved by an application that takes the same lock in a loop. */
#include "lock.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>

TestSuite(lock, .timeout = 30);

static struct sv_lock lk = SV_LOCK_INIT(SV_RANK_STREAM);
static atomic_bool stop;
static atomic_long loops;
/* Loop turns that took the lock while the first thread waited for it. */
static atomic_long overtakes;

/* The application: a sender's tight loop, each turn under the lock. */
static void *app(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		sv_lock(&lk);
		if (atomic_load(&lk.first))
			atomic_fetch_add(&overtakes, 1);
		atomic_fetch_add(&loops, 1);
		sv_unlock(&lk);
	}
	return NULL;
}

/* Every take of the first thread waits out at most the turn that took the
 * lock before it announced itself: one overtake per take, whatever the
 * scheduler does. Without the rule the loop keeps retaking the lock before
 * the woken waiter runs. */
Test(lock, the_first_thread_is_overtaken_at_most_once_per_take)
{
	const int takes = 2000;
	long most = 0;
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, app, NULL), 0);
	while (atomic_load(&loops) < 1000)
		; /* the loop runs */
	sv_lock_go_first();
	for (int i = 0; i < takes; i++) {
		sv_lock(&lk);
		long o = atomic_exchange(&overtakes, 0); /* those of this take */
		if (o > most)
			most = o;
		sv_unlock(&lk);
	}
	atomic_store(&stop, true);
	pthread_join(t, NULL);
	cr_assert_leq(most, 1, "a take was overtaken %ld times (%ld loop turns in all)", most,
		      atomic_load(&loops));
}

/* A fork child has no helper: a lock the parent's helper waited for must
 * not make the child give way forever. */
Test(lock, reinit_forgets_a_waiting_first_thread)
{
	struct sv_lock l;
	sv_lock_init(&l, SV_RANK_STREAM);
	atomic_store(&l.first, 1); /* as a fork child inherits it */
	sv_lock_reinit(&l);
	sv_lock(&l); /* would yield forever */
	sv_unlock(&l);
	sv_lock_destroy(&l);
}
