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
echo "semantics: OK"
