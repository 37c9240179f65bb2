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
# A fortified build (_FORTIFY_SOURCE) calls __X_chk instead of X: every
# such variant this libc has of an interposed X must be interposed too, or
# the call goes to the kernel alone.
libc=$(ldd "$lib" | awk '$1 ~ /^libc\.so/ {print $3}')
[ -r "$libc" ] || { echo "cannot find the libc $lib links with" >&2; exit 1; }
chk=$(nm -D --defined-only "$libc" | awk '{print $3}' | sed 's/@.*//' | grep '_chk$' | sort -u)
missing=""
for s in $want; do
	if grep -qx "__${s}_chk" <<<"$chk" && ! grep -qx "__${s}_chk" <<<"$want"; then
		missing="$missing __${s}_chk"
	fi
done
if [ -n "$missing" ]; then
	echo "fortified variants of interposed calls not interposed:$missing" >&2
	exit 1
fi
n=$(echo "$have" | wc -l)
echo "exports OK: $n interposed symbols, nothing else, every fortified variant"
