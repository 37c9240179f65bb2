#!/usr/bin/env bash
# A stdio program (fdopen(sock, "r+"), fprintf, fflush, fgets) on both ends,
# preloaded: every reply is checked, and the lines went over RDMA once the
# connection was upgraded.
. "$(dirname "$0")/lib.sh"
LINES=${SOVIA_IT_LINES:-1000}
LD_PRELOAD=$LIB timeout 300 "$BUILD/apps/sovia-stdio" -s "$IP" 5021 >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5021
LD_PRELOAD=$LIB run_logged "$WORK/client.out" "$WORK/client.err" \
	timeout 300 "$BUILD/apps/sovia-stdio" -c "$IP" 5021 "$LINES"
wait "$srv" || { cat "$WORK/server.err" >&2; fail "server failed"; }
grep -q "OK $LINES lines" "$WORK/client.out" || fail "client did not finish"
grep -q "answered $LINES lines" "$WORK/server.out" || fail "server did not answer every line"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
for role in client server; do
	rb=$(stat_of "$WORK/stats" rdma_tx_bytes $role)
	[ "$rb" -gt 0 ] || { cat "$WORK/stats" >&2; fail "$role sent nothing over RDMA"; }
	echo "$role: rdma_tx_bytes=$rb tcp_tx_bytes=$(stat_of "$WORK/stats" tcp_tx_bytes $role)"
done
echo "stdio: OK"
