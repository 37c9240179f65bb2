#!/usr/bin/env bash
# An install elsewhere (`cmake --install BUILD --prefix DIR`), as a user
# without root makes one: libsovia.pc there names DIR's header and module
# (its paths follow ${prefix}), the example builds against them alone, and
# the installed sovia-run finds the installed module.
#   test/install_prefix.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/sovia-prefix.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
cmake --install "$build" --prefix "$dir/usr" >"$dir/install.log" || {
	cat "$dir/install.log" >&2
	fail "cmake --install --prefix"
}
pc=$(find "$dir/usr" -name libsovia.pc)
[ -n "$pc" ] || fail "no libsovia.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
grep -q "^prefix=$dir/usr\$" "$pc" || fail "libsovia.pc's prefix: $(grep '^prefix=' "$pc")"
grep -E '^(includedir|libdir)=' "$pc" | grep -qv '=\${prefix}/' &&
	fail "libsovia.pc holds paths not under \${prefix}: $(grep -E '^(includedir|libdir)=' "$pc")"
[ "$(pkg-config --cflags libsovia | xargs)" = "-I$dir/usr/include" ] ||
	fail "pkg-config --cflags: $(pkg-config --cflags libsovia)"
module=$(pkg-config --variable=module libsovia)
[ -f "$module" ] && [ "${module#"$dir"/usr/}" != "$module" ] ||
	fail "pkg-config's module is not the installed one: $module"
cp "$src/examples/sovia_ask.c" "$dir/"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -o "$dir/sovia-ask" "$dir/sovia_ask.c" \
	$(pkg-config --cflags --libs libsovia) || fail "the example does not build against the install"
preload=$("$dir/usr/bin/sovia-run" -- sh -c 'echo "$LD_PRELOAD"')
case " $preload " in
*" $module "*) ;;
*) fail "the installed sovia-run preloads '$preload', not $module" ;;
esac
echo "PASS: an install to $dir/usr: cflags $(pkg-config --cflags libsovia), module $module; the example built"
