#!/usr/bin/env bash
# Small-message latency in interleaved rounds, inside the soft-RoCE test bed:
# each round runs ib_send_lat, then libsovia and rsockets (sovia-bench
# -t lat) at every size, so the three see the same moment of a noisy guest.
# Prints a Markdown table (one way, us): perftest's minimum and typical
# value, each socket variant's minimum and median, and libsovia/verbs for
# the medians and for the minima (docs/benchmarks.md, "What limits 64 B
# latency"). A libsovia run whose connection did not end on RDMA shows
# "tcp" instead of numbers.
#
#   flock /tmp/bed.lock test/bed/sovia-bed --timeout 900 -- \
#       bench/lat-rounds.sh [--build DIR] [--rounds N] [--sizes "1 64"]
#
# Knobs: --iters (ib_send_lat iterations, 20000), --secs (timed phase of
# sovia-bench, 3; 2 s warm-up), SOVIA_BENCH_RSPRELOAD (rsockets' preload).
set -u

BUILD=build ROUNDS=5 SIZES="1 64" ITERS=20000 SECS=3
while [ $# -gt 0 ]; do
	case "$1" in
	--build) BUILD=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--sizes) SIZES=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--secs) SECS=$2; shift 2 ;;
	*) echo "lat-rounds: unknown argument '$1'" >&2; exit 2 ;;
	esac
done
DEV=${SOVIA_BED_DEV:?run inside test/bed/sovia-bed}
IP=${SOVIA_BED_IP:?run inside test/bed/sovia-bed}
BUILD=$(cd "$BUILD" && pwd -P) || exit 2
LIB=$BUILD/preload/libsovia.so BENCH=$BUILD/bin/sovia-bench
RSPRELOAD=${SOVIA_BENCH_RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
for f in "$LIB" "$BENCH" "$RSPRELOAD"; do
	[ -e "$f" ] || { echo "lat-rounds: $f is missing" >&2; exit 2; }
done
command -v ib_send_lat >/dev/null || { echo "lat-rounds: ib_send_lat (perftest) is missing" >&2; exit 2; }

TMP=$(mktemp -d)
SV_PORT=5101 RS_PORT=5102 PT_PORT=18900
SERVERS=()
cleanup() {
	"$BENCH" client -H "$IP" -p "$SV_PORT" -t quit >/dev/null 2>&1
	LD_PRELOAD=$RSPRELOAD "$BENCH" client -H "$IP" -p "$RS_PORT" -t quit >/dev/null 2>&1
	kill "${SERVERS[@]}" 2>/dev/null
	wait
	rm -rf "$TMP"
}
trap cleanup EXIT

listening() { # file: wait up to 30 s for the server's LISTENING line
	local _
	for _ in $(seq 300); do
		grep -q LISTENING "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "lat-rounds: no server ($1)" >&2
	return 1
}
LD_PRELOAD=$LIB "$BENCH" server -b "$IP" -p "$SV_PORT" >"$TMP/sv" 2>&1 &
SERVERS+=($!)
LD_PRELOAD=$RSPRELOAD "$BENCH" server -b "$IP" -p "$RS_PORT" >"$TMP/rs" 2>&1 &
SERVERS+=($!)
listening "$TMP/sv" && listening "$TMP/rs" || exit 1

# perftest at one size: "min typical", or "- -" if it failed.
perftest() {
	PT_PORT=$((PT_PORT + 1))
	timeout -k 5 120 ib_send_lat -d "$DEV" -s "$1" -p "$PT_PORT" -F -n "$ITERS" >"$TMP/pt" 2>&1 &
	local srv=$! out=""
	for _ in $(seq 200); do
		ss -ltn | grep -q ":$PT_PORT " && break
		sleep 0.1
	done
	out=$(timeout -k 5 120 ib_send_lat -d "$DEV" -s "$1" -p "$PT_PORT" -F -n "$ITERS" "$IP" 2>&1 |
		awk -v s="$1" '$1 == s && NF >= 5 {print $3, $5}')
	wait "$srv"
	echo "${out:-- -}"
}

# A socket variant at one size: "min median", or "- -". For libsovia
# (SOVIA_STATS=1) the connection must have ended on RDMA, or the numbers
# would be kernel TCP's: "tcp tcp" then.
sock() { # preload port size
	local line err=$TMP/client.err
	line=$(LD_PRELOAD=$1 SOVIA_STATS=1 SOVIA_UPGRADE_TIMEOUT_MS=30000 timeout -k 5 120 "$BENCH" \
		client -H "$IP" -p "$2" -t lat -s "$3" -w 2 -d "$SECS" -n 100000 2>"$err" |
		grep "^RESULT .*status=ok")
	[ -n "$line" ] || { echo "- -"; return; }
	if [ "$1" = "$LIB" ] && ! grep -q "libsovia stats .* client state=rdma " "$err"; then
		echo "lat-rounds: libsovia at $3 B did not run on RDMA: $(grep "libsovia stats" "$err")" >&2
		echo "tcp tcp"
		return
	fi
	echo "$line" | awk '{for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
		print v["min_us"], v["med_us"]}'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "n/a"}'; }

echo "| round | size | ib_send_lat min / typical | libsovia min / median | rsockets min / median | libsovia/verbs, medians | libsovia/verbs, minima |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for r in $(seq "$ROUNDS"); do
	for s in $SIZES; do
		read -r pmin ptyp <<<"$(perftest "$s")"
		read -r smin smed <<<"$(sock "$LIB" "$SV_PORT" "$s")"
		read -r rmin rmed <<<"$(sock "$RSPRELOAD" "$RS_PORT" "$s")"
		echo "| $r | $s B | $pmin / $ptyp | $smin / $smed | $rmin / $rmed | $(ratio "$smed" "$ptyp") | $(ratio "$smin" "$pmin") |"
	done
done
