#!/usr/bin/env bash
# A client on RDMA lets a forked child write part of its stream (a shell
# running a command with the connection as its output): the child's use
# takes the connection back to TCP (its copy claims it), and once the
# child is gone the parent, alone again, moves it to RDMA again as a new
# stream, from where both directions stand (src/stream_redo.c). The
# server, unmodified nc, is revived the same way by the request.
#
# sovia-forkwrite sends a file in three parts: 1 MiB, then 64 KiB from
# its child, then 40 MiB once the parent's second "on RDMA" is logged.
# Asserted: nc received the file byte for byte; the first client stream
# went back to TCP for the child (detached) and a second one reached
# RDMA; the last part went over RDMA by libsovia's statistics at both
# ends (at least 90%), and rxe sent the packets it needs.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
HEAD=$((1 << 20)) CHILD=65536 REST=$((40 << 20))
PORT=5301
head -c $((HEAD + CHILD + REST)) /dev/urandom >"$WORK/in"

LD_PRELOAD=$LIB timeout 300 nc -l "$IP" "$PORT" >"$WORK/out" 2>"$WORK/server.err" &
srv=$!
wait_port "$PORT"
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-forkwrite" "$IP" "$PORT" "$HEAD" "$CHILD" \
	"$WORK/go1" "$WORK/go2" <"$WORK/in" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/client.err" "on RDMA" 120 || fail "the client never reached RDMA"
touch "$WORK/go1"
wait_line "$WORK/client.err" "a fork's child uses its copy" 120 ||
	fail "the child's write did not claim its copy"
for _ in $(seq 1200); do
	[ "$(grep -c "on RDMA" "$WORK/client.err")" -ge 2 ] && break
	sleep 0.1
done
[ "$(grep -c "on RDMA" "$WORK/client.err")" -ge 2 ] ||
	fail "the parent, alone again, did not move to RDMA again"
p0=$(rxe_pkts)
touch "$WORK/go2"
wait "$cli" || fail "sovia-forkwrite failed"
wait "$srv" || fail "nc failed"
pkts=$(($(rxe_pkts) - p0))
cmp -s "$WORK/in" "$WORK/out" || fail "nc received other bytes ($(stat -c %s "$WORK/out") of $(stat -c %s "$WORK/in"))"

grep -q "moves to RDMA again" "$WORK/client.err" || fail "no second life logged"
# Each end: the first stream's line (detached), then its successor's.
[ "$(stats_lines "$WORK/client.err" client | wc -l)" -ge 2 ] || fail "client: fewer than two streams"
[ "$(stats_lines "$WORK/server.err" server | wc -l)" -ge 2 ] || fail "server: fewer than two streams"
stats_lines "$WORK/client.err" client | head -1 | grep -q " state=detached " ||
	fail "the first client stream did not go back to TCP"
cl=$(stats_lines "$WORK/client.err" client | tail -1)
sl=$(stats_lines "$WORK/server.err" server | tail -1)
[ "$(stats_field "$cl" state)" = rdma ] || fail "client successor ended $(stats_field "$cl" state)"
[ "$(stats_field "$sl" state)" = rdma ] || fail "server successor ended $(stats_field "$sl" state)"
ctx=$(stats_field "$cl" rdma_tx_bytes) srx=$(stats_field "$sl" rdma_rx_bytes)
echo "fork_alone: the successors carried $ctx (client sent) and $srx (server got) bytes over" \
	"RDMA of the last $REST; rxe sent $pkts packets meanwhile"
[ "$ctx" -ge $((REST * 9 / 10)) ] || fail "client: ${ctx} of $REST bytes over RDMA"
[ "$srx" -ge $((REST * 9 / 10)) ] || fail "server: ${srx} of $REST bytes over RDMA"
[ "$pkts" -ge $((REST / 4096)) ] || fail "rxe sent $pkts packets for $REST bytes"
echo "fork_alone: OK"
