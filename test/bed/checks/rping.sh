#!/bin/bash
# In-bed check: rping server and client over rdma_cm on $SOVIA_BED_IP (both
# on the same rxe device), COUNT iterations with payload verification (-V).
# usage: rping.sh [COUNT]
set -euo pipefail
ip=${SOVIA_BED_IP:?SOVIA_BED_IP not set: run me under test/bed/sovia-bed}
count=${1:-5}
dir=$(mktemp -d "${TMPDIR:-/tmp}/bed-rping.XXXXXX")
trap 'kill "${srv:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT

timeout 120 rping -s -a "$ip" -C "$count" -v -V >"$dir/server.log" 2>&1 &
srv=$!
# Start the client only once the server's rdma_cm id is listening.
for _ in $(seq 100); do
    rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN.*comm rping' && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.1
done
crc=0
timeout 120 rping -c -a "$ip" -C "$count" -S 64 -v -V >"$dir/client.log" 2>&1 || crc=$?
src=0
wait "$srv" || src=$?
srv=''
sed 's/^/client: /' "$dir/client.log"
sed 's/^/server: /' "$dir/server.log"
cgot=$(grep -c '^ping data: rdma-ping-' "$dir/client.log" || true)
sgot=$(grep -c '^server ping data: rdma-ping-' "$dir/server.log" || true)
if [[ $crc != 0 || $src != 0 || $cgot != "$count" || $sgot != "$count" ]]; then
    echo "FAIL: rping on $ip: client rc=$crc pings=$cgot, server rc=$src pings=$sgot (want $count)" >&2
    exit 1
fi
echo "PASS: rping $count verified iterations on $ip (${SOVIA_BED_DEV:-?})"
