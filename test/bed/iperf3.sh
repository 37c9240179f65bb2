#!/usr/bin/env bash
# Unmodified iperf3, client and server preloaded: one test of SECS seconds
# in each direction (client to server, then -R). iperf3 drives non-blocking
# sockets with select(); its control connection and its data stream both go
# to the server's port. The data stream must travel over RDMA: most of what
# the sender sent went on the QP by its statistics, the receiver's show the
# bytes arriving there, and the rxe device counted the packets. iperf3 does
# not check its payload; its own byte count and exit status are checked.
# A third test sends with -Z: the client's sendfile() from its buffer's
# file, which libsovia serves on the QP (preload/sendfile.c).
#
# A test of a duration, not of a byte count: the bytes written before the
# upgrade completes go over TCP (nothing waits for it), and how many that
# is depends on how fast TCP runs beside rdma_cm's first use in the process
# (loopback TCP is faster than rxe under emulation). Over a few seconds the
# upgrade's share stays small, on a slow machine as on a fast one.
. "$(dirname "$0")/lib.sh"
command -v iperf3 >/dev/null || fail "needs iperf3 (test/setup-deps.sh)"
SECS=${SOVIA_IT_IPERF_SECS:-4}
# iperf3 keeps each stream's buffer in an unlinked temporary file (mkstemp,
# unlink, ftruncate, mmap); the guest's /tmp is the host's over 9p, where
# ftruncate of an unlinked file fails ("unable to create a new stream").
export TMPDIR=$WORK

run() { # $1: up (the client sends) or down (-R: the server sends), $2: port, $3: -Z or none
	local dir=$1 port=$2 rev="" zc=${3:-}
	[ "$dir" = down ] && rev=-R
	rm -f "$WORK/"*.err
	hang_watch 200 iperf3 # a run takes seconds: stacks if it is still there
	LD_PRELOAD=$LIB timeout 600 iperf3 -s -1 -p "$port" >"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	local p0 t0
	p0=$(rxe_pkts) t0=$(date +%s.%N)
	LD_PRELOAD=$LIB run_logged "$WORK/client.out" "$WORK/client.err" \
		timeout 600 iperf3 -c "$IP" -p "$port" -t "$SECS" -f m $rev $zc
	wait "$srv" || { cat "$WORK/server.out" >&2; fail "$dir: the iperf3 server failed"; }
	local t1 dp
	t1=$(date +%s.%N) dp=$(($(rxe_pkts) - p0))
	grep -q "iperf Done" "$WORK/client.out" || fail "$dir: the client did not finish"
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local sender=client receiver=server
	[ "$dir" = down ] && sender=server receiver=client
	# What the sender's application handed libsovia, by either medium (its
	# control connection's few hundred bytes included).
	local sent
	sent=$(($(stat_of "$WORK/stats" rdma_tx_bytes $sender) +
		$(stat_of "$WORK/stats" tcp_tx_bytes $sender)))
	# iperf3's own count of what it sent (its "sender" line, in MBytes of
	# 2^20 bytes, rounded): the same bytes.
	local mb
	mb=$(awk '/ sender$/ {for (i = 1; i < NF; i++) if ($(i + 1) == "MBytes") print $i}' \
		"$WORK/client.out" | tail -1)
	[ -n "$mb" ] && awk -v m="$mb" -v s="$sent" \
		'BEGIN {d = m * 1048576 - s; exit !(m > 0 && d < 1048576 && d > -1048576)}' ||
		fail "$dir: iperf3 reports ${mb:-no} MBytes sent, libsovia saw $sent bytes"
	assert_rdma_carried "$WORK/stats" $sender $((sent / 2)) $((sent / 2))
	local rr
	rr=$(stat_of "$WORK/stats" rdma_rx_bytes $receiver)
	[ "$rr" -ge $((sent / 2)) ] || fail "$dir: the $receiver received only $rr bytes over RDMA"
	[ "$dp" -ge $((sent / 2 / 4096)) ] || fail "$dir: rxe sent only $dp packets"
	printf '%s%s: %d bytes in %.1f s; %s rdma_rx_bytes=%d; rxe packets +%d\n' "$dir" "$zc" "$sent" \
		"$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" $receiver "$rr" "$dp"
}
run up 5201
run down 5202
run up 5203 -Z
echo "iperf3: OK"
