#!/usr/bin/env bash
# The demo: builds libsovia, brings up soft-RoCE (a qemu guest with rxe on
# machines whose kernel lacks it), and moves a file with unmodified nc
# preloaded with libsovia. It prints what carried the bytes: libsovia's
# per-connection statistics and the RDMA device's packet counter.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${SOVIA_BUILD_DIR:-$top/build}
"$top/test/setup-deps.sh"
"$top/test/bed/sovia-bed" --setup
cmake -S "$top" -B "$build" >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
exec "$top/test/bed/sovia-bed" --timeout 1200 -- "$top/examples/demo-guest.sh" \
	"$build/preload/libsovia.so" "${SOVIA_DEMO_MB:-64}"
