#!/usr/bin/env bash
# An integration test with libsovia built with ThreadSanitizer
# (-DSOVIA_TSAN=ON), preloaded with TSan's runtime right after it. TSan stops a program at
# its first report (halt_on_error), so a race fails the test.
#
#   tsan.sh "TEST..." TSAN_RUNTIME LIBSOVIA_TSAN_SO BUILD_DIR
#
# The tests (scripts of this folder, without ".sh") run one after another
# in this guest, sharing its boot (group.sh), every one even after another
# failed.
# (The Criterion unit tests cannot run under TSan: Criterion's own memory
# arena breaks there, Snaipe/Criterion#274.)
set -euo pipefail
tests=${1:?usage: $0 "TEST..." TSAN_RUNTIME LIBSOVIA_TSAN_SO BUILD_DIR}
rt=${2:?} lib=${3:?} build=${4:?}
[ -f "$rt" ] || { echo "FAIL: no TSan runtime at $rt" >&2; exit 1; }
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
# A report is about 50 lines, both stacks included: show all of it on failure
# (the first one of this suite was cut to its tail and lost the other stack).
export SOVIA_FAIL_LINES=${SOVIA_FAIL_LINES:-80}
# Cases that start threads in a child of a threaded process (a prefork
# worker's helper) skip themselves: TSan does not support that and stops
# the child (die_after_fork).
export SOVIA_IT_TSAN=1
# A race shows in the interleavings of thousands of messages, not in the
# volume: a quarter of bidir's bytes.
export SOVIA_IT_BIDIR=${SOVIA_IT_BIDIR:-5000000}
preload="$lib $rt"
# LD_PRELOAD takes a space-separated list. libsovia comes first and the
# runtime right after it (ahead of libc, so our calls to pthread_mutex_lock,
# malloc... reach TSan's interceptors). The other order hides our locks:
# the app's epoll_wait/poll/read would reach TSan's interceptor first, and
# TSan ignores every interceptor, pthread_mutex_lock included, for the
# length of a blocking call (BlockingCall raises ignore_interceptors), so
# the stream locks libsovia takes inside it would not count and accesses
# under them would be reported as races.
#
# First the canary: a deliberate race, under the same preload, must be
# reported, or a clean run below would prove nothing.
canary="$build/bin/sovia-tsan-canary"
[ -x "$canary" ] || { echo "FAIL: no $canary" >&2; exit 1; }
set +e
LD_PRELOAD="$preload" "$canary" >/dev/null 2>"${TMPDIR:-/tmp}/tsan-canary.err"
rc=$?
set -e
if [ "$rc" != 66 ] || ! grep -q "WARNING: ThreadSanitizer: data race" "${TMPDIR:-/tmp}/tsan-canary.err"; then
	echo "FAIL: TSan did not report the canary's race (exit $rc); is the runtime active?" >&2
	cat "${TMPDIR:-/tmp}/tsan-canary.err" >&2
	exit 1
fi
echo "tsan: the canary's race was reported; running $tests"
# $tests unquoted: one word per test.
# shellcheck disable=SC2086
exec "$(dirname "$0")/group.sh" "$preload" "$build" $tests
