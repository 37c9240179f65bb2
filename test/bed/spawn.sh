#!/usr/bin/env bash
# The way back to TCP, with both ends preloaded.
#
# 1. fork/exec server: an accept-then-fork server whose child execs `cat`
#    on the socket (stdin/stdout). The client's bytes travel over RDMA and
#    sit unread in the server's libsovia when it forks; fork, dup2 and exec
#    need the kernel socket to carry the whole stream, so the connection
#    goes back to plain TCP first and the server gives back the bytes it
#    has not read. `cat` must echo every byte, in order.
# 2. idle peer: the client forks while the server's application sleeps in
#    sigwait() and calls nothing. The server's helper thread must answer
#    the client's BACK by itself (it watches the completion channel of an
#    idle connection): the client's fork goes ahead long before the
#    upgrade timeout, and every byte still reaches the server, in order.
#
# Each step waits for an event (the "on RDMA" log line, rxe packets, the
# detach's stats line), bounded only against hangs; nothing is timed. The
# programs that get SIGUSR1 run without timeout(1), which would take the
# signal itself: the test bed's own timeout bounds them.
. "$(dirname "$0")/lib.sh"
SIZE=20000000
head -c "$SIZE" /dev/urandom >"$WORK/in"
want=$(md5sum <"$WORK/in" | cut -d' ' -f1)
SPAWN=$BUILD/bin/sovia-spawn
export SOVIA_LOG=${SOVIA_LOG:-info}

check_back() { # $1: what, $2: role that sent over RDMA, $3: role that gave back
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local rdma back gotback
	rdma=$(stat_of "$WORK/stats" rdma_tx_bytes "$2")
	back=$(stat_of "$WORK/stats" gave_back_bytes "$3")
	gotback=$(stat_of "$WORK/stats" got_back_bytes "$2")
	grep -q "libsovia stats \[detach\].* $3 " "$WORK/stats" || fail "$1: the $3 never went back to TCP"
	[ "$rdma" -gt 0 ] || fail "$1: nothing went over RDMA"
	[ "$back" -gt 0 ] && [ "$back" = "$gotback" ] || fail "$1: gave back $back, got back $gotback"
	echo "$1: $SIZE bytes identical; $rdma over RDMA first, $back given back at the fork"
}

fork_server() { # $1: port, $2: bytes the server reads itself before the fork
	local port=$1 own=$2
	rm -f "$WORK/out" "$WORK/"*.err
	LD_PRELOAD=$LIB "$SPAWN" -s -r "$own" "$port" cat 2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	local p0
	p0=$(rxe_pkts)
	LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" <"$WORK/in" >"$WORK/out" 2>"$WORK/client.err" &
	local cli=$!
	# Fork once the client's bytes went over the QP: it fills the sleeping
	# server's window (32 messages of 16 KiB: at least 128 packets even at
	# rxe's largest MTU, 4096; the upgrade itself sends about a dozen).
	wait_line "$WORK/server.err" ": on RDMA" 120 || fail "own=$own: the connection never went on RDMA"
	wait_rxe 100 "$p0" || fail "own=$own: no RDMA traffic after the upgrade"
	kill -USR1 "$srv"
	wait "$cli" || fail "own=$own: client failed"
	wait "$srv" || fail "own=$own: server failed"
	# The server's first $own bytes came back from the server itself; the
	# rest is cat's echo: together, the stream sent.
	local got
	got=$(md5sum <"$WORK/out" | cut -d' ' -f1)
	[ "$got" = "$want" ] || fail "own=$own: echo differs ($(stat -c %s "$WORK/out") bytes back)"
	check_back "fork server, own=$own" client server
}

idle_peer() { # $1: port
	local port=$1
	rm -f "$WORK/out" "$WORK/"*.err
	# Long enough that a BACK answered only by the upgrade timeout (the
	# idle server's application never calls in) fails the bound below.
	export SOVIA_UPGRADE_TIMEOUT_MS=300000
	LD_PRELOAD=$LIB "$SPAWN" -s "$port" sh -c "exec cat >'$WORK/out'" \
		2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	# The client sends 64 KiB itself over RDMA (within the window, so it
	# never waits for the sleeping server), then forks; its child `cat`
	# sends the rest over TCP.
	LD_PRELOAD=$LIB "$SPAWN" -c "$IP" -s -r 65536 "$port" cat <"$WORK/in" \
		2>"$WORK/client.err" &
	local cli=$!
	wait_line "$WORK/client.err" ": on RDMA" 120 || fail "idle: the connection never went on RDMA"
	kill -USR1 "$cli"
	wait_line "$WORK/client.err" "libsovia stats \[detach\]" 90 ||
		fail "idle: the client's fork is still waiting for the idle server's BACK"
	kill -USR1 "$srv"
	wait "$cli" || fail "idle: client failed"
	wait "$srv" || fail "idle: server failed"
	local got
	got=$(md5sum <"$WORK/out" | cut -d' ' -f1)
	[ "$got" = "$want" ] || fail "idle: the server received other bytes ($(stat -c %s "$WORK/out"))"
	check_back "idle peer" client server
}

fork_server 5031 0
[ -n "${SPAWN_ONLY_FIRST:-}" ] || fork_server 5032 100000
idle_peer 5033
echo "spawn: OK"
