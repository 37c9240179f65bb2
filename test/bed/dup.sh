#!/usr/bin/env bash
# dup, dup2, dup3 and fcntl(F_DUPFD) on accelerated connections: every copy
# is the same connection and it stays on RDMA. The server echoes through a
# dup of the accepted fd (the original closed at once); the client switches
# its sending fd midway (dup, close the original, dup3, F_DUPFD) and reads
# through a dup2 copy. Every byte is checked, the connection must not have
# gone back to TCP, and the payload after the upgrade travels over RDMA.
. "$(dirname "$0")/lib.sh"
SIZE=${SOVIA_IT_SIZE:-33554432}
PORT=5071
export SOVIA_LOG=info
LD_PRELOAD=$LIB timeout 600 "$BUILD/bin/sovia-dup" -s $PORT >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port $PORT
# The client's sender waits at its midpoint for the gate, opened once the
# connection is on RDMA: its fd switching happens on RDMA, and the second
# half cannot go over TCP however slow the upgrade is.
LD_PRELOAD=$LIB timeout 600 "$BUILD/bin/sovia-dup" -c "$IP" $PORT "$SIZE" "$WORK/gate" \
	>"$WORK/client.out" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/client.err" "on RDMA" 120 || fail "the client's connection never reached RDMA"
touch "$WORK/gate"
wait "$cli" || fail "the client failed"
wait "$srv" || fail "the server failed"
cat "$WORK/server.out" "$WORK/client.out"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
for role in client server; do
	n=$(grep -h "libsovia stats" "$WORK/stats" | grep -c " $role ") || true
	[ "$n" = 1 ] || fail "$role: $n stats lines: the connection must end once, at the last copy's close"
	back=$(grep -h "libsovia stats" "$WORK/stats" | grep " $role " | sed -n 's/.*to_tcp:\([0-9]*\).*/\1/p')
	[ "$back" = 0 ] || fail "$role: the connection went back to TCP ($back switches)"
	# Writes before the upgrade go over TCP; the rest must be RDMA's.
	assert_rdma_carried "$WORK/stats" "$role" $((SIZE / 2)) $((SIZE / 2))
done
echo "dup: OK"
