#!/usr/bin/env bash
# The code's shape, as docs/design.md ("Modules") states it. Prints what
# breaks a rule and exits 1:
#  - a module's private header (*_int.h) is included only inside its
#    folder (tests, under test/, may look inside the module they test);
#  - a module includes the headers of its own folder and of the modules
#    below it, never of one above;
#  - calls between module folders go down the order below, never up or
#    sideways, so the call graph between them has no cycle; calls up go
#    through operations tables (function pointers), which nm does not see.
#    Read from the objects of a build (BUILD_DIR, the first argument), by
#    the symbols each one defines and takes from others;
#  - nothing in src/ resolves a libc symbol by itself (src/base/real.c
#    does it for everyone: SV_REAL, sv_real_syscall);
#  - README.md is at most 150 lines.
# Files over 800 lines and functions over 100 are reported as hints (a
# sign to split), not failures.
#
#   test/check-shape.sh [BUILD_DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-}
cd "$top"
bad=0
say() {
	echo "check-shape: $*" >&2
	bad=1
}
hint() { echo "check-shape: hint: $*" >&2; }

# The modules, from the bottom up; preload/ is the interposer on top.
ORDER=(base core verbs helper upgrade stream share preload)
module_of() { # path -> module name, or "" outside src/ and preload/
	case "$1" in
	src/*/*) local m=${1#src/}; echo "${m%%/*}" ;;
	preload/*) echo preload ;;
	*) echo "" ;;
	esac
}
rank_of() {
	local i
	for i in "${!ORDER[@]}"; do
		[ "${ORDER[$i]}" = "$1" ] && { echo "$i"; return; }
	done
	echo -1
}
for d in src/*/; do
	m=$(basename "$d")
	[ "$(rank_of "$m")" -ge 0 ] || say "src/$m/ is no module of the order (${ORDER[*]}): add it"
done

# ---- Private headers ----------------------------------------------------------------
while IFS= read -r h; do
	dir=$(dirname "$h")
	name=$(basename "$h")
	while IFS= read -r f; do
		[ -n "$f" ] || continue
		case "$f" in
		"$dir"/*) ;;
		test/*) ;;
		*) say "$f includes $h, private to $dir/" ;;
		esac
	done < <(grep -rl --include='*.[ch]' "#include \"$name\"" src preload tools examples bench test 2>/dev/null || true)
done < <(ls src/*/*_int.h preload/*_int.h 2>/dev/null)
# ---- Includes go down ----------------------------------------------------------------
declare -A home
for h in src/*/*.h; do
	home[$(basename "$h")]=$(module_of "$h")
done
while IFS=: read -r f _ inc; do
	name=$(sed -n 's/.*#include "\([^"]*\)".*/\1/p' <<<"$inc")
	to=${home[$name]:-}
	from=$(module_of "$f")
	[ -n "$to" ] && [ -n "$from" ] || continue
	[ "$(rank_of "$to")" -le "$(rank_of "$from")" ] ||
		say "$f ($from) includes $name of $to: includes go down (${ORDER[*]})"
done < <(grep -rn --include='*.[ch]' '^#include "' src preload 2>/dev/null || true)
# The core's state is defined in its private header alone.
defs=$(grep -l "^struct sv_proto {" src/*/*.[ch] preload/*.[ch] 2>/dev/null || true)
[ "$defs" = "src/core/proto_int.h" ] || say "struct sv_proto is defined in: $defs (only src/core/proto_int.h)"

# ---- libc's symbols: resolved once, in src/base/real.c ------------------------------------
while IFS= read -r line; do
	say "resolves a symbol itself (use SV_REAL or sv_real_syscall): $line"
done < <(grep -rn --include='*.[ch]' -E 'dlsym|dlvsym|RTLD_NEXT|(^|[^_a-z])syscall *\(' src |
	grep -v '^src/base/real\.[ch]:' | grep -v 'sv_real_syscall()' | grep -vE ':[0-9]+:\s*(/?\*|//)' || true)

# ---- README -------------------------------------------------------------------------------
n=$(wc -l <README.md)
[ "$n" -le 150 ] || say "README.md has $n lines (at most 150: the rest goes to docs/ and the man pages)"

# ---- Calls between modules, from a build's objects ----------------------------------------
if [ -n "$build" ]; then
	objs=$(find "$build/src/CMakeFiles/sovia_core.dir" "$build/preload/CMakeFiles/sovia_preload.dir" \
		"$build/preload/CMakeFiles/sovia_fdtable.dir" -name '*.c.o' 2>/dev/null || true)
	[ -n "$objs" ] || say "no objects of the library under $build (build it first)"
	# Each object's module from its path, then: defined symbols, and the
	# symbols it takes.
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	for o in $objs; do
		rel=${o#"$build"/}
		case "$rel" in
		src/CMakeFiles/sovia_core.dir/*) src=src/${rel#src/CMakeFiles/sovia_core.dir/} ;;
		preload/CMakeFiles/*/*) src=preload/${rel##*/} ;;
		esac
		src=${src%.o}
		[ -f "$src" ] || continue # an object of a file that is gone
		m=$(module_of "$src")
		nm "$o" | awk -v f="$src" -v m="$m" '
			$1 == "U" { print "U", f, m, $2 }
			NF == 3 && $2 ~ /[TDBRCGSV]/ { print "D", f, m, $3 }'
	done >"$tmp/syms"
	awk '
		$1 == "D" { mod[$4] = $3; file[$4] = $2 }
		$1 == "U" { use[++n] = $2 " " $3 " " $4 }
		END {
			for (i = 1; i <= n; i++) {
				split(use[i], u, " ")
				if ((u[3] in mod) && mod[u[3]] != u[2])
					print u[2], mod[u[3]], u[1], file[u[3]], u[3]
			}
		}' "$tmp/syms" | sort -u >"$tmp/edges"
	while read -r from to f g sym; do
		rf=$(rank_of "$from") rt=$(rank_of "$to")
		[ "$rt" -lt "$rf" ] || say "$f ($from) calls $sym of $g ($to): calls go down (${ORDER[*]})"
	done <"$tmp/edges"
fi

# ---- Hints: sizes -------------------------------------------------------------------------
for f in src/*/*.[ch] preload/*.[ch]; do
	n=$(wc -l <"$f")
	[ "$n" -le 800 ] || hint "$f has $n lines (over 800: a sign to split)"
done
for f in src/*/*.c preload/*.c; do
	# A function runs from its opening brace in column 0 to the next
	# closing brace in column 0.
	awk -v f="$f" '
		/^[A-Za-z_].*\)$/ || /^[A-Za-z_].*\) *$/ { name = $0 }
		/^\{/ { start = NR }
		/^\}/ && start { if (NR - start - 1 > 100) printf "%s:%d: %s: %d lines\n", f, start, name, NR - start - 1; start = 0 }
	' "$f"
done | while IFS= read -r line; do hint "function over 100 lines: $line"; done

[ "$bad" = 0 ] && echo "check-shape: OK"
exit "$bad"
