/* The fork guard around librdmacm's calls (cm.h): librdmacm takes its own
 * process-wide mutex inside many calls, and a child forked while another
 * thread held it would wait on it for ever. A fork must wait for the calls
 * in flight, and the child's calls must not wait at all. */
#include "cm.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(cmguard, .timeout = 30);

static atomic_int entered, left;

static void *caller(void *arg)
{
	(void)arg;
	sv_cm_calls_enter();
	atomic_store(&entered, 1);
	struct timespec ts = {0, 200 * 1000 * 1000};
	nanosleep(&ts, NULL); /* "inside librdmacm" */
	atomic_store(&left, 1);
	sv_cm_calls_leave();
	return NULL;
}

Test(cmguard, a_fork_waits_for_the_calls_in_flight)
{
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, caller, NULL), 0);
	while (!atomic_load(&entered))
		sched_yield();
	pid_t p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		/* The guard is free here, and so would librdmacm's lock be. */
		sv_cm_calls_enter();
		sv_cm_calls_leave();
		_exit(atomic_load(&left) ? 0 : 3);
	}
	cr_assert_eq(atomic_load(&left), 1, "the fork did not wait for the call in flight");
	int st;
	cr_assert_eq(waitpid(p, &st, 0), p);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d", st);
	pthread_join(t, NULL);
	/* And the parent's own calls go on after the fork. */
	sv_cm_calls_enter();
	sv_cm_calls_leave();
}

/* Calls on many threads at once do not wait for each other. */
Test(cmguard, calls_do_not_exclude_each_other)
{
	sv_cm_calls_enter();
	pthread_t t;
	atomic_store(&entered, 0);
	atomic_store(&left, 0);
	cr_assert_eq(pthread_create(&t, NULL, caller, NULL), 0);
	pthread_join(t, NULL);
	cr_assert_eq(atomic_load(&left), 1);
	sv_cm_calls_leave();
}

/* A step made between the calls may make calls itself (the helper starts
 * rdma_cm and notes how long it took as one step): a nested call goes on
 * while a fork waits, and the fork comes after the step. */
static void *nesting_caller(void *arg)
{
	(void)arg;
	sv_cm_calls_enter();
	atomic_store(&entered, 1);
	struct timespec ts = {0, 200 * 1000 * 1000};
	nanosleep(&ts, NULL); /* the fork is waiting by now */
	sv_cm_calls_enter();
	sv_cm_calls_leave();
	atomic_store(&left, 1);
	sv_cm_calls_leave();
	return NULL;
}

Test(cmguard, a_nested_call_goes_on_while_a_fork_waits)
{
	atomic_store(&entered, 0);
	atomic_store(&left, 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, nesting_caller, NULL), 0);
	while (!atomic_load(&entered))
		sched_yield();
	pid_t p = fork();
	cr_assert_geq(p, 0);
	if (p == 0)
		_exit(atomic_load(&left) ? 0 : 3);
	cr_assert_eq(atomic_load(&left), 1, "the fork split the step");
	int st;
	cr_assert_eq(waitpid(p, &st, 0), p);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	pthread_join(t, NULL);
}
