#!/usr/bin/env bash
# Asserts that libsovia.so exports exactly the interposed libc symbols
# (preload/interposed.list, unversioned) and the public API (the version
# script's list, each at its version), nothing of its internals.
set -euo pipefail
lib=$1
dir=$(dirname "$0")/../preload
want=$(grep -v '^#' "$dir/interposed.list" | sort)
api=$(sed 's|/\*.*\*/||' "$dir/libsovia.map" | tr -d '\n' | grep -o '[A-Z_0-9.]* *{ *global:[^}]*}' |
	while read -r node rest; do
		tr ' ;' '\n\n' <<<"${rest#*global:}" | grep -Ev '^(\}|)$' | sed "s/\$/@@$node/"
	done | sort)
dyn=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TWiV]$/ {print $3}')
have=$(grep -v '@@SOVIA_' <<<"$dyn" | sed 's/@.*//' | sort)
have_api=$(grep '@@SOVIA_' <<<"$dyn" | sort)
if [ "$want" != "$have" ]; then
	echo "unversioned exports differ from preload/interposed.list:" >&2
	diff <(echo "$want") <(echo "$have") >&2 || true
	exit 1
fi
if [ -z "$api" ] || [ "$api" != "$have_api" ]; then
	echo "versioned exports differ from preload/libsovia.map:" >&2
	diff <(echo "$api") <(echo "$have_api") >&2 || true
	exit 1
fi
# An interposed symbol with a version would not stand in for glibc's.
if nm -D --defined-only "$lib" | awk '{print $3}' | grep -Fxf <(sed 's/$/@@SOVIA_1.0/' <<<"$want") >/dev/null; then
	echo "an interposed symbol carries a version" >&2
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
echo "exports OK: $n interposed symbols, the API ($(echo $have_api)), nothing else, every fortified variant"
