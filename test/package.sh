#!/usr/bin/env bash
# The Debian package: built from the tree (packaging/build-deb.sh), installed
# with apt (which must find its dependencies), and what a user then has:
# the module, the header, libsovia.pc, sovia-run, sovia-stat, sovia-warden
# and its unit, and the man pages, each where the system looks for it. A program built with
# `pkg-config --cflags --libs libsovia` against the installed header alone
# asks about its own connection: run plainly it is told nothing is
# accelerated; under the installed sovia-run, libsovia answers for it (on
# this host without RDMA: on TCP, with the reason). bed.installed then
# uses the installed package over soft-RoCE, and host.package_remove
# removes it, unless a libsovia package was installed before the test.
#   test/package.sh BUILD_DIR VERSION
#   test/package.sh --remove BUILD_DIR
set -euo pipefail
if [ "${1:-}" = --remove ]; then
	marker=${2:?usage: $0 --remove BUILD_DIR}/deb/installed-by-test
	if [ -f "$marker" ]; then
		dpkg -r libsovia >/dev/null
		rm -f "$marker"
		echo "removed the package host.package installed"
	else
		echo "nothing to remove: host.package installed nothing here, or found libsovia there before"
	fi
	exit 0
fi
build=${1:?usage: $0 BUILD_DIR VERSION}
version=${2:?usage: $0 BUILD_DIR VERSION}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/sovia-pkg.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

deb=$("$src/packaging/build-deb.sh" "$build/deb" | tail -1)
[ -f "$deb" ] || fail "no package built"
echo "== built $(basename "$deb")"
[ "$(dpkg-deb -f "$deb" Package)" = libsovia ] || fail "package name"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "package version $(dpkg-deb -f "$deb" Version)"
deps=$(dpkg-deb -f "$deb" Depends)
for d in libibverbs1 librdmacm1 libc6; do
	grep -q "$d" <<<"$deps" || fail "Depends lacks $d: $deps"
done
# On a clean system apt installs only what Depends names: every library
# the package's programs and module need must come from a package named
# there (this machine has them all, so a missing one would not show here
# otherwise).
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
dpkg-deb -x "$deb" "$work/root"
elves=0
while read -r elf; do
	elves=$((elves + 1))
	for lib in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		owner=$({ dpkg -S "*/$lib" 2>/dev/null || true; } | { grep "/$multiarch/$lib\$" || true; } |
			head -1 | cut -d: -f1)
		[ -n "$owner" ] || fail "${elf#"$work/root"} needs $lib, which no package provides"
		grep -Eq "(^|, )$owner( |,|$)" <<<"$deps" ||
			fail "${elf#"$work/root"} needs $lib from $owner, not in Depends: $deps"
	done
done < <(find "$work/root" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' sh {} \; -print)
# The module, sovia-run, sovia-stat and sovia-warden at least: a check of
# nothing passes.
[ "$elves" -ge 4 ] || fail "only $elves ELF files in the package"
echo "== Depends covers every library its $elves ELF files need: $deps"

mkdir -p "$build/deb"
rm -f "$build/deb/installed-by-test"
dpkg-query -W -f '${Status}' libsovia 2>/dev/null | grep -q "install ok installed" ||
	touch "$build/deb/installed-by-test" # ours to remove afterwards
DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall "$deb" >"$work/apt.log" 2>&1 ||
	{ cat "$work/apt.log" >&2; fail "apt-get install"; }
dpkg-query -W -f '${Status}\n' libsovia | grep -qx "install ok installed" || fail "not installed"

for f in "/usr/lib/$multiarch/libsovia.so" /usr/include/sovia.h \
	"/usr/lib/$multiarch/pkgconfig/libsovia.pc" /usr/bin/sovia-run /usr/bin/sovia-stat \
	/usr/sbin/sovia-warden /usr/lib/systemd/system/sovia-warden.service \
	/usr/share/man/man7/libsovia.7.gz /usr/share/man/man1/sovia-run.1.gz \
	/usr/share/man/man8/sovia-stat.8.gz /usr/share/man/man8/sovia-warden.8.gz; do
	dpkg -S "$f" >/dev/null 2>&1 || fail "$f is not the package's"
	[ -e "$f" ] || fail "$f is missing"
done
for p in libsovia.7 sovia-run.1 sovia-stat.8 sovia-warden.8; do
	man -w "${p%.*}" >/dev/null 2>&1 || fail "man cannot find ${p%.*}"
done
[ "$(sovia-run --version)" = "sovia-run (libsovia) $version" ] || fail "sovia-run --version: $(sovia-run --version)"
[ "$(sovia-stat --version)" = "sovia-stat (libsovia) $version" ] || fail "sovia-stat --version"
[ "$(sovia-warden --version)" = "sovia-warden (libsovia) $version" ] || fail "sovia-warden --version"
unit=/usr/lib/systemd/system/sovia-warden.service
grep -qx "ExecStart=/usr/sbin/sovia-warden" "$unit" ||
	fail "the unit does not start the installed sovia-warden"
# Issue 53, finding 8: root with one capability, and the sandbox.
for d in CapabilityBoundingSet=CAP_NET_BIND_SERVICE NoNewPrivileges=yes ProtectSystem=strict \
	ProtectHome=yes PrivateTmp=yes RestrictSUIDSGID=yes MemoryDenyWriteExecute=yes; do
	grep -qx "$d" "$unit" || fail "the unit lacks $d"
done
if command -v systemd-analyze >/dev/null; then
	# verify warns of a misspelt key and still exits 0: any word is a fault.
	if ! systemd-analyze verify "$unit" >"$work/verify.log" 2>&1 || [ -s "$work/verify.log" ]; then
		cat "$work/verify.log" >&2
		fail "systemd-analyze verify"
	fi
fi
[ "$(pkg-config --modversion libsovia)" = "$version" ] || fail "pkg-config --modversion"
[ "$(pkg-config --variable=module libsovia)" = "/usr/lib/$multiarch/libsovia.so" ] ||
	fail "pkg-config's module: $(pkg-config --variable=module libsovia)"

# The example, alone in a directory: nothing of the tree's include/ in reach.
cp "$src/examples/sovia_ask.c" "$work/"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -o "$work/sovia-ask" "$work/sovia_ask.c" \
	$(pkg-config --cflags --libs libsovia) || fail "the example does not build with pkg-config"
echo "== the example built with: cc $(pkg-config --cflags --libs libsovia)"

pair() { # PORT RUNNER...: the example's server and client over loopback
	local port=$1
	shift
	"$@" "$work/sovia-ask" server "$port" 127.0.0.1 >"$work/server.out" &
	local srv=$!
	for _ in $(seq 100); do
		ss -ltnH "sport = :$port" | grep -q . && break
		sleep 0.1
	done
	"$@" "$work/sovia-ask" client 127.0.0.1 "$port" 4 >"$work/client.out" || fail "client failed"
	wait "$srv" || fail "server failed"
	cat "$work/server.out" "$work/client.out"
}
out=$(pair 5931 env)
grep -qx "server: not accelerated (libsovia is not loaded)" <<<"$out" || fail "plain run: $out"
grep -qx "client: not accelerated (libsovia is not loaded)" <<<"$out" || fail "plain run: $out"
echo "== plain: $(tr '\n' ' ' <<<"$out")"
# Loopback has no RDMA path: the client's connection is libsovia's, on
# TCP (its reason may not be known yet when it asks); the server's
# accepted one stays the kernel's where this host has no RDMA at all.
out=$(pair 5932 sovia-run)
grep -q "^client: libsovia $version managed=1 tx=tcp rx=tcp state=[a-z]* fallback=[a-z-]* .*tcp_tx_bytes=5242880 " \
	<<<"$out" || fail "preloaded run: $out"
echo "== preloaded: $(tr '\n' ' ' <<<"$out")"
echo "package OK: $(basename "$deb") installed"
