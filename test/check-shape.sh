#!/usr/bin/env bash
# The code's shape, as docs/design.md states it: no file in src/ or
# preload/ over 800 lines, no function over 100; the protocol core's state
# visible only to the core (and its own unit tests); src/ independent of
# preload/. Prints what breaks a rule and exits 1.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bad=0
say() {
	echo "check-shape: $*" >&2
	bad=1
}
for f in src/*/*.[ch] preload/*.[ch]; do
	n=$(wc -l <"$f")
	[ "$n" -le 800 ] || say "$f has $n lines (at most 800)"
done
# A function runs from its opening brace in column 0 to the next closing
# brace in column 0.
for f in src/*/*.c preload/*.c; do
	awk -v f="$f" '
		/^[A-Za-z_].*\)$/ || /^[A-Za-z_].*\) *$/ { name = $0 }
		/^\{/ { start = NR }
		/^\}/ && start { if (NR - start - 1 > 100) printf "%s:%d: %s: %d lines\n", f, start, name, NR - start - 1; start = 0 }
	' "$f"
done >/tmp/check-shape.$$
if [ -s /tmp/check-shape.$$ ]; then
	while read -r line; do say "function over 100 lines: $line"; done </tmp/check-shape.$$
fi
rm -f /tmp/check-shape.$$
# The core's state: defined in proto_int.h, included only by the core.
defs=$(grep -l "^struct sv_proto {" src/*/*.h src/*/*.c preload/* 2>/dev/null || true)
[ "$defs" = "src/core/proto_int.h" ] || say "struct sv_proto is defined in: $defs (only src/core/proto_int.h)"
for f in $(grep -l '#include "proto_int.h"' src/*/* preload/* 2>/dev/null || true); do
	case "$f" in
	src/core/proto*.c | src/core/proto_int.h) ;;
	*) say "$f includes the core's private header" ;;
	esac
done
# The layers: src/ never includes the interposer's headers.
for h in preload/*.h; do
	b=$(basename "$h")
	if grep -l "#include \"$b\"" src/*/* >/dev/null 2>&1; then
		say "src/ includes preload/$b: $(grep -l "#include \"$b\"" src/*/* | tr '\n' ' ')"
	fi
done
[ "$bad" = 0 ] && echo "check-shape: OK"
exit "$bad"
