# Shared by the integration tests. They run inside the soft-RoCE test bed
# (test/bed/sovia-bed), which sets SOVIA_BED_IP (the rxe interface's address)
# and SOVIA_BED_DEV (the rxe device).
set -euo pipefail

LIB=${1:?usage: $0 LIBSOVIA_SO BUILD_DIR}
BUILD=${2:?usage: $0 LIBSOVIA_SO BUILD_DIR}
IP=${SOVIA_BED_IP:?run me in the test bed: test/bed/sovia-bed -- $0 ...}
DEV=${SOVIA_BED_DEV:-rxe0}
WORK=$(mktemp -d /dev/shm/sovia-it.XXXXXX)
# libsovia's peer tables (/dev/shm/libsovia-peers.UID) outlive the
# processes, and the guests share this /dev/shm: each test starts as the
# hosts' first contact and leaves nothing for the next.
rm -f /dev/shm/libsovia-peers.*
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK" /dev/shm/libsovia-peers.*' EXIT

# Processes of other users (nobody, postgres, nginx's www-data workers)
# load the module and run the test programs. From a clone under a private
# directory (root's home is 0700) they cannot reach the build tree: the
# tests then use a copy of what they run, in a directory anyone can read.
if ! setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
	test -r "${LIB%% *}" 2>/dev/null; then
	chmod 711 "$WORK"
	mkdir -m 755 "$WORK/pub" "$WORK/pub/preload"
	for d in bin tools bench; do
		[ -d "$BUILD/$d" ] && cp -a "$BUILD/$d" "$WORK/pub/"
	done
	pub_lib=""
	for l in $LIB; do
		cp "$l" "$WORK/pub/preload/"
		pub_lib="$pub_lib $WORK/pub/preload/${l##*/}"
	done
	chmod -R a+rX "$WORK/pub"
	LIB=${pub_lib# } BUILD=$WORK/pub
	echo "the build tree is private: the tests run a readable copy in $BUILD"
fi

# On failure, show what the programs said (their stderr carries libsovia's
# statistics and log), then fail.
fail() {
	echo "FAIL: $*" >&2
	for f in "$WORK"/*.err; do
		[ -s "$f" ] || continue
		echo "--- ${f##*/}:" >&2
		tail -${SOVIA_FAIL_LINES:-15} "$f" | cut -c1-400 >&2
	done
	if [ -s "$WORK/hang.log" ]; then
		echo "--- hang.log (hang_watch):" >&2
		head -500 "$WORK/hang.log" | cut -c1-300 >&2
	fi
	exit 1
}

# A hang should leave evidence: if processes named $2 still run after $1
# seconds, record where each thread of each one is (gdb) in
# $WORK/hang.log, which fail() shows. Call it before the programs start.
hang_watch() {
	(
		sleep "$1"
		for p in $(pgrep -x "$2"); do
			echo "== pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
			grep -E "^(State|Threads)" "/proc/$p/status" 2>/dev/null
			timeout 120 gdb -p "$p" -batch -ex "thread apply all bt" 2>&1 |
				grep -v "^\[New LWP\|^Using host libthread_db\|^warning:"
		done >"$WORK/hang.log" 2>&1
	) &
}
note() { echo "== $*"; }

# The statistics lines of the streams of role $2 (client, server) in file
# $1, in the order they ended; a field of one such line ($1) by name ($2).
stats_lines() { grep -h "libsovia stats.* $2 " "$1"; }
stats_field() { sed -n "s/.* $2=\([0-9a-z-]*\).*/\1/p" <<<"$1"; }

# Wait until something listens on TCP port $1.
wait_port() {
	for _ in $(seq 300); do
		ss -ltn "sport = :$1" | grep -q LISTEN && return 0
		sleep 0.1
	done
	fail "nothing listens on port $1"
}

# Wait (at most $3 s) until file $1 has a line matching $2.
wait_line() {
	local i
	for i in $(seq $(($3 * 10))); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# Wait until file $1 holds at least $2 bytes, up to $3 seconds.
wait_size() {
	local i
	for i in $(seq $(($3 * 10))); do
		[ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0
		sleep 0.1
	done
	return 1
}

# First contact: a small transfer that waits until it is on RDMA, so that
# the hosts know each other (the peer table) before what is measured.
first_contact() { # port
	LD_PRELOAD=$LIB SOVIA_LOG=info timeout 120 nc -l "$IP" "$1" >/dev/null \
		2>"$WORK/warm-server.err" &
	local srv=$!
	wait_port "$1"
	{
		echo hello
		wait_line "$WORK/warm-client.err" "on RDMA" 120 || echo "first contact: never on RDMA" >&2
	} | LD_PRELOAD=$LIB SOVIA_LOG=info timeout 120 nc -N "$IP" "$1" 2>"$WORK/warm-client.err"
	wait "$srv" || fail "first contact: the server failed"
	[ -s "/dev/shm/libsovia-peers.$(id -u)" ] || fail "first contact: no peer table"
	rm -f "$WORK"/warm-*.err
}
rxe_pkts() { cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts"; }

# Wait until the rxe device sent $1 more packets than $2 (a count of
# rxe_pkts taken earlier); at most $3 s (default 60).
wait_rxe() {
	local i
	for i in $(seq $((${3:-60} * 10))); do
		[ $(($(rxe_pkts) - $2)) -ge "$1" ] && return 0
		sleep 0.1
	done
	return 1
}
lo_bytes() { cat /sys/class/net/lo/statistics/tx_bytes; }

# The value of field $2 in the libsovia stats line(s) of file $1 for role $3
# (client|server); sums over lines.
stat_of() {
	{ grep -h "libsovia stats" "$1" || true; } | { grep " $3 " || true; } |
		sed -n "s/.* $2=\([0-9]*\).*/\1/p" | awk '{s += $1} END {print s + 0}'
}
state_of() {
	{ grep -h "libsovia stats" "$1" || true; } | { grep " $2 " || true; } |
		sed -n 's/.* state=\([a-z-]*\).*/\1/p' | head -1
}
fallback_of() {
	{ grep -h "libsovia stats" "$1" || true; } | { grep " $2 " || true; } |
		sed -n 's/.* fallback=\([a-z-]*\).*/\1/p' | head -1
}

# Assert the stats in file $1 show role $2 sent at least $3 bytes over RDMA
# and at most $4 over TCP.
assert_rdma_carried() {
	local f=$1 role=$2 min=$3 maxtcp=$4
	local rb tb
	rb=$(stat_of "$f" rdma_tx_bytes "$role")
	tb=$(stat_of "$f" tcp_tx_bytes "$role")
	[ "$rb" -ge "$min" ] || { cat "$f" >&2; fail "$role sent only $rb bytes over RDMA (want >= $min)"; }
	[ "$tb" -le "$maxtcp" ] || { cat "$f" >&2; fail "$role sent $tb bytes over TCP (want <= $maxtcp)"; }
	echo "$role: rdma_tx_bytes=$rb tcp_tx_bytes=$tb"
}

export SOVIA_STATS=1
# Under full CPU emulation the first rdma_cm use of a process takes seconds;
# give the upgrade room so a slow guest does not turn into a fallback.
export SOVIA_UPGRADE_TIMEOUT_MS=${SOVIA_UPGRADE_TIMEOUT_MS:-30000}

# Run a command with stdout to $1 (also shown) and stderr to $2; on failure
# show its stderr and fail with the status.
run_logged() {
	local out=$1 err=$2 rc=0
	shift 2
	"$@" >"$out" 2>"$err" || rc=$?
	cat "$out"
	if [ "$rc" -ne 0 ]; then
		echo "--- stderr of $1:" >&2
		tail -${SOVIA_FAIL_LINES:-20} "$err" >&2
		fail "$* exited with $rc"
	fi
}

# A sender's input ($WORK/in): the first MiB at once, the rest once the
# sender's log ($1) says its connection is on RDMA. Ungated, how much went
# over TCP before the switch depended on how fast TCP is against the
# switch: on a fast host 27 MB of 100.
GATE=1048576
gated() {
	head -c $GATE "$WORK/in"
	wait_line "$1" "on RDMA" 120 || echo "gated: the sender never logged on RDMA" >&2
	tail -c +$((GATE + 1)) "$WORK/in"
}
