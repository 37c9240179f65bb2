#!/usr/bin/env bash
# Time to RDMA, in one run of the soft-RoCE test bed: how long a new
# connection takes until the application's first byte crosses, and for
# libsovia until that byte travels on the QP, beside rsockets' connection
# set-up and a raw rdma_cm connect on the same device.
#
#   test/bed/sovia-bed -- bench/ttr.sh BUILD_DIR [CONNS]
#
# Each variant runs sovia-bench's conn test from a fresh client
# process: CONNS connections (default 200), each connect(), a 16-byte
# header, the server's one byte read, close. Printed per variant: the first
# connection's time (the process's first: rdma_cm starts) and the median
# and 99th percentile of the later ones. For libsovia, both ends have
# talked once before (the peer table knows the host), and its own
# statistic time_to_rdma_us (connect/accept to the first byte on the QP)
# is summarised from the client's lines. The raw rdma_cm connect is
# rdma-core's cmtime (resolve, route, QP, connect; its averages). Under
# emulation only the ratios within this run mean anything.
set -uo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [CONNS]}
CONNS=${2:-200}
IP=${SOVIA_BED_IP:?run me in the test bed: test/bed/sovia-bed -- $0 ...}
LIB=$BUILD/preload/libsovia.so
BENCH=$BUILD/bin/sovia-bench
RSPRELOAD=${SOVIA_BENCH_RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
WORK=$(mktemp -d /dev/shm/sovia-ttr.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

PORT=7100
declare -A FIRST MED P99
run() { # variant env...
	local v=$1
	shift
	PORT=$((PORT + 1))
	env "$@" "$BENCH" server -b "$IP" -p $PORT >"$WORK/$v.srv.out" 2>"$WORK/$v.srv.err" &
	local srv=$!
	for _ in $(seq 100); do grep -q LISTENING "$WORK/$v.srv.out" && break; sleep 0.1; done
	if [[ $v == libsovia* ]]; then
		# First contact: the hosts learn each other.
		env "$@" "$BENCH" client -H "$IP" -p $PORT -t conn -d 30 -n 1 >/dev/null 2>&1
		env "$@" "$BENCH" client -H "$IP" -p $PORT -t lat -s 64 -w 1 -d 1 -n 100 >/dev/null 2>&1
	fi
	env "$@" "$BENCH" client -H "$IP" -p $PORT -t conn -d 600 -n "$CONNS" \
		>"$WORK/$v.out" 2>"$WORK/$v.err"
	env "$@" "$BENCH" client -H "$IP" -p $PORT -t quit >/dev/null 2>&1
	wait $srv 2>/dev/null
	local line
	line=$(grep "^RESULT test=conn" "$WORK/$v.out")
	FIRST[$v]=$(kv "$line" first_us) MED[$v]=$(kv "$line" med_us) P99[$v]=$(kv "$line" p99_us)
	printf '%-9s first %8s us   later: median %8s us  p99 %8s us   (%s connections)\n' \
		"$v" "${FIRST[$v]}" "${MED[$v]}" "${P99[$v]}" "$(kv "$line" conns)"
}

# libsovia's own statistic, on variant $1's client connections after the
# first: its median in $med.
ttr_of() {
	grep -h "libsovia stats" "$WORK/$1.err" | grep " client " |
		sed -n 's/.* time_to_rdma_us=\([0-9]*\).*/\1/p' >"$WORK/ttr"
	local n zero first m p99
	n=$(wc -l <"$WORK/ttr")
	zero=$(grep -cx 0 "$WORK/ttr")
	first=$(head -1 "$WORK/ttr")
	tail -n +2 "$WORK/ttr" | grep -vx 0 | sort -n >"$WORK/ttr.later"
	m=$(wc -l <"$WORK/ttr.later")
	if [ "$m" -gt 0 ]; then
		med=$(sed -n "$((m / 2 + 1))p" "$WORK/ttr.later")
		p99=$(sed -n "$((m * 99 / 100 + 1))p" "$WORK/ttr.later")
	else
		med=- p99=-
	fi
	echo "$1 time_to_rdma_us: first $first; later: median $med, p99 $p99 ($n connections, $zero never on RDMA)"
}

echo "== connect() to the first byte read, $CONNS connections from a fresh process"
run tcp SOVIA_BENCH_VARIANT=tcp
run rsockets LD_PRELOAD="$RSPRELOAD"
# libsovia three ways: asking no warden (as before wardens), on a host
# without one (the client asks the warden's port, meets no listener, then
# the server's port), and with sovia-warden on the server's host.
run libsovia-nowarden LD_PRELOAD="$LIB" SOVIA_STATS=1 SOVIA_WARDEN_PORT=0
ttr_of libsovia-nowarden
med_nowarden=$med
run libsovia LD_PRELOAD="$LIB" SOVIA_STATS=1
ttr_of libsovia
med_default=$med
"$BUILD/tools/sovia-warden" -v 2>"$WORK/warden.err" &
warden=$!
for _ in $(seq 100); do grep -q answering "$WORK/warden.err" && break; sleep 0.1; done
grep -q answering "$WORK/warden.err" || { echo "sovia-warden did not start:"; cat "$WORK/warden.err"; }
run libsovia-warden LD_PRELOAD="$LIB" SOVIA_STATS=1
kill $warden
echo "sovia-warden: $(grep -c ": to RDMA port" "$WORK/warden.err") redirects, $(grep -c ": unknown" "$WORK/warden.err") unknown"
ttr_of libsovia-warden
med_warden=$med
med=$med_default

echo "== raw rdma_cm connect (cmtime, $CONNS connections)"
timeout 120 cmtime -b "$IP" -p 7199 -c "$CONNS" >"$WORK/cmtime.srv" 2>&1 &
sleep 1
timeout 120 cmtime -s "$IP" -p 7199 -c "$CONNS" >"$WORK/cmtime.out" 2>&1
wait 2>/dev/null
sed 's/^/   /' "$WORK/cmtime.out"

# The TCP phase and plain peers: a 64-byte ping-pong while libsovia's
# connection is still on TCP (its upgrade put off for the run), and a
# preloaded client of a plain server, against plain TCP on both ends.
lat() { # name port server-env... -- client-env...
	local name=$1 port=$2
	shift 2
	local -a senv=() cenv=()
	while [ "$1" != -- ]; do senv+=("$1"); shift; done
	shift
	cenv=("$@")
	env "${senv[@]}" "$BENCH" server -b "$IP" -p "$port" >"$WORK/$name.srv.out" 2>&1 &
	for _ in $(seq 100); do grep -q LISTENING "$WORK/$name.srv.out" && break; sleep 0.1; done
	env "${cenv[@]}" "$BENCH" client -H "$IP" -p "$port" -t lat -s 64 -w 1 -d 3 -n 20000 \
		>"$WORK/$name.lat" 2>/dev/null
	env "${cenv[@]}" "$BENCH" client -H "$IP" -p "$port" -t conn -d 60 -n "$CONNS" \
		>"$WORK/$name.conn" 2>/dev/null
	env "${cenv[@]}" "$BENCH" client -H "$IP" -p "$port" -t quit >/dev/null 2>&1
	wait 2>/dev/null
	LAT[$name]=$(kv "$(grep test=lat "$WORK/$name.lat")" med_us)
	CONN[$name]=$(kv "$(grep test=conn "$WORK/$name.conn")" med_us)
	printf '%-22s 64 B one-way median %8s us; connect to first byte median %8s us\n' \
		"$name" "${LAT[$name]}" "${CONN[$name]}"
}
declare -A LAT CONN
echo "== the TCP phase and plain peers"
TCPENV=(SOVIA_BENCH_VARIANT=tcp)
lat tcp 7201 "${TCPENV[@]}" -- "${TCPENV[@]}"
lat libsovia-before-switch 7202 LD_PRELOAD="$LIB" SOVIA_UPGRADE_DELAY_MS=600000 SOVIA_PEER_HOLD_MS=0 -- \
	LD_PRELOAD="$LIB" SOVIA_UPGRADE_DELAY_MS=600000 SOVIA_PEER_HOLD_MS=0
lat libsovia-to-plain 7203 "${TCPENV[@]}" -- LD_PRELOAD="$LIB"
awk -v t="${LAT[tcp]}" -v b="${LAT[libsovia-before-switch]}" -v p="${LAT[libsovia-to-plain]}" \
	-v tc="${CONN[tcp]}" -v pc="${CONN[libsovia-to-plain]}" 'BEGIN {
	printf "before the switch: ping-pong %.2fx plain TCP (target <= 1.1x)\n", b / t
	printf "to a plain server: ping-pong %.2fx, first byte %.2fx plain TCP (target <= 1.1x)\n", p / t, pc / tc
}'

echo "== ratios in this run"
awk -v lf="${FIRST[libsovia]}" -v rf="${FIRST[rsockets]}" -v tf="${FIRST[tcp]}" \
	-v lm="${MED[libsovia]}" -v rm="${MED[rsockets]}" -v tm="${MED[tcp]}" -v sm="$med" 'BEGIN {
	printf "first connection: libsovia/rsockets %.2fx (target <= 1.5x); libsovia/tcp %.2fx\n", lf / rf, lf / tf
	printf "later connections (median): libsovia/rsockets %.2fx (target <= 1.0x); libsovia/tcp %.2fx\n", lm / rm, lm / tm
	if (sm != "-") printf "later connections, time_to_rdma median / rsockets set-up median: %.2fx\n", sm / rm
}'
awk -v n="${MED[libsovia-nowarden]}" -v d="${MED[libsovia]}" -v w="${MED[libsovia-warden]}" \
	-v rm="${MED[rsockets]}" -v tn="$med_nowarden" -v td="$med_default" -v tw="$med_warden" 'BEGIN {
	printf "later connections (median) / rsockets: no warden asked %.2fx, a host without one %.2fx, with sovia-warden %.2fx\n", n / rm, d / rm, w / rm
	if (tn != "-" && td != "-" && tw != "-")
		printf "time_to_rdma median against asking no warden: a host without one %.2fx, with sovia-warden %.2fx\n", td / tn, tw / tn
}'
