#!/usr/bin/env bash
# Asserts that libsovia.so exports exactly the interposed libc symbols (the
# version script's list) and nothing of its internals.
set -euo pipefail
lib=$1
map=$(dirname "$0")/../preload/libsovia.map
want=$(sed -n '/global:/,/local:/p' "$map" | sed 's|/\*.*\*/||' | tr ' ;' '\n\n' |
	grep -Ev '^(global:|local:|\*|)$' | sort)
have=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TWiV]$/ {print $3}' | sed 's/@.*//' | sort)
if [ "$want" != "$have" ]; then
	echo "exported symbols differ from preload/libsovia.map:" >&2
	diff <(echo "$want") <(echo "$have") >&2 || true
	exit 1
fi
n=$(echo "$have" | wc -l)
echo "exports OK: $n interposed symbols, nothing else"
