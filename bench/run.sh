#!/usr/bin/env bash
# The benchmark harness, one command (issue 5): installs what it needs,
# builds, runs bench/bed-run.sh in the soft-RoCE test bed (raw verbs, kernel
# TCP, rsockets and libsovia side by side on one rxe device) and leaves the
# CSV, the Markdown table and the plots in the results folder.
#
# usage: bench/run.sh [--smoke] [--out DIR] [--build DIR] [--timeout SEC]
#   --smoke    small sizes, few iterations (what CI runs: bed.bench_smoke)
#   --out      results folder (default: results/ at the top of the tree;
#              --smoke: BUILD/bench-smoke)
#   --build    build directory (default: build/)
#   --timeout  bound on the test-bed run (default 1800 s)
# Only one test-bed guest should run at a time on a small machine; to share
# it, take a lock around the whole command, e.g.
#   flock /tmp/bed.lock bench/run.sh
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
SMOKE=0 OUT="" BUILD=$TOP/build TIMEOUT=1800
while [ $# -gt 0 ]; do
	case "$1" in
	--smoke) SMOKE=1 ;;
	--out) OUT=$2; shift ;;
	--build) BUILD=$2; shift ;;
	--timeout) TIMEOUT=$2; shift ;;
	*) echo "usage: $0 [--smoke] [--out DIR] [--build DIR] [--timeout SEC]" >&2; exit 2 ;;
	esac
	shift
done
"$TOP/test/setup-deps.sh"
"$TOP/bench/setup-deps.sh"
cmake -S "$TOP" -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target sovia sovia-bench sovia-copycost sovia-pingsplit
if [ -z "$OUT" ]; then
	if [ "$SMOKE" = 1 ]; then OUT=$BUILD/bench-smoke; else OUT=$TOP/results; fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
args=(--lib "$BUILD/preload/libsovia.so" --bench "$BUILD/bin/sovia-bench" --out "$OUT")
[ "$SMOKE" = 1 ] && args=(--smoke --check "${args[@]}")
t0=$(date +%s)
rc=0
cmdline=bench/run.sh
[ "$SMOKE" = 1 ] && cmdline+=" --smoke"
SOVIA_BENCH_CMD=$cmdline "$TOP/test/bed/sovia-bed" --timeout "$TIMEOUT" -- "$TOP/bench/bed-run.sh" "${args[@]}" || rc=$?
echo "bench/run.sh: test bed run took $(($(date +%s) - t0)) s, exit $rc; results in $OUT"
exit "$rc"
