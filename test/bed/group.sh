#!/usr/bin/env bash
# Several bed tests in one guest. Under emulation a boot costs about ten
# seconds, and running two guests at once makes each test about 2.5 times
# slower on two cores (measured): the time to save is in the boots. The
# tests of a group share the guest and nothing else: each runs as its own
# process, with its own work directory, traps and first contact
# (lib.sh), one after another, every one even after another failed. The
# group fails if any of its tests did, and says which.
#
#   group.sh LIBSOVIA_SO BUILD_DIR TEST...
#
# TEST: a script of this folder, without ".sh", that takes LIBSOVIA_SO
# and BUILD_DIR (the bed tests that need settings of their own, or change
# the guest, as failover's netdev down, run in guests of their own).
set -uo pipefail
lib=${1:?usage: $0 LIBSOVIA_SO BUILD_DIR TEST...}
build=${2:?usage: $0 LIBSOVIA_SO BUILD_DIR TEST...}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
failed=()
for t in "$@"; do
	[ -f "$here/$t.sh" ] || { echo "FAIL: no bed test $t" >&2; failed+=("$t"); continue; }
	echo "===== $t"
	start=$SECONDS
	if bash "$here/$t.sh" "$lib" "$build"; then
		echo "===== $t: passed in $((SECONDS - start)) s"
	else
		echo "===== $t: FAILED in $((SECONDS - start)) s" >&2
		failed+=("$t")
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "FAIL: ${failed[*]} (of: $*)" >&2
	exit 1
fi
echo "group: all $# passed: $*"
