#!/usr/bin/env bash
# The socket semantics applications rely on, on a connection that is on
# RDMA at both ends (test/bed/progs/sovia_semantics.c lists the steps): SO_RCVTIMEO,
# EAGAIN, FIONREAD, MSG_PEEK, MSG_WAITALL, EINTR and SA_RESTART, EPIPE and
# SIGPIPE. The steps start only once both ends logged "on RDMA".
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info

# Runs sovia-semantics' server (flag $1) and client (flag $2) on port $3,
# output under $WORK/$4{server,client}.{out,err}, and starts their steps
# once both connections logged "on RDMA". $5 names the pair in failures.
run_pair() {
	local sflag=$1 cflag=$2 port=$3 tag=$4 who=$5 srv cli rc=0
	LD_PRELOAD=$LIB "$BUILD/bin/sovia-semantics" "$sflag" "$port" \
		>"$WORK/${tag}server.out" 2>"$WORK/${tag}server.err" &
	srv=$!
	wait_port "$port"
	LD_PRELOAD=$LIB "$BUILD/bin/sovia-semantics" "$cflag" "$IP" "$port" \
		>"$WORK/${tag}client.out" 2>"$WORK/${tag}client.err" &
	cli=$!
	wait_line "$WORK/${tag}server.err" "on RDMA" 120 || fail "$who: the server never reached RDMA"
	wait_line "$WORK/${tag}client.err" "on RDMA" 120 || fail "$who: the client never reached RDMA"
	kill -USR1 $srv $cli
	wait $cli || rc=$?
	[ $rc = 0 ] || fail "$who: the client failed ($rc)"
	wait $srv || rc=$?
	[ $rc = 0 ] || fail "$who: the server failed ($rc)"
	cat "$WORK/${tag}server.out" "$WORK/${tag}client.out"
}

run_pair -s -c 5081 "" steps
[ "$(grep -c ": ok$" "$WORK/server.out")" = 7 ] || fail "the server did not finish its steps"
echo "semantics: steps OK"

# Coalesced bytes go out when the application waits in poll, select or
# epoll_wait (docs/protocol.md, section 7). Each round's second piece is
# held; with the coalescing timer at 0.5 s and the delayed ACK at 1 s,
# only the client's wait can push it out at once. The rounds would still
# finish without that rule (the server's delayed ACK releases the piece
# after 1 s: counted as "idle"), so the counters tell: three pushes by a
# wait ("recv"), none by the timer. Checked against a build without the
# rule: "recv:0", and the test fails.
export SOVIA_STATS=1 SOVIA_COALESCE_TIMEOUT_US=500000 SOVIA_ACK_TIMEOUT_US=1000000
run_pair -S -C 5083 w "wait rounds"
[ "$(grep -c ": ok$" "$WORK/wclient.out")" = 3 ] || fail "the client did not finish its rounds"
line=$(grep "libsovia stats" "$WORK/wclient.err" | grep " client state=rdma ") ||
	fail "no statistics of the wait rounds' client on RDMA"
echo "$line"
flushes=$(echo "$line" | grep -o "flushes=[^ ]*")
case "$flushes" in
*timer:0,*recv:3,*) ;;
*) fail "held pieces were not pushed out by the waits: $flushes" ;;
esac
echo "semantics: OK (and poll, select, epoll_wait pushed out coalesced bytes)"

# A writer that closes and calls _exit at once (ftpd ends its sessions so)
# owes its last bytes and FIN on the QP: _exit runs the exit's flush. Both
# the bulk and the held tail must arrive, over RDMA, and the writer's
# statistics line (printed by that flush) must say so. Without the flush
# the reader met a clean end of the stream short of the tail.
run_pair -E -e 5087 x "_exit writer"
grep -q "^exit-reader: 1048676 bytes, all in order: ok" "$WORK/xserver.out" ||
	fail "the _exit writer's bytes did not all arrive"
line=$(grep "libsovia stats" "$WORK/xclient.err" | grep " client state=rdma ") ||
	fail "no statistics line of the _exit writer on RDMA"
[ "$(echo "$line" | sed -n 's/.* rdma_tx_bytes=\([0-9]*\) .*/\1/p')" = 1048676 ] ||
	fail "the _exit writer did not send everything over RDMA: $line"
[ "$(stat_of "$WORK/xserver.err" rdma_rx_bytes server)" = 1048676 ] ||
	fail "the reader did not receive everything over RDMA"
echo "semantics: OK (a close then _exit delivered everything over RDMA)"

# TCP_NODELAY set before the connect is the stream's too: every small write
# goes out as its own message, none is coalesced. sovia-bench -N sets it on
# the client's socket before connect(); the same run without -N must
# coalesce, or the check could not tell the two apart. Without the fix
# (the stream started from SOVIA_COALESCE only) the -N run coalesced.
unset SOVIA_COALESCE_TIMEOUT_US SOVIA_ACK_TIMEOUT_US
LD_PRELOAD=$LIB "$BUILD/bin/sovia-bench" server -b "$IP" -p 5085 \
	>"$WORK/nd-server.out" 2>"$WORK/nd-server.err" &
nds=$!
wait_port 5085
for mode in nodelay coalesce; do
	flag=""
	[ $mode = nodelay ] && flag=-N
	LD_PRELOAD=$LIB run_logged "$WORK/nd-$mode.out" "$WORK/nd-$mode.err" \
		timeout 120 "$BUILD/bin/sovia-bench" client -H "$IP" -p 5085 -t bw -s 64 -w 2 -d 1 $flag
	[ "$(state_of "$WORK/nd-$mode.err" client)" = rdma ] ||
		fail "$mode: the streaming client did not end on RDMA"
done
LD_PRELOAD=$LIB "$BUILD/bin/sovia-bench" client -H "$IP" -p 5085 -t quit >/dev/null 2>&1 || true
wait $nds || fail "the sovia-bench server failed"
nd=$(stat_of "$WORK/nd-nodelay.err" coalesced_writes client)
co=$(stat_of "$WORK/nd-coalesce.err" coalesced_writes client)
echo "semantics: coalesced 64 B writes: $nd with TCP_NODELAY set before connect, $co without"
[ "$co" -gt 0 ] || fail "without TCP_NODELAY no write was coalesced: the check cannot tell"
[ "$nd" = 0 ] || fail "TCP_NODELAY set before connect was ignored: $nd writes coalesced"
echo "semantics: OK (TCP_NODELAY before connect)"
