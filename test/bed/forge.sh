#!/usr/bin/env bash
# No hijack: a third party that knows a connection's 4-tuple asks the
# preloaded server to attach a QP to it, announces a switch at the right byte
# offset and sends data. The server must deliver only the real client's
# bytes, send nothing to the attacker, and keep the connection on TCP.
# Then: a request for a connection nobody accepted is refused after a
# bounded wait.
. "$(dirname "$0")/lib.sh"
PORT=5041 CPORT=40001
# The server (preloaded) replies after 4 s; the client (plain, fixed source
# port) sends one line, a second after 3 s, and ends after 6 s.
(sleep 4; printf 'secret-reply\n') |
	LD_PRELOAD=$LIB timeout 60 nc -N -l "$IP" $PORT >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port $PORT
(printf 'part1\n'; sleep 3; printf 'part2\n'; sleep 3) |
	timeout 60 nc -N -p $CPORT "$IP" $PORT >"$WORK/client.out" 2>"$WORK/client.err" &
cli=$!
sleep 1
run_logged "$WORK/forge.out" "$WORK/forge.err" \
	"$BUILD/bin/sovia-forge" -a "$IP" -p $PORT -C "$IP" -P $CPORT -N 6 -t 8
wait "$cli" || fail "client failed"
wait "$srv" || fail "server failed"
printf 'part1\npart2\n' | cmp - "$WORK/server.out" || fail "the server's application got other bytes: $(cat -A "$WORK/server.out")"
printf 'secret-reply\n' | cmp - "$WORK/client.out" || fail "the client got other bytes"
grep -q "accepted at the rdma_cm level" "$WORK/forge.out" || fail "the forged request did not reach the upgrade check"
grep -q "server sent 0 data bytes" "$WORK/forge.out" || fail "the attacker received data"
fb=$(fallback_of "$WORK/server.err" server)
[ "$fb" = challenge-failed ] || { cat "$WORK/server.err" >&2; fail "server fallback '$fb', want challenge-failed"; }
echo "forged upgrade: refused (server stayed on TCP: $fb; application bytes intact)"

# A request for a 4-tuple no accepted connection has: refused once the
# server has waited SOVIA_UPGRADE_TIMEOUT_MS (5 s here) for its accept().
SOVIA_UPGRADE_TIMEOUT_MS=5000 LD_PRELOAD=$LIB timeout 60 nc -l "$IP" 5042 >/dev/null 2>&1 &
srv2=$!
wait_port 5042
t0=$(date +%s)
run_logged "$WORK/forge2.out" "$WORK/forge2.err" \
	"$BUILD/bin/sovia-forge" -a "$IP" -p 5042 -C "$IP" -P 40002 -N 0 -t 1
t1=$(date +%s)
grep -q "request refused (RDMA_CM_EVENT_REJECTED)" "$WORK/forge2.out" || fail "an unmatched request was not rejected"
echo "unmatched request: rejected after $((t1 - t0)) s (SOVIA_UPGRADE_TIMEOUT_MS bounds it)"
kill "$srv2" 2>/dev/null || true
echo "forge: OK"
