#!/usr/bin/env bash
# A client on RDMA hands its connection to a forked child and exits (a
# daemon's start): the child's first write takes the connection back to
# TCP (its copy claims it) while the parent still holds its own; the
# parent's exit hands the connection to the child, which, holding it
# alone, moves it to RDMA again as a stream of its own, from where both
# directions stand (src/shares.h, sv_shares_adopt). The server,
# unmodified nc, is revived by the child's request.
#
# sovia-forkwrite ... leave: the parent sends 1 MiB, its child 64 KiB, the
# parent exits, and the child sends 40 MiB more.
# Asserted: nc received the file byte for byte; the parent's stream went
# back to TCP (detached) and handed the connection on; the child's stream
# reached RDMA, and so did the server's second one; the last part went
# over RDMA by libsovia's statistics at both ends (at least 80%: the
# child's writes go on over TCP until the switch), and rxe sent the
# packets it needs.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
HEAD=$((1 << 20)) CHILD=65536 REST=$((40 << 20))
PORT=5302
head -c $((HEAD + CHILD + REST)) /dev/urandom >"$WORK/in"

LD_PRELOAD=$LIB timeout 300 nc -l "$IP" "$PORT" >"$WORK/out" 2>"$WORK/server.err" &
srv=$!
wait_port "$PORT"
LD_PRELOAD=$LIB timeout 300 "$BUILD/apps/sovia-forkwrite" "$IP" "$PORT" "$HEAD" "$CHILD" \
	"$WORK/go1" "$WORK/go2" leave <"$WORK/in" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/client.err" "on RDMA" 120 || fail "the client never reached RDMA"
touch "$WORK/go1"
wait "$cli" || fail "sovia-forkwrite's parent failed"
grep -q "handed to the fork's children" "$WORK/client.err" ||
	fail "the parent's exit did not hand the connection on"
p0=$(rxe_pkts)
touch "$WORK/go2"
wait "$srv" || fail "nc failed"
pkts=$(($(rxe_pkts) - p0))
# The child's statistics line comes at its exit, after nc's end.
for _ in $(seq 100); do
	[ "$(grep -c "libsovia stats.* client " "$WORK/client.err")" -ge 2 ] && break
	sleep 0.1
done
cmp -s "$WORK/in" "$WORK/out" || fail "nc received other bytes ($(stat -c %s "$WORK/out") of $(stat -c %s "$WORK/in"))"

grep -q "no one else holds it: it moves to RDMA again" "$WORK/client.err" ||
	fail "the child did not take the connection over"
[ "$(stats_lines "$WORK/client.err" client | wc -l)" -ge 2 ] || fail "client: fewer than two streams"
[ "$(stats_lines "$WORK/server.err" server | wc -l)" -ge 2 ] || fail "server: fewer than two streams"
stats_lines "$WORK/client.err" client | head -1 | grep -q " state=detached " ||
	fail "the parent's stream did not go back to TCP"
cl=$(stats_lines "$WORK/client.err" client | tail -1)
sl=$(stats_lines "$WORK/server.err" server | tail -1)
[ "$(stats_field "$cl" state)" = rdma ] || fail "the child's stream ended $(stats_field "$cl" state)"
[ "$(stats_field "$sl" state)" = rdma ] || fail "server successor ended $(stats_field "$sl" state)"
ctx=$(stats_field "$cl" rdma_tx_bytes) srx=$(stats_field "$sl" rdma_rx_bytes)
echo "fork_handed: the child's stream sent $ctx and the server's second got $srx bytes over" \
	"RDMA of the last $REST; rxe sent $pkts packets meanwhile"
[ "$ctx" -ge $((REST * 8 / 10)) ] || fail "client: ${ctx} of $REST bytes over RDMA"
[ "$srx" -ge $((REST * 8 / 10)) ] || fail "server: ${srx} of $REST bytes over RDMA"
[ "$pkts" -ge $((REST * 8 / 10 / 4096)) ] || fail "rxe sent $pkts packets for $REST bytes"
echo "fork_handed: OK"
