/* What the tests of connections kept across a fork share: test_kept.c
 * (the parent and its children) and test_handed_copy.c (a child left
 * alone with the connection). */
#ifndef SV_TEST_KEPT_UTIL_H
#define SV_TEST_KEPT_UTIL_H

#include "preload_harness.h"

#include <stdint.h>
#include <sys/types.h>

/* The suites' .init: the harness, over a fake network whose QPs a fork
 * leaves to the parent (fake_net_fork_keeps). */
void kept_setup(void);
/* The child exited 0 (else its CHILD_CHECK number). */
void child_ok(pid_t pid);
/* Bytes both ways over the QP, every one of them. */
void exchange_on_rdma(struct pair *p, uint64_t seed);

#endif
