#!/usr/bin/env bash
# The socket semantics applications rely on, on a connection that is on
# RDMA at both ends (apps/sovia_semantics.c lists the steps): SO_RCVTIMEO,
# EAGAIN, FIONREAD, MSG_PEEK, MSG_WAITALL, EINTR and SA_RESTART, EPIPE and
# SIGPIPE. The steps start only once both ends logged "on RDMA".
. "$(dirname "$0")/lib.sh"
PORT=5081
export SOVIA_LOG=info
LD_PRELOAD=$LIB "$BUILD/apps/sovia-semantics" -s $PORT >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port $PORT
LD_PRELOAD=$LIB "$BUILD/apps/sovia-semantics" -c "$IP" $PORT >"$WORK/client.out" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/server.err" "on RDMA" 120 || fail "the server's connection never reached RDMA"
wait_line "$WORK/client.err" "on RDMA" 120 || fail "the client's connection never reached RDMA"
kill -USR1 $srv $cli
rc=0
wait $cli || rc=$?
[ $rc = 0 ] || fail "the client failed ($rc)"
wait $srv || rc=$?
[ $rc = 0 ] || fail "the server failed ($rc)"
cat "$WORK/server.out" "$WORK/client.out"
[ "$(grep -c ": ok$" "$WORK/server.out")" = 6 ] || fail "the server did not finish its steps"
echo "semantics: steps OK"

# Coalesced bytes go out when the application waits in poll, select or
# epoll_wait (docs/protocol.md, section 7). Each round's second piece is
# held; with the coalescing timer at 0.5 s and the delayed ACK at 1 s,
# only the client's wait can push it out at once. The rounds would still
# finish without that rule (the server's delayed ACK releases the piece
# after 1 s: counted as "idle"), so the counters tell: three pushes by a
# wait ("recv"), none by the timer. Checked against a build without the
# rule: "recv:0", and the test fails.
PORT=5083
export SOVIA_STATS=1 SOVIA_COALESCE_TIMEOUT_US=500000 SOVIA_ACK_TIMEOUT_US=1000000
LD_PRELOAD=$LIB "$BUILD/apps/sovia-semantics" -S $PORT >"$WORK/wserver.out" 2>"$WORK/wserver.err" &
srv=$!
wait_port $PORT
LD_PRELOAD=$LIB "$BUILD/apps/sovia-semantics" -C "$IP" $PORT >"$WORK/wclient.out" 2>"$WORK/wclient.err" &
cli=$!
wait_line "$WORK/wserver.err" "on RDMA" 120 || fail "the wait rounds' server never reached RDMA"
wait_line "$WORK/wclient.err" "on RDMA" 120 || fail "the wait rounds' client never reached RDMA"
kill -USR1 $srv $cli
wait $cli || rc=$?
[ $rc = 0 ] || fail "the wait rounds' client failed ($rc)"
wait $srv || rc=$?
[ $rc = 0 ] || fail "the wait rounds' server failed ($rc)"
cat "$WORK/wserver.out" "$WORK/wclient.out"
[ "$(grep -c ": ok$" "$WORK/wclient.out")" = 3 ] || fail "the client did not finish its rounds"
line=$(grep "libsovia stats" "$WORK/wclient.err" | grep " client state=") ||
	fail "no statistics from the wait rounds' client"
echo "$line"
flushes=$(echo "$line" | grep -o "flushes=[^ ]*")
case "$flushes" in
*timer:0,*recv:3,*) ;;
*) fail "held pieces were not pushed out by the waits: $flushes" ;;
esac
echo "semantics: OK (and poll, select, epoll_wait pushed out coalesced bytes)"
