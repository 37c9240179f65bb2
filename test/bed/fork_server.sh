#!/usr/bin/env bash
# A server on RDMA lets a forked child write part of its stream: the
# child's use takes the connection back to TCP (the server's BACK first).
# Its client, unmodified nc, taken back by its peer, asks to move to RDMA
# again; the server answers "later" while its child holds its copy, and
# once the child is gone and the server holds the connection alone, both
# ends move to RDMA again as new streams (src/stream_redo.c).
#
# sovia-forkwrite -l serves a file in three parts: 1 MiB, 64 KiB from its
# child, then 40 MiB once its second "on RDMA" is logged.
# Asserted: nc received the file byte for byte; the server's first stream
# went back to TCP (detached) and a second one reached RDMA, and so did
# the client's, which asked; the last part went over RDMA by libsovia's
# statistics at both ends (at least 90%), and rxe sent the packets it
# needs.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
HEAD=$((1 << 20)) CHILD=65536 REST=$((40 << 20))
PORT=5303
head -c $((HEAD + CHILD + REST)) /dev/urandom >"$WORK/in"

hang_watch 200 sovia-forkwrite
LD_PRELOAD=$LIB timeout 240 "$BUILD/bin/sovia-forkwrite" -l "$IP" "$PORT" "$HEAD" "$CHILD" \
	"$WORK/go1" "$WORK/go2" <"$WORK/in" 2>"$WORK/server.err" &
srv=$!
wait_port "$PORT"
LD_PRELOAD=$LIB timeout 240 nc "$IP" "$PORT" </dev/null >"$WORK/out" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/server.err" "on RDMA" 120 || fail "the server never reached RDMA"
touch "$WORK/go1"
wait_line "$WORK/server.err" "a fork's child uses its copy" 120 ||
	fail "the child's write did not claim its copy"
for _ in $(seq 1200); do
	[ "$(grep -c "on RDMA" "$WORK/server.err")" -ge 2 ] && break
	sleep 0.1
done
[ "$(grep -c "on RDMA" "$WORK/server.err")" -ge 2 ] ||
	fail "the server, alone again, did not move to RDMA again"
p0=$(rxe_pkts)
touch "$WORK/go2"
wait "$srv" || fail "sovia-forkwrite failed"
wait "$cli" || fail "nc failed"
pkts=$(($(rxe_pkts) - p0))
cmp -s "$WORK/in" "$WORK/out" || fail "nc received other bytes ($(stat -c %s "$WORK/out") of $(stat -c %s "$WORK/in"))"

grep -q "asking it to move to RDMA again" "$WORK/client.err" || fail "the client did not ask again"
[ "$(stats_lines "$WORK/client.err" client | wc -l)" -ge 2 ] || fail "client: fewer than two streams"
[ "$(stats_lines "$WORK/server.err" server | wc -l)" -ge 2 ] || fail "server: fewer than two streams"
stats_lines "$WORK/server.err" server | head -1 | grep -q " state=detached " ||
	fail "the first server stream did not go back to TCP"
cl=$(stats_lines "$WORK/client.err" client | tail -1)
sl=$(stats_lines "$WORK/server.err" server | tail -1)
[ "$(stats_field "$cl" state)" = rdma ] || fail "client successor ended $(stats_field "$cl" state)"
[ "$(stats_field "$sl" state)" = rdma ] || fail "server successor ended $(stats_field "$sl" state)"
stx=$(stats_field "$sl" rdma_tx_bytes) crx=$(stats_field "$cl" rdma_rx_bytes)
echo "fork_server: the successors carried $stx (server sent) and $crx (client got) bytes over" \
	"RDMA of the last $REST; rxe sent $pkts packets meanwhile"
[ "$stx" -ge $((REST * 9 / 10)) ] || fail "server: ${stx} of $REST bytes over RDMA"
[ "$crx" -ge $((REST * 9 / 10)) ] || fail "client: ${crx} of $REST bytes over RDMA"
[ "$pkts" -ge $((REST / 4096)) ] || fail "rxe sent $pkts packets for $REST bytes"
echo "fork_server: OK"
