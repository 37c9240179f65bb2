#!/usr/bin/env bash
# An unprivileged server under a locked-memory limit (RLIMIT_MEMLOCK, no
# CAP_IPC_LOCK), as in Debian's default and in many containers: with 8 MiB
# its connection goes over RDMA; with 4 MiB its buffers (about 3.1 MiB by
# default) do not fit three quarters of the limit, and it stays on TCP with
# fallback=memlock, says why once with the fix, and keeps every byte.
. "$(dirname "$0")/lib.sh"
export SOVIA_STATS=1 SOVIA_LOG=info
chmod 755 "$WORK"
head -c 4000000 /dev/urandom >"$WORK/in"
chmod 644 "$WORK/in"
want=$(md5sum <"$WORK/in" | cut -d' ' -f1)
as_nobody() { # memlock_bytes command...
	local lim=$1
	shift
	prlimit --memlock="$lim" setpriv --reuid=nobody --regid=nogroup --clear-groups \
		--inh-caps=-all -- env LD_PRELOAD="$LIB" "$@"
}
run() { # memlock port -> the server's stderr in $WORK/server.err
	local lim=$1 port=$2
	rm -f "$WORK/server.err" "$WORK/out"
	touch "$WORK/server.err" "$WORK/out"
	chmod 666 "$WORK/server.err" "$WORK/out"
	as_nobody "$lim" timeout 120 sh -c "nc -l $IP $port >$WORK/out 2>$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	# The client's writes wait until its connection is on RDMA or not.
	{
		head -c 1 "$WORK/in"
		for _ in $(seq 100); do
			grep -q "on RDMA\|stays on TCP" "$WORK/client.err" 2>/dev/null && break
			sleep 0.1
		done
		tail -c +2 "$WORK/in"
	} | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" "$port" 2>"$WORK/client.err"
	wait "$srv" || fail "server failed (memlock $lim)"
	[ "$(md5sum <"$WORK/out" | cut -d' ' -f1)" = "$want" ] || fail "data differs (memlock $lim)"
}
note "8 MiB: one connection fits"
run 8388608 5040
[ "$(state_of "$WORK/server.err" server)" = rdma ] ||
	fail "8 MiB: the server's connection is $(state_of "$WORK/server.err" server), not rdma"
grep -q "RLIMIT_MEMLOCK\|ulimit -l" "$WORK/server.err" && fail "8 MiB: a memlock complaint"
note "4 MiB: it does not"
run 4194304 5041
[ "$(fallback_of "$WORK/server.err" server)" = memlock ] ||
	fail "4 MiB: the server's fallback is $(fallback_of "$WORK/server.err" server), not memlock"
[ "$(grep -c "ulimit -l" "$WORK/server.err")" = 1 ] || fail "4 MiB: not said once, with the fix"
grep -q "ibv_reg_mr" "$WORK/server.err" && fail "4 MiB: registration was tried and failed"
[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" = 0 ] || fail "4 MiB: bytes on RDMA"
grep "ulimit -l" "$WORK/server.err" | cut -c1-300
echo "memlock: OK"
