#!/usr/bin/env bash
# Builds libsovia's Debian package from the tree:
#   packaging/build-deb.sh [OUTDIR]      (default: build-deb)
# A release build with prefix /usr (the paths sovia-run and libsovia.pc
# hold are the configured prefix's) and without the tests, then CPack.
# Prints the package's path on its last line.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-build-deb}")
cmake -S "$src" -B "$out/build" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DSOVIA_BUILD_TESTS=OFF >"$out.cmake.log" 2>&1 || { cat "$out.cmake.log" >&2; exit 1; }
cmake --build "$out/build" -j"$(nproc)" >"$out.build.log" 2>&1 || { tail -50 "$out.build.log" >&2; exit 1; }
rm -f "$out"/libsovia_*.deb
(cd "$out/build" && cpack -G DEB -B "$out" >"$out.cpack.log" 2>&1) ||
	{ cat "$out.cpack.log" >&2; exit 1; }
ls "$out"/libsovia_*.deb
