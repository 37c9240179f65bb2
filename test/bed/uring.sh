#!/usr/bin/env bash
# io_uring on an accelerated connection. The server (test/bed/progs/sovia_uring.c)
# reads the first 8 MB with read(), over RDMA; then it sets up a ring and
# receives and sends back the rest through it. A ring's operations reach
# the kernel's socket with no call libsovia could serve, so setting it up
# takes the process's connections back to plain TCP first: every byte must
# arrive, in order, both ways, and the server must have gone back.
. "$(dirname "$0")/lib.sh"
SIZE=20000000 FIRST=8000000 PORT=5091
export SOVIA_LOG=${SOVIA_LOG:-info}
[ -x "$BUILD/bin/sovia-uring" ] || fail "no sovia-uring: liburing-dev was missing at build time"
head -c "$SIZE" /dev/urandom >"$WORK/in"
LD_PRELOAD=$LIB timeout 600 "$BUILD/bin/sovia-uring" -r $FIRST -g "$WORK/gate" $PORT \
	>"$WORK/got" 2>"$WORK/server.err" &
srv=$!
wait_port $PORT
p0=$(rxe_pkts)
LD_PRELOAD=$LIB timeout 600 nc -N "$IP" $PORT <"$WORK/in" >"$WORK/echo" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/server.err" "on RDMA" 120 || fail "the connection never reached RDMA"
wait_rxe 1024 "$p0" 120 || fail "the transfer never got going on RDMA"
touch "$WORK/gate" # the ring comes now, with bytes in flight on the QP
wait "$cli" || fail "the client failed"
wait "$srv" || fail "the server failed"
cmp "$WORK/in" "$WORK/got" || fail "the server received other bytes"
tail -c +$((FIRST + 1)) "$WORK/in" | cmp - "$WORK/echo" || fail "the ring's echo differs"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
grep -q "io_uring in this process" "$WORK/server.err" || fail "libsovia did not see the ring"
grep -q "libsovia stats \[detach\].* server " "$WORK/stats" || fail "the server never went back to TCP"
rdma=$(stat_of "$WORK/stats" rdma_tx_bytes client)
[ "$rdma" -ge 1000000 ] || fail "only $rdma bytes went over RDMA before the ring"
echo "io_uring: $SIZE bytes identical, $((SIZE - FIRST)) echoed through the ring;" \
	"$rdma over RDMA before it, then plain TCP"
