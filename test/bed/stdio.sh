#!/usr/bin/env bash
# A stdio program (fdopen(sock, "r+"), fprintf, fflush, fgets) on both ends,
# preloaded: every reply is checked, and the lines after the first went over
# RDMA. The client pauses after its first line until both ends say their
# connection is on RDMA (their log), however long the upgrade takes.
. "$(dirname "$0")/lib.sh"
LINES=${SOVIA_IT_LINES:-1000}
export SOVIA_LOG=info
p0=$(rxe_pkts)
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-stdio" -s "$IP" 5021 >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5021
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-stdio" -c "$IP" 5021 "$LINES" "$WORK/go" \
	>"$WORK/client.out" 2>"$WORK/client.err" &
cli=$!
wait_line "$WORK/client.err" "on RDMA" 240 || fail "the client's connection never went on RDMA"
wait_line "$WORK/server.err" "on RDMA" 240 || fail "the server's connection never went on RDMA"
touch "$WORK/go"
wait "$cli" || fail "client failed"
cat "$WORK/client.out"
wait "$srv" || { cat "$WORK/server.err" >&2; fail "server failed"; }
grep -q "OK $LINES lines" "$WORK/client.out" || fail "client did not finish"
grep -q "answered $LINES lines" "$WORK/server.out" || fail "server did not answer every line"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
# Only the first line and its reply (a few bytes each) went over TCP; the
# rest of what each end wrote (every line is 10 bytes or more) went over
# RDMA, one message at least per line each way.
for role in client server; do
	sent=$(($(stat_of "$WORK/stats" rdma_tx_bytes $role) + $(stat_of "$WORK/stats" tcp_tx_bytes $role)))
	[ "$sent" -ge $((LINES * 10)) ] || fail "$role: libsovia saw only $sent bytes written"
	assert_rdma_carried "$WORK/stats" $role $((sent - 64)) 64
done
dp=$(($(rxe_pkts) - p0))
[ "$dp" -ge $((2 * (LINES - 1))) ] || fail "rxe sent only $dp packets for $LINES lines"
echo "stdio: OK"
