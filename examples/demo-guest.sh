#!/usr/bin/env bash
# The demo's part inside the test bed: nc -l and nc, both unmodified and
# preloaded with libsovia, move a file over the rxe device.
set -euo pipefail
LIB=$1 MB=$2
IP=${SOVIA_BED_IP:?run through test/bed/sovia-bed}
DEV=${SOVIA_BED_DEV:-rxe0}
tmp=$(mktemp -d /dev/shm/sovia-demo.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "soft-RoCE device $DEV on $IP:"
ibv_devinfo -d "$DEV" | grep -E "hca_id|state|active_mtu" | sed 's/^/  /'
head -c $((MB * 1024 * 1024)) /dev/urandom >"$tmp/file"
pkts0=$(cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts")
echo
echo "\$ LD_PRELOAD=libsovia.so nc -l $IP 7000 > received &"
echo "\$ LD_PRELOAD=libsovia.so nc -N $IP 7000 < file      # $MB MiB"
SOVIA_STATS=1 LD_PRELOAD=$LIB nc -l "$IP" 7000 >"$tmp/received" 2>"$tmp/server.err" &
srv=$!
for _ in $(seq 300); do ss -ltn "sport = :7000" | grep -q LISTEN && break; sleep 0.1; done
t0=$(date +%s.%N)
SOVIA_STATS=1 LD_PRELOAD=$LIB nc -N "$IP" 7000 <"$tmp/file" 2>"$tmp/client.err"
wait "$srv"
t1=$(date +%s.%N)
pkts1=$(cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts")
echo
if cmp -s "$tmp/file" "$tmp/received"; then
	echo "received $MB MiB, byte-identical ($(md5sum <"$tmp/received" | cut -c1-32))"
else
	echo "DATA DIFFERS"; exit 1
fi
awk -v a="$t0" -v b="$t1" -v mb="$MB" 'BEGIN {printf "time %.1f s (under full CPU emulation: compare ratios, not absolute speeds)\n", b - a}'
echo "RDMA packets sent by $DEV during the transfer: $((pkts1 - pkts0))"
echo
echo "libsovia's statistics for the connection:"
cat "$tmp/client.err" "$tmp/server.err" | grep "libsovia stats" |
	sed -E 's/.*\] ([^ ]+ -> [^ ]+) (client|server) state=([a-z]+) .*rdma_tx_bytes=([0-9]+) rdma_rx_bytes=([0-9]+) tcp_tx_bytes=([0-9]+) tcp_rx_bytes=([0-9]+).*/  \2 \1: state=\3  sent over RDMA \4 B, over TCP \6 B; received over RDMA \5 B, over TCP \7 B/'
