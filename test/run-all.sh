#!/usr/bin/env bash
# The one command that sets up and runs every test: installs the build
# dependencies and the soft-RoCE test bed, builds with warnings as errors,
# and runs the unit tests, the host checks and the test-bed tests (real
# libibverbs, rdma_cm and rxe in a qemu guest on machines without rdma_rxe).
#
#   test/run-all.sh            everything
#   test/run-all.sh -L unit    only what ctest selects (arguments go to ctest)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${SOVIA_BUILD_DIR:-$top/build}
"$top/test/setup-deps.sh"
"$top/test/bed/sovia-bed" --setup
# Warnings are errors; the run-time checks (lock order, state transitions)
# are on, in the unit tests and in every program the test bed runs.
cmake -S "$top" -B "$build" -DSOVIA_WERROR=ON -DSOVIA_CHECKS=ON
cmake --build "$build" -j"$(nproc)"
cd "$build"
# Every test runs once: a test that fails is a bug to fix.
ctest --output-on-failure --timeout 1800 "$@"
