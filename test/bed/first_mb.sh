#!/usr/bin/env bash
# RDMA from the first byte for fresh processes: once libsovia on these hosts
# took one connection to RDMA, new preloaded processes hold their first
# writes for their QP (the peer table in /dev/shm), so an ungated nc moves
# at least 90% of 10 MB over RDMA, each way, and a stdio program's lines
# go over RDMA from the first. The medium is judged by
# libsovia's statistics, by rxe's packet counter and by the kernel's lo
# bytes. Then a plain server on the same host: its client is answered, and
# its port is remembered, so that the next client leaves it to the kernel.
. "$(dirname "$0")/lib.sh"
export SOVIA_STATS=1 SOVIA_LOG=info
SIZE=${SOVIA_IT_SIZE:-10485760}
head -c "$SIZE" /dev/urandom >"$WORK/in"
want=$(md5sum <"$WORK/in" | cut -d' ' -f1)
TABLE=/dev/shm/libsovia-peers.$(id -u)
rm -f "$TABLE"

note "first contact"
first_contact 5030

transfer() { # $1: up (client sends) or down (server sends), $2: port
	local dir=$1 port=$2
	rm -f "$WORK/out" "$WORK/"*.err
	local pkts0 lo0
	pkts0=$(rxe_pkts) lo0=$(lo_bytes)
	if [ "$dir" = up ]; then
		LD_PRELOAD=$LIB timeout 300 nc -l "$IP" "$port" >"$WORK/out" 2>"$WORK/server.err" &
	else
		LD_PRELOAD=$LIB timeout 300 nc -N -l "$IP" "$port" <"$WORK/in" 2>"$WORK/server.err" &
	fi
	local srv=$!
	wait_port "$port"
	if [ "$dir" = up ]; then
		LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" <"$WORK/in" 2>"$WORK/client.err"
	else
		LD_PRELOAD=$LIB timeout 300 nc "$IP" "$port" </dev/null >"$WORK/out" 2>"$WORK/client.err"
	fi
	wait "$srv" || fail "$dir: the server nc failed"
	local dp=$(($(rxe_pkts) - pkts0)) dl=$(($(lo_bytes) - lo0))
	[ "$(md5sum <"$WORK/out" | cut -d' ' -f1)" = "$want" ] ||
		fail "$dir: data differs ($(stat -c %s "$WORK/out") bytes received)"
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local sender=client receiver=server
	[ "$dir" = down ] && sender=server receiver=client
	local rb tb
	rb=$(stat_of "$WORK/stats" rdma_tx_bytes $sender)
	tb=$(stat_of "$WORK/stats" tcp_tx_bytes $sender)
	[ $((rb + tb)) -eq "$SIZE" ] || fail "$dir: the $sender wrote $((rb + tb)) bytes, not $SIZE"
	[ $((rb * 10)) -ge $((SIZE * 9)) ] || fail "$dir: only $rb of $SIZE bytes over RDMA"
	# Every RoCE packet carries at most 4 KiB; lo carried what TCP did.
	[ $((dp * 4096 * 10)) -ge $((SIZE * 9)) ] || fail "$dir: rxe sent only $dp packets"
	[ $((dl * 10)) -le "$SIZE" ] || fail "$dir: the kernel's lo carried $dl bytes"
	printf '%s: %d bytes identical; over RDMA %d%% (%d on TCP); rxe packets +%d; lo bytes +%d; time to RDMA: %s %s us, %s %s us\n' \
		"$dir" "$SIZE" $((rb * 100 / SIZE)) "$tb" "$dp" "$dl" \
		$sender "$(stat_of "$WORK/stats" time_to_rdma_us $sender)" \
		$receiver "$(stat_of "$WORK/stats" time_to_rdma_us $receiver)"
}
transfer up 5031
transfer down 5032

# A stdio program (fdopen, fprintf, fgets), a round trip per line, from
# its first line: each end's lines go over RDMA.
LINES=${SOVIA_IT_LINES:-75000} # about 8 MB each way
note "stdio, $LINES lines"
rm -f "$WORK/"*.err
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-stdio" -s "$IP" 5034 >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5034
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-stdio" -c "$IP" 5034 "$LINES" >"$WORK/client.out" 2>"$WORK/client.err" ||
	fail "stdio client failed"
wait "$srv" || fail "stdio server failed"
grep -q "OK $LINES lines" "$WORK/client.out" || fail "stdio: the client did not finish"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
for role in client server; do
	rb=$(stat_of "$WORK/stats" rdma_tx_bytes $role)
	tb=$(stat_of "$WORK/stats" tcp_tx_bytes $role)
	[ $((rb + tb)) -ge $((LINES * 10)) ] || fail "stdio: the $role wrote only $((rb + tb)) bytes"
	[ $((rb * 10)) -ge $(((rb + tb) * 9)) ] || fail "stdio: the $role sent $tb of $((rb + tb)) bytes on TCP"
	echo "stdio $role: $rb bytes over RDMA, $tb on TCP; time to RDMA $(stat_of "$WORK/stats" time_to_rdma_us $role) us"
done

# A plain server (not preloaded) on this host that speaks libsovia: its
# preloaded client is answered, and the port is remembered as plain.
plain_once() { # word: a plain nc server gets it from a preloaded client
	timeout 120 nc -l "$IP" 5033 >"$WORK/plain.out" 2>/dev/null &
	local srv=$!
	wait_port 5033
	echo "$1" | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" 5033 2>"$WORK/client.err"
	wait "$srv" || fail "plain server failed ($1)"
	grep -qx "$1" "$WORK/plain.out" || fail "the plain server got: $(cat "$WORK/plain.out")"
}
note "a plain server on a known host"
plain_once plain
[ "$(fallback_of "$WORK/client.err" client)" = rejected ] ||
	fail "the client's fallback is $(fallback_of "$WORK/client.err" client), not rejected"
# The next client of that port knows it is plain: libsovia leaves its
# connection to the kernel (no statistics line: it never was a stream).
plain_once again
grep -q "libsovia stats" "$WORK/client.err" &&
	fail "the second client of the plain port was a libsovia stream: $(cat "$WORK/client.err")"
echo "first_mb: OK"
