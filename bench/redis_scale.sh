#!/usr/bin/env bash
# How an epoll server scales with its clients, in one run of the soft-RoCE
# test bed: redis-server and redis-benchmark (root, 1 KiB GET, keep-alive)
# with 8 clients, then 400, over kernel TCP and over libsovia (both ends
# preloaded, hosts that talked once). Printed per variant: requests/s for
# each client count, the ratio 400/8 (the target is >= 0.8x for libsovia),
# and for libsovia the server's connections on RDMA. Under emulation only
# the ratios within this run mean anything.
#
#   test/bed/sovia-bed -- bench/redis_scale.sh BUILD_DIR [REQUESTS]
#
# Beside each rate, counts that do not depend on the emulator's speed, per
# request: the server's context switches (all its threads), and for
# libsovia the helper thread's looks at the server's connections (their
# statistics' helper_looks, printed when the benchmark's clients close).
#
# SOVIA_BENCH_VARIANTS picks the variants (default "tcp libsovia"),
# SOVIA_BENCH_CLIENTS the client counts (default "8 400"; each ratio is
# against the first).
set -uo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [REQUESTS]}
REQ=${2:-20000}
IP=${SOVIA_BED_IP:?run me in the test bed: test/bed/sovia-bed -- $0 ...}
LIB=$BUILD/preload/libsovia.so
WORK=$(mktemp -d /dev/shm/sovia-rscale.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=6400
# Descriptors: SOVIA_BENCH_NOFILE (default 65536) for every process here.
ulimit -n "${SOVIA_BENCH_NOFILE:-65536}" || exit 1
rps() { tr '\r' '\n' <"$1" | sed -n 's/^GET: \([0-9.]*\) requests per second.*/\1/p' | tail -1; }
# The context switches of process $1's threads, so far.
ctxt() {
	cat /proc/"$1"/task/*/status 2>/dev/null |
		awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ {n += $2} END {print n + 0}'
}
# The helper_looks of the server connections in stats lines $2.. of file $1.
looks_from() {
	tail -n +"$2" "$1" | grep "libsovia stats.* server " |
		sed -n 's/.* helper_looks=\([0-9]*\).*/\1/p' | awk '{n += $1} END {print n + 0}'
}
for variant in ${SOVIA_BENCH_VARIANTS:-tcp libsovia}; do
	PORT=$((PORT + 1))
	pre=""
	[ $variant = libsovia ] && pre=$LIB
	env LD_PRELOAD="$pre" SOVIA_STATS=1 redis-server --port $PORT --bind "$IP" \
		--protected-mode no --save '' --appendonly no --dir "$WORK" --maxclients 4000 \
		--loglevel warning >/dev/null 2>"$WORK/$variant.srv" &
	srv=$!
	for _ in $(seq 100); do ss -ltn "sport = :$PORT" | grep -q LISTEN && break; sleep 0.1; done
	env LD_PRELOAD="$pre" redis-cli -h "$IP" -p $PORT set key:__rand_int__ x >/dev/null 2>&1
	env LD_PRELOAD="$pre" redis-benchmark -h "$IP" -p $PORT -c 8 -n 2000 -d 1024 -t set \
		-q >/dev/null 2>&1 # the keys, and a first contact
	declare -A R
	# The server's pinned memory (registered buffers), sampled.
	(while kill -0 $srv 2>/dev/null; do
		sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$srv/status 2>/dev/null
		sleep 0.5
	done) >"$WORK/$variant.pin" &
	CL=(${SOVIA_BENCH_CLIENTS:-8 400})
	for c in "${CL[@]}"; do
		cs0=$(ctxt $srv) line0=$(($(wc -l <"$WORK/$variant.srv") + 1))
		env LD_PRELOAD="$pre" redis-benchmark -h "$IP" -p $PORT -c $c -n "$REQ" -d 1024 \
			-t get -q >"$WORK/$variant.$c" 2>"$WORK/$variant.$c.err"
		sleep 1 # the server's last closes and their statistics
		cs=$(($(ctxt $srv) - cs0))
		R[$c]=$(rps "$WORK/$variant.$c")
		per=$(awk -v n="$cs" -v r="$REQ" 'BEGIN {printf "%.2f", n / r}')
		more=""
		if [ $variant = libsovia ]; then
			lk=$(looks_from "$WORK/$variant.srv" "$line0")
			more=", helper looks per request $(awk -v n="$lk" -v r="$REQ" 'BEGIN {printf "%.2f", n / r}')"
		fi
		echo "redis_scale $variant: $c clients: ${R[$c]:-no result} GET/s; per request:" \
			"server context switches $per$more ($(date +%T))"
	done
	env LD_PRELOAD="" redis-cli -h "$IP" -p $PORT shutdown nosave >/dev/null 2>&1
	wait $srv 2>/dev/null
	extra=""
	if [ $variant = libsovia ]; then
		on=$(grep -c "libsovia stats.* server state=rdma" "$WORK/$variant.srv")
		all=$(grep -c "libsovia stats.* server " "$WORK/$variant.srv")
		pin=$(sort -n "$WORK/$variant.pin" | tail -1)
		extra="; server connections on RDMA: $on of $all; server's most pinned memory ${pin:-?} kB (VmPin)"
		# Those not on RDMA at their close: their state and fallback reason.
		why=$(grep "libsovia stats.* server " "$WORK/$variant.srv" | grep -v " state=rdma " |
			sed -n 's/.* state=\([a-z]*\) fallback=\([a-z_]*\) .*/\1:\2/p' | sort | uniq -c |
			awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}')
		[ -n "$why" ] && extra="$extra; the others: $why"
	fi
	first=${CL[0]}
	for c in "${CL[@]:1}"; do
		ratio=$(awk -v a="${R[$first]:-0}" -v b="${R[$c]:-0}" \
			'BEGIN {if (a > 0) printf "%.2f", b / a; else print "-"}')
		echo "redis_scale $variant: GET/s $first clients ${R[$first]:-none}," \
			"$c clients ${R[$c]:-none}: ratio ${ratio}x$extra"
	done
done
