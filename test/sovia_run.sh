#!/usr/bin/env bash
# sovia-run from the build tree: its flags become libsovia's settings, it
# preloads the module once, its exit status is the program's (125 its own
# failure, 126 a program that cannot run, 127 one not found), a bad flag or a
# value the module would not take is refused with a clear message before the
# program starts, and a real program run under it has libsovia loaded.
#   test/sovia_run.sh SOVIA_RUN LIBSOVIA_SO
set -euo pipefail
run=${1:?usage: $0 SOVIA_RUN LIBSOVIA_SO}
lib=$(realpath "${2:?usage: $0 SOVIA_RUN LIBSOVIA_SO}")
work=$(mktemp -d /tmp/sovia-run.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
# The environment sovia-run gives a program, one variable a line.
env_of() { env -u LD_PRELOAD -u SOVIA_MODULE "$run" "$@" env; }
# status WANT ARGS...: sovia-run's exit status, its stderr kept for `said`.
status() {
	local want=$1 got=0
	shift
	env -u LD_PRELOAD "$run" "$@" >"$work/out" 2>"$work/err" || got=$?
	[ "$got" = "$want" ] || fail "sovia-run $*: exit $got, wanted $want ($(cat "$work/err"))"
}
said() { grep -qF -- "$1" "$work/err" || fail "stderr lacks '$1': $(cat "$work/err")"; }

# Version and help: every setting of the module has its flag.
[ "$("$run" --version)" = "sovia-run (libsovia) $(sed -n 's/^project(libsovia VERSION \([0-9.]*\).*/\1/p' \
	"$(dirname "$0")/../CMakeLists.txt")" ] || fail "--version: $("$run" --version)"
"$run" --help >"$work/help"
for s in DISABLE LOG STATS WINDOW BUF_SIZE BUF_START BUF_IDLE_MS ACK_DELAY ACK_TIMEOUT_US COALESCE \
	COALESCE_SIZE COALESCE_TIMEOUT_US REG_THRESHOLD UPGRADE_TIMEOUT_MS UPGRADE_DELAY_MS \
	PEER_HOLD_MS SPIN_US PRIVILEGED_PORTS WARDEN_PORT WARDEN_REQUIRED FORK_KEEP ASK_AGAIN; do
	grep -q "SOVIA_${s}[ =:]" "$work/help" || fail "--help does not name SOVIA_$s"
done
# The module's own table holds exactly these settings: a new one without a
# flag here would show in the module but not in this list.
n=$(grep -c '^        SOVIA_' "$work/help")
[ "$n" = 22 ] || fail "--help lists $n settings, wanted 22"
# The man pages document every setting and flag the module has.
man=$(dirname "$0")/../man
for s in $(sed -n 's/^        \(SOVIA_[A-Z_]*\).*/\1/p' "$work/help"); do
	grep -q "^\.BR $s " "$man/libsovia.7.in" || fail "libsovia(7) does not document $s"
	grep -q "^\.BR* $s\( \|$\)" "$man/sovia-run.1.in" || fail "sovia-run(1) lacks $s"
done
for f in $(sed -n 's/^  --\(\[no-\]\)\?\([a-z-]*\).*/\2/p' "$work/help"); do
	# In roff a dash is "\-": --buf-size is written \-\-buf\-size.
	grep -qF -- "\\-\\-${f//-/\\-}" "$man/sovia-run.1.in" || fail "sovia-run(1) lacks --$f"
done

# Flags become settings, both spellings; yes/no flags both ways.
env_of --stats --no-coalesce --window 16 --buf-size=64k --log debug --ack-delay=4 \
	--no-fork-keep --privileged-ports >"$work/env"
for kv in SOVIA_STATS=1 SOVIA_COALESCE=0 SOVIA_WINDOW=16 SOVIA_BUF_SIZE=64k SOVIA_LOG=debug \
	SOVIA_ACK_DELAY=4 SOVIA_FORK_KEEP=0 SOVIA_PRIVILEGED_PORTS=1 "LD_PRELOAD=$lib"; do
	grep -qx "$kv" "$work/env" || fail "no $kv in the program's environment: $(cat "$work/env")"
done
env_of --coalesce --no-stats >"$work/env"
grep -qx SOVIA_COALESCE=1 "$work/env" && grep -qx SOVIA_STATS=0 "$work/env" ||
	fail "--coalesce --no-stats: $(grep SOVIA_ "$work/env")"
# A flag overrides the environment; the environment's other settings stay.
SOVIA_WINDOW=32 SOVIA_SPIN_US=0 env_of --window 64 >"$work/env"
grep -qx SOVIA_WINDOW=64 "$work/env" && grep -qx SOVIA_SPIN_US=0 "$work/env" ||
	fail "flags over the environment: $(grep SOVIA_ "$work/env")"
# The module goes first in LD_PRELOAD, and only once.
# (The other module's name need not exist: the loader only warns.)
LD_PRELOAD=/nonexistent/other.so "$run" env >"$work/env" 2>/dev/null
grep -qx "LD_PRELOAD=$lib:/nonexistent/other.so" "$work/env" ||
	fail "LD_PRELOAD with another module: $(grep LD_PRELOAD "$work/env")"
LD_PRELOAD="/nonexistent/other.so $lib" "$run" env >"$work/env" 2>/dev/null
grep -qx "LD_PRELOAD=/nonexistent/other.so $lib" "$work/env" ||
	fail "LD_PRELOAD that holds the module: $(grep LD_PRELOAD "$work/env")"
# Any shared object the loader can preload is taken (here libm).
libm=$(realpath "$(gcc -print-file-name=libm.so.6)")
env -u LD_PRELOAD "$run" --lib "$libm" env | grep -qx "LD_PRELOAD=$libm" || fail "--lib $libm refused"
# --lib and SOVIA_MODULE choose the module (a symbolic link is resolved).
ln -s "$lib" "$work/link.so"
env -u LD_PRELOAD "$run" --lib "$work/link.so" env | grep -qx "LD_PRELOAD=$lib" ||
	fail "--lib is not used"
env -u LD_PRELOAD SOVIA_MODULE="$work/link.so" "$run" env | grep -qx "LD_PRELOAD=$lib" ||
	fail "SOVIA_MODULE is not used"
# Options end at the program's name or at --.
"$run" -- sh -c 'echo "$1"' sh --window | grep -qx -- --window || fail "the program's --window"
"$run" sh -c 'echo "$1"' sh --stats | grep -qx -- --stats || fail "the program's --stats"

# Exit statuses.
status 0 true
status 7 sh -c 'exit 7'
status 127 /nonexistent/program
said "sovia-run: /nonexistent/program: No such file or directory"
status 127 no-such-program-anywhere
: >"$work/notexec"
status 126 "$work/notexec"
said "Permission denied"
# Bad flags: sovia-run's 125, a message and the hint, the program not run.
status 125 --bogus touch "$work/ran"
said "unknown option '--bogus'"
said "Try 'sovia-run --help'"
status 125 --window 3 touch "$work/ran"
said "--window=3: outside 4..1024"
status 125 --window=lots touch "$work/ran"
said "--window=lots: not a number"
status 125 --buf-size 2g touch "$work/ran"
said "--buf-size=2g: not a byte count"
status 125 --log loud touch "$work/ran"
said "not a log level"
status 125 --stats=yes touch "$work/ran"
said "option '--stats' takes no value"
status 125 --window
said "option '--window' needs a value"
status 125 --stats
said "no program to run"
status 125 -x touch "$work/ran"
said "unknown option '-x'"
# Settings valid alone but not together, and a bad one in the environment:
# the module's own message names them.
status 125 --window 8 --ack-delay 8 touch "$work/ran"
said "SOVIA_ACK_DELAY=8 must be below SOVIA_WINDOW=8"
said "libsovia would not take the settings above; touch was not run"
SOVIA_SPIN_US=-1 status 125 touch "$work/ran"
said "SOVIA_SPIN_US='-1'"
status 125 --lib "$work/none.so" touch "$work/ran"
said "cannot use the module $work/none.so"
# A module the loader would skip (the program would run without libsovia).
status 125 --lib /etc/passwd touch "$work/ran"
said "cannot use the module /etc/passwd: not a shared object"
# A program (a PIE is ET_DYN like a library): Debian's true is one.
status 125 --lib "$(realpath /bin/true)" touch "$work/ran"
said "cannot use the module $(realpath /bin/true): "
# A file that claims to be a shared object of ours with odd program
# headers (none of the usual size, 65535 of them): refused at once.
cp "$lib" "$work/odd.so"
printf '\000\000\377\377' | dd of="$work/odd.so" bs=1 seek=54 conv=notrunc status=none
status 125 --lib "$work/odd.so" touch "$work/ran"
said "cannot use the module $work/odd.so: not a shared object"
mkdir "$work/a b"
cp "$lib" "$work/a b/libsovia.so"
status 125 --lib "$work/a b/libsovia.so" touch "$work/ran"
said "LD_PRELOAD cannot hold a path with a blank or a colon"
[ ! -e "$work/ran" ] || fail "a refused run started the program"

# A real program under sovia-run: nc on loopback (no RDMA here, so TCP),
# libsovia loaded in both ends and saying so at exit.
nc -l 127.0.0.1 5991 >"$work/got" 2>/dev/null &
srv=$!
for _ in $(seq 100); do
	ss -ltnH "sport = :5991" | grep -q . && break
	sleep 0.1
done
printf 'hello over sovia-run\n' | env -u LD_PRELOAD "$run" --stats nc -N 127.0.0.1 5991 \
	2>"$work/nc.err" || fail "nc under sovia-run: $(cat "$work/nc.err")"
wait "$srv"
[ "$(cat "$work/got")" = "hello over sovia-run" ] || fail "the server got '$(cat "$work/got")'"
grep -q "^libsovia stats \[close\] 127.0.0.1:[0-9]* -> 127.0.0.1:5991 client .*tcp_tx_bytes=21 " \
	"$work/nc.err" || fail "no libsovia statistics from nc: $(cat "$work/nc.err")"
echo "PASS: sovia-run"
