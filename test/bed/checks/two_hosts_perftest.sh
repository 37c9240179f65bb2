#!/bin/bash
# In-bed check for `sovia-bed --two-hosts`: ib_send_bw between the guests.
# Role a runs the server; it enters the barrier once it listens for the
# out-of-band TCP handshake, and role b starts the client after the barrier.
# usage: two_hosts_perftest.sh [ITERATIONS] [SIZE]
set -euo pipefail
: "${SOVIA_BED_ROLE:?run me under test/bed/sovia-bed --two-hosts}"
dev=$SOVIA_BED_DEV peer=$SOVIA_BED_PEER_IP
iters=${1:-200} size=${2:-4096} port=18515
barrier=${SOVIA_BED_BARRIER:-$(dirname "$0")/../bed-barrier}
args=(-d "$dev" -n "$iters" -s "$size" -p "$port" -F)

case "$SOVIA_BED_ROLE" in
a)
    timeout 240 ib_send_bw "${args[@]}" &
    srv=$!
    for _ in $(seq 300); do
        ss -Hltn "sport = :$port" | grep -q . && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.1
    done
    "$barrier" perftest-server-listening 120
    rc=0
    wait "$srv" || rc=$?
    ;;
b)
    "$barrier" perftest-server-listening 120
    rc=0
    timeout 240 ib_send_bw "${args[@]}" "$peer" || rc=$?
    ;;
*) echo "bad SOVIA_BED_ROLE=$SOVIA_BED_ROLE" >&2; exit 2 ;;
esac
if [[ $rc != 0 ]]; then
    echo "FAIL: ib_send_bw (role $SOVIA_BED_ROLE) exited $rc" >&2
    exit 1
fi
echo "PASS: ib_send_bw role $SOVIA_BED_ROLE ($iters x $size B over $dev)"
