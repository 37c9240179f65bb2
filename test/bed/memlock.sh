#!/usr/bin/env bash
# An unprivileged server under a locked-memory limit (RLIMIT_MEMLOCK, no
# CAP_IPC_LOCK), as in Debian's default and in many containers. A
# connection starts with 28 KiB of buffers and grows them to about 3 MiB
# for bulk data, while a quarter of the budget (three quarters of the
# limit) stays free:
# - 8 MiB: on RDMA, and the receive buffers grow;
# - 1 MiB: on RDMA, but they stay small (growth refused), no complaint;
# - 32 KiB: even the small buffers do not fit: TCP with fallback=memlock,
#   said once with the fix;
# - 8 MiB, then idle: once the client's sending was idle for
#   SOVIA_BUF_IDLE_MS, the grown buffers go back, and the server's pinned
#   memory (VmPin) falls back to what a new connection pins.
# Every byte arrives in each case.
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
run() { # memlock port [idle] -> the server's stderr in $WORK/server.err
	local lim=$1 port=$2 idle=${3:-}
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
		# idle: the connection stays open, with nothing to send, until
		# the test has seen what it waits for.
		if [ -n "$idle" ]; then
			for _ in $(seq 900); do
				[ -e "$WORK/idle.done" ] && break
				sleep 0.1
			done
		fi
	} | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" "$port" 2>"$WORK/client.err" &
	local cli=$!
	[ -z "$idle" ] || watch_pin
	wait "$cli" || fail "client failed (memlock $lim)"
	wait "$srv" || fail "server failed (memlock $lim)"
	[ "$(md5sum <"$WORK/out" | cut -d' ' -f1)" = "$want" ] || fail "data differs (memlock $lim)"
}
grown_rx() { # stats file -> how often the server's receive buffers grew
	{ grep -h "libsovia stats" "$1" || true; } | { grep " server " || true; } |
		sed -n 's/.* grown=rx:\([0-9]*\),.*/\1/p' | head -1
}
shrunk_rx() { # stats file -> how often they went back to the start size
	{ grep -h "libsovia stats" "$1" || true; } | { grep " server " || true; } |
		sed -n 's/.* shrunk=rx:\([0-9]*\),.*/\1/p' | head -1
}
# The server's VmPin (kB) while the idle case runs: its highest after the
# data arrived, then the wait until it is back under 256 kB (a new
# connection pins 28 KiB). No timing is asserted: the wait is bounded
# only against a hang.
watch_pin() {
	local pid="" kb peak=0 n
	for _ in $(seq 600); do
		n=$(stat -c %s "$WORK/out" 2>/dev/null || echo 0)
		[ -z "$pid" ] && pid=$(pgrep -n -u nobody '^nc' || true)
		if [ -n "$pid" ]; then
			kb=$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status" 2>/dev/null || true)
			[ -n "$kb" ] && [ "$kb" -gt "$peak" ] && peak=$kb
			[ "$n" -ge 4000000 ] && [ -n "$kb" ] && [ "$kb" -lt 256 ] && [ "$peak" -ge 1024 ] && break
		fi
		sleep 0.1
	done
	echo "server VmPin: highest $peak kB, then ${kb:-?} kB after the client's idle time"
	[ "$peak" -ge 1024 ] || fail "idle: the server never pinned the grown buffers ($peak kB)"
	[ -n "$kb" ] && [ "$kb" -lt 256 ] || fail "idle: the server still pins ${kb:-?} kB"
	touch "$WORK/idle.done"
}
note "8 MiB: on RDMA, buffers grow"
run 8388608 5040
[ "$(state_of "$WORK/server.err" server)" = rdma ] ||
	fail "8 MiB: the server's connection is $(state_of "$WORK/server.err" server), not rdma"
[ "$(grown_rx "$WORK/server.err")" = 1 ] || fail "8 MiB: the receive buffers did not grow"
[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" -ge 3900000 ] ||
	fail "8 MiB: only $(stat_of "$WORK/server.err" rdma_rx_bytes server) bytes over RDMA"
grep -q "RLIMIT_MEMLOCK\|ulimit -l" "$WORK/server.err" && fail "8 MiB: a memlock complaint"

note "1 MiB: on RDMA, buffers stay small"
run 1048576 5042
[ "$(state_of "$WORK/server.err" server)" = rdma ] ||
	fail "1 MiB: the server's connection is $(state_of "$WORK/server.err" server), not rdma"
[ "$(grown_rx "$WORK/server.err")" = 0 ] || fail "1 MiB: the receive buffers grew past the budget"
[ "$(stat_of "$WORK/server.err" grow_refused server)" -ge 1 ] || fail "1 MiB: no growth refused"
[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" -ge 3900000 ] ||
	fail "1 MiB: only $(stat_of "$WORK/server.err" rdma_rx_bytes server) bytes over RDMA"
grep -q "RLIMIT_MEMLOCK\|ulimit -l\|ibv_reg_mr" "$WORK/server.err" && fail "1 MiB: a memlock complaint"

note "32 KiB: the small buffers do not fit"
run 32768 5041
[ "$(fallback_of "$WORK/server.err" server)" = memlock ] ||
	fail "32 KiB: the server's fallback is $(fallback_of "$WORK/server.err" server), not memlock"
[ "$(grep -c "ulimit -l" "$WORK/server.err")" = 1 ] || fail "32 KiB: not said once, with the fix"
grep -q "ibv_reg_mr" "$WORK/server.err" && fail "32 KiB: registration was tried and failed"
[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" = 0 ] || fail "32 KiB: bytes on RDMA"
grep "ulimit -l" "$WORK/server.err" | cut -c1-300

note "8 MiB, then idle: the grown buffers go back"
rm -f "$WORK/idle.done"
SOVIA_BUF_IDLE_MS=2000 run 8388608 5043 idle
[ "$(state_of "$WORK/server.err" server)" = rdma ] ||
	fail "idle: the server's connection is $(state_of "$WORK/server.err" server), not rdma"
[ "$(shrunk_rx "$WORK/server.err")" = 1 ] || fail "idle: the server's statistics say shrunk=rx:$(shrunk_rx "$WORK/server.err")"
[ "$(stat_of "$WORK/client.err" drains client)" -ge 1 ] || fail "idle: the client sent no DRAIN"
[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" -ge 3900000 ] ||
	fail "idle: only $(stat_of "$WORK/server.err" rdma_rx_bytes server) bytes over RDMA"
echo "memlock: OK"
