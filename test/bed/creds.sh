#!/usr/bin/env bash
# Credential changes while connections run over RDMA: both ends switch
# their effective uid to nobody's and back after every MiB they move, as
# ftpd does around each data connection's bind. The kernel then refuses
# every write to the RDMA files opened before: rdma_cm's channel, and rxe's
# doorbell after each post. Three connections, one after the other, in the
# same two processes:
# - the first is on RDMA before its bytes start, and all of them, and the
#   server's answer after its last change, go over the QP (rxe's doorbell
#   rung through ioctl: both ends' logs say so);
# - the later ones are made after dozens of changes (the server's RDMA
#   listener and the client's new rdma_cm id on a channel of the new
#   credentials) and carry at least 90% of their bytes over RDMA.
# Every connection ends on RDMA with no fallback, and rxe counted the
# packets.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=${SOVIA_LOG:-info}
BYTES=$((32 * 1024 * 1024))
CONNS=3
PORT=5061
APP=$BUILD/bin/sovia-setuid
[ "$(id -u)" = 0 ] || fail "needs root (it switches its euid)"

LD_PRELOAD=$LIB timeout 600 "$APP" -s $PORT $BYTES $CONNS >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port $PORT
LD_PRELOAD=$LIB "$APP" -c "$IP" $PORT $BYTES $CONNS >"$WORK/client.out" 2>"$WORK/client.err" &
cli=$! # no timeout(1) in between: it would take the SIGUSR1
wait_line "$WORK/client.err" ": on RDMA" 120 || fail "the first connection never went on RDMA"
p0=$(rxe_pkts)
kill -USR1 "$cli"
wait "$cli" || { cat "$WORK/client.err" >&2; fail "the client failed"; }
wait "$srv" || { cat "$WORK/server.err" >&2; fail "the server failed: the bytes differ"; }
dp=$(($(rxe_pkts) - p0))
[ "$(grep -c "^OK $BYTES$" "$WORK/server.out")" -eq $CONNS ] || fail "the server did not check every byte"
[ "$(grep -c "^answer: OK $BYTES$" "$WORK/client.out")" -eq $CONNS ] || fail "the client missed an answer"
grep -h "libsovia stats" "$WORK/client.err" "$WORK/server.err" | cut -c1-220

# One line per connection and side, in the order they closed.
lines() { grep -h "libsovia stats" "$WORK/$1.err" | grep " $1 "; }
for side in client server; do
	[ "$(lines $side | wc -l)" -eq $CONNS ] || fail "the $side has $(lines $side | wc -l) lines, not $CONNS"
	bad=$(lines $side | grep -v " state=rdma fallback=none " || true)
	[ -z "$bad" ] || fail "a $side connection did not end on RDMA: $bad"
	grep -q "doorbell goes through ioctl" "$WORK/$side.err" || fail "the $side never rang rxe's doorbell through ioctl"
done
rdma=$(lines client | sed -n 's/.* rdma_tx_bytes=\([0-9]*\).*/\1/p' | tr '\n' ' ')
set -- $rdma
[ "$1" -eq $BYTES ] || fail "RDMA carried $1 of the first connection's $BYTES bytes"
shift
for b in "$@"; do
	[ "$b" -ge $((BYTES * 9 / 10)) ] || fail "RDMA carried only $b of a later connection's $BYTES bytes ($rdma)"
done
ans=$(lines server | sed -n 's/.* rdma_tx_bytes=\([0-9]*\).*/\1/p' | tr '\n' ' ')
for b in $ans; do
	[ "$b" -eq $((${#BYTES} + 4)) ] || fail "RDMA carried $b bytes of an answer ($ans)"
done
[ "$dp" -ge $((CONNS * BYTES / 4096)) ] || fail "rxe sent only $dp packets"
flips=$((CONNS * BYTES / 1048576))
echo "creds: $CONNS connections of $BYTES bytes over RDMA ($rdma) across $flips euid changes per end; rxe packets +$dp"
echo "creds: OK"
