#!/usr/bin/env bash
# A peer killed mid-transfer: the survivor gets EOF or ECONNRESET within
# seconds, never a hang. Both ways: the sender killed, then the receiver's
# peer killed while the survivor sends.
. "$(dirname "$0")/lib.sh"

survive() { # $1: port, $2: which end is killed (client|server)
	local port=$1 victim=$2
	if [ "$victim" = client ]; then
		LD_PRELOAD=$LIB timeout 120 nc -l "$IP" "$port" >/dev/null 2>"$WORK/survivor.err" &
		local survivor=$!
		wait_port "$port"
		LD_PRELOAD=$LIB nc "$IP" "$port" </dev/zero 2>/dev/null &
		local v=$!
	else
		LD_PRELOAD=$LIB nc -l "$IP" "$port" </dev/zero >/dev/null 2>/dev/null &
		local v=$!
		wait_port "$port"
		LD_PRELOAD=$LIB timeout 120 nc "$IP" "$port" </dev/null >/dev/null 2>"$WORK/survivor.err" &
		local survivor=$!
	fi
	# Kill once the transfer runs over RDMA: the rxe device has sent a few
	# thousand packets (the upgrade's start-up takes seconds under emulation,
	# more on a loaded machine).
	local p0
	p0=$(rxe_pkts)
	wait_rxe 2000 "$p0" || true # the check after the kill says whether RDMA carried data
	sleep 1
	kill -9 "$v"
	local t0=$(date +%s) rc=0
	wait "$survivor" || rc=$?
	local t1=$(date +%s)
	[ "$rc" -ne 124 ] || fail "the survivor hung after its peer ($victim) was killed"
	local rx
	rx=$(grep -h "libsovia stats" "$WORK/survivor.err" | sed -n 's/.* rdma_rx_bytes=\([0-9]*\).*/\1/p' | head -1)
	[ "${rx:-0}" -gt 0 ] || { cat "$WORK/survivor.err" >&2; fail "no data went over RDMA before the kill"; }
	echo "$victim killed: survivor exited (status $rc) $((t1 - t0)) s later, after $rx bytes over RDMA"
}
survive 5051 client
survive 5052 server
echo "kill: OK"
