#!/usr/bin/env bash
# What starting small costs, in one run of the soft-RoCE test bed: nc
# moves MB megabytes (default 100) with libsovia's buffers fixed at
# SOVIA_BUF_SIZE from the start (SOVIA_BUF_START=128k, as before they
# grew) and with the default (1 KiB, growing), each from fresh processes
# of hosts that talked once. Printed per variant: seconds, messages the
# receiver got over the QP, whether its buffers grew, the share over RDMA,
# and the pinned bytes each connection started with; then the time ratio.
# Under emulation only the ratio within this run means anything.
#
#   test/bed/sovia-bed -- bench/grow.sh BUILD_DIR [MB]
set -uo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [MB]}
MB=${2:-100}
IP=${SOVIA_BED_IP:?run me in the test bed: test/bed/sovia-bed -- $0 ...}
LIB=$BUILD/preload/libsovia.so
WORK=$(mktemp -d /dev/shm/sovia-grow.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
head -c $((MB * 1048576)) /dev/urandom >"$WORK/in"
kv() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" "$1" | head -1; }
PORT=7300
declare -A SECS
run() { # variant env...
	local v=$1
	shift
	PORT=$((PORT + 1))
	env LD_PRELOAD="$LIB" SOVIA_STATS=1 "$@" nc -l "$IP" $PORT >"$WORK/out" 2>"$WORK/$v.srv" &
	local srv=$!
	for _ in $(seq 100); do ss -ltn "sport = :$PORT" | grep -q LISTEN && break; sleep 0.1; done
	# First contact, so that the measured connection is a known peer's.
	env LD_PRELOAD="$LIB" "$@" nc -l "$IP" $((PORT + 100)) >/dev/null 2>&1 &
	local first=$!
	for _ in $(seq 100); do ss -ltn "sport = :$((PORT + 100))" | grep -q LISTEN && break; sleep 0.1; done
	{
		echo hi
		for _ in $(seq 100); do grep -q "on RDMA" "$WORK/first.err" 2>/dev/null && break; sleep 0.1; done
	} | env LD_PRELOAD="$LIB" SOVIA_LOG=info "$@" nc -N "$IP" $((PORT + 100)) 2>"$WORK/first.err"
	wait $first
	local t0 t1
	t0=$(date +%s.%N)
	env LD_PRELOAD="$LIB" SOVIA_STATS=1 "$@" nc -N "$IP" $PORT <"$WORK/in" 2>"$WORK/$v.cli"
	wait $srv
	t1=$(date +%s.%N)
	cmp -s "$WORK/in" "$WORK/out" || echo "$v: DATA DIFFERS"
	local s=$WORK/$v.srv
	local r t
	r=$(kv "$s" rdma_rx_bytes) t=$(kv "$s" tcp_rx_bytes)
	SECS[$v]=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
	printf '%-8s %6s s  rdma_rx_msgs=%-7s grown=%-9s rdma share=%s%%  pinned_start=%s\n' "$v" \
		"${SECS[$v]}" "$(kv "$s" rdma_rx_msgs)" "$(kv "$s" grown)" \
		"$(awk -v r="$r" -v t="$t" 'BEGIN {printf "%.1f", 100 * r / (r + t)}')" \
		"$(kv "$WORK/$v.cli" pinned_start_bytes)"
}
echo "nc, $MB MB, client to server"
run fixed SOVIA_BUF_START=131072
run growing
awk -v a="${SECS[growing]}" -v b="${SECS[fixed]}" \
	'BEGIN {printf "growing / fixed time: %.2fx\n", a / b}'
