#!/usr/bin/env bash
# Unmodified nc (netcat-openbsd), preloaded on both ends, moves 32 MiB in
# each direction byte-identically (the gate keeps TCP's share to its first
# MiB at any size, so more bytes prove nothing more), and the payload travels over RDMA: the
# rxe device counted the packets, libsovia's statistics show the bytes on the
# QP, and the kernel's TCP (over lo) carried almost nothing.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info # the gate below waits for "on RDMA"
SIZE=${SOVIA_IT_SIZE:-33554432}
head -c "$SIZE" /dev/urandom >"$WORK/in"
want=$(md5sum <"$WORK/in" | cut -d' ' -f1)

transfer() { # $1: up (client sends) or down (server sends)
	local dir=$1 port=$2
	rm -f "$WORK/out" "$WORK/"*.err
	local pkts0 lo0 pkts1 lo1
	pkts0=$(rxe_pkts) lo0=$(lo_bytes)
	if [ "$dir" = up ]; then
		LD_PRELOAD=$LIB timeout 300 nc -l "$IP" "$port" >"$WORK/out" 2>"$WORK/server.err" &
	else
		gated "$WORK/server.err" | LD_PRELOAD=$LIB timeout 300 nc -N -l "$IP" "$port" \
			2>"$WORK/server.err" &
	fi
	local srv=$!
	wait_port "$port"
	local t0=$(date +%s.%N)
	if [ "$dir" = up ]; then
		gated "$WORK/client.err" | LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" \
			2>"$WORK/client.err"
	else
		LD_PRELOAD=$LIB timeout 300 nc "$IP" "$port" </dev/null >"$WORK/out" 2>"$WORK/client.err"
	fi
	wait "$srv" || fail "server nc failed ($dir)"
	local t1=$(date +%s.%N)
	pkts1=$(rxe_pkts) lo1=$(lo_bytes)
	got=$(md5sum <"$WORK/out" | cut -d' ' -f1)
	[ "$got" = "$want" ] || fail "$dir: data differs ($(stat -c %s "$WORK/out") bytes received)"
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local sender=client
	[ "$dir" = down ] && sender=server
	# Writes before the upgrade completes go over TCP: the gate holds all
	# but the first MiB (and what the pipe and socket buffers held) until
	# then; the payload is what RDMA carries.
	assert_rdma_carried "$WORK/stats" "$sender" $((SIZE * 3 / 4)) $((SIZE / 4))
	local dp=$((pkts1 - pkts0)) dl=$((lo1 - lo0))
	# Every RoCE packet carries at most 4 KiB: SIZE needs this many at least.
	[ "$dp" -ge $((SIZE / 4096)) ] || fail "$dir: rxe sent only $dp packets"
	[ "$dl" -lt $((SIZE / 4)) ] || fail "$dir: the kernel's lo carried $dl bytes"
	printf '%s: %d bytes identical in %.1f s; rxe packets +%d; lo bytes +%d\n' \
		"$dir" "$SIZE" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$dp" "$dl"
}
transfer up 5001
transfer down 5002
echo "nc_transfer: OK"
