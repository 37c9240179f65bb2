#!/usr/bin/env bash
# The one command that sets up and runs every test: installs the build
# dependencies and the soft-RoCE test bed, builds with warnings as errors,
# and runs the unit tests, the host checks and the test-bed tests (real
# libibverbs, rdma_cm and rxe in a qemu guest on machines without rdma_rxe).
#
#   test/run-all.sh            everything
#   test/run-all.sh -L unit    only what ctest selects (arguments go to ctest);
#                              a label selection without bed tests needs no bed
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${SOVIA_BUILD_DIR:-$top/build}
t0=$(date +%s)
"$top/test/setup-deps.sh" # installs only what is missing
# The test bed (a qemu guest, its kernel) only for a selection that may
# hold bed tests: `-L unit` selects none.
labels=""
for ((i = 1; i <= $#; i++)); do
	case ${!i} in
	-LE* | --label-exclude*) ;;
	-L | --label-regex) j=$((i + 1)); labels=${!j:-} ;;
	-L?* | --label-regex=*) labels=${!i#-L}; labels=${labels#--label-regex=} ;;
	esac
done
if [[ -z $labels || bed =~ $labels ]]; then
	"$top/test/bed/sovia-bed" --setup
fi
# Warnings are errors; the run-time checks (lock order, state transitions)
# are on, in the unit tests and in every program the test bed runs.
t1=$(date +%s)
cmake -S "$top" -B "$build" -DSOVIA_WERROR=ON -DSOVIA_CHECKS=ON
cmake --build "$build" -j"$(nproc)"
t2=$(date +%s)
cd "$build"
# Every test runs once: a test that fails is a bug to fix. Where the time
# went, by tier, at the end (ctest's label summary is the tests' own).
rc=0
ctest --output-on-failure --timeout 1800 "$@" || rc=$?
t3=$(date +%s)
echo "time: setup $((t1 - t0)) s, build $((t2 - t1)) s, tests $((t3 - t2)) s (by label:" \
	"ctest's Label Time Summary above), in all $((t3 - t0)) s"
exit "$rc"
