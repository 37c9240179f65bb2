#!/usr/bin/env bash
# An integration test with libsovia built with ThreadSanitizer
# (-DSOVIA_TSAN=ON), preloaded after TSan's runtime. TSan stops a program at
# its first report (halt_on_error), so a race fails the test.
#
#   tsan.sh TEST TSAN_RUNTIME LIBSOVIA_TSAN_SO BUILD_DIR
#
# (The Criterion unit tests cannot run under TSan: Criterion's own memory
# arena breaks there, Snaipe/Criterion#274.)
set -euo pipefail
t=${1:?usage: $0 TEST TSAN_RUNTIME LIBSOVIA_TSAN_SO BUILD_DIR}
rt=${2:?} lib=${3:?} build=${4:?}
[ -f "$rt" ] || { echo "FAIL: no TSan runtime at $rt" >&2; exit 1; }
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
# LD_PRELOAD takes a space-separated list: the runtime must come first.
exec "$(dirname "$0")/$t.sh" "$rt $lib" "$build"
