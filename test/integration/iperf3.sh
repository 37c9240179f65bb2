#!/usr/bin/env bash
# Unmodified iperf3, client and server preloaded: one test of BYTES in each
# direction (client to server, then -R). iperf3 drives non-blocking sockets
# with select(); its control connection and its data stream both go to the
# server's port. The data stream must travel over RDMA: the sender's
# statistics show the bytes on the QP, the receiver's show them arriving
# there, and the rxe device counted the packets. iperf3 does not check its
# payload; its own byte counts and exit status are checked.
. "$(dirname "$0")/lib.sh"
command -v iperf3 >/dev/null || fail "needs iperf3 (test/setup-deps.sh)"
BYTES=${SOVIA_IT_IPERF_BYTES:-104857600}
# iperf3 keeps each stream's buffer in an unlinked temporary file (mkstemp,
# unlink, ftruncate, mmap); the guest's /tmp is the host's over 9p, where
# ftruncate of an unlinked file fails ("unable to create a new stream").
export TMPDIR=$WORK

run() { # $1: up (the client sends) or down (-R: the server sends), $2: port
	local dir=$1 port=$2 rev=""
	[ "$dir" = down ] && rev=-R
	rm -f "$WORK/"*.err
	hang_watch 200 iperf3 # a run takes seconds: stacks if it is still there
	LD_PRELOAD=$LIB timeout 600 iperf3 -s -1 -p "$port" >"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	local p0 t0
	p0=$(rxe_pkts) t0=$(date +%s.%N)
	LD_PRELOAD=$LIB run_logged "$WORK/client.out" "$WORK/client.err" \
		timeout 600 iperf3 -c "$IP" -p "$port" -n "$BYTES" $rev
	wait "$srv" || { cat "$WORK/server.out" >&2; fail "$dir: the iperf3 server failed"; }
	local t1 dp
	t1=$(date +%s.%N) dp=$(($(rxe_pkts) - p0))
	grep -q "iperf Done" "$WORK/client.out" || fail "$dir: the client did not finish"
	# The sender's own count of what it sent (its "sender" line, in MBytes).
	local mb
	mb=$(awk '/ sender$/ {for (i = 1; i < NF; i++) if ($(i + 1) == "MBytes") print $i}' \
		"$WORK/client.out" | tail -1)
	[ -n "$mb" ] && awk -v m="$mb" -v b="$BYTES" 'BEGIN {exit !(m * 1048576 >= b)}' ||
		fail "$dir: iperf3 reports ${mb:-no} MBytes sent"
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local sender=client receiver=server
	[ "$dir" = down ] && sender=server receiver=client
	# Writes before the upgrade completes go over TCP (nothing waits for
	# it): under emulation up to a few tens of MB for the server's
	# direction, which switches one round trip after the client's.
	assert_rdma_carried "$WORK/stats" $sender $((BYTES / 2)) $((BYTES / 2))
	local rr
	rr=$(stat_of "$WORK/stats" rdma_rx_bytes $receiver)
	[ "$rr" -ge $((BYTES / 2)) ] || fail "$dir: the $receiver received only $rr bytes over RDMA"
	[ "$dp" -ge $((BYTES / 2 / 4096)) ] || fail "$dir: rxe sent only $dp packets"
	printf '%s: %d bytes in %.1f s; %s rdma_rx_bytes=%d; rxe packets +%d\n' "$dir" "$BYTES" \
		"$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" $receiver "$rr" "$dp"
}
run up 5201
run down 5202
echo "iperf3: OK"
