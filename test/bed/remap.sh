#!/usr/bin/env bash
# The registration cache never sends stale pages: the client sends 1 MiB
# rounds zero-copy from one address whose pages it replaces between rounds
# (munmap + mmap MAP_FIXED, MADV_DONTNEED, through raw system calls that no
# interposer sees). The server checks every byte of every round; the
# client's counters must show zero-copy sends and that the cache noticed
# the replaced pages (stale > 0), not merely that nothing went wrong.
. "$(dirname "$0")/lib.sh"
export SOVIA_REG_THRESHOLD=64k SOVIA_LOG=${SOVIA_LOG:-info}
ROUNDS=40
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-remap" -s 5041 $ROUNDS \
	>"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5041
LD_PRELOAD=$LIB "$BUILD/bin/sovia-remap" -c "$IP" 5041 $ROUNDS \
	>"$WORK/client.out" 2>"$WORK/client.err" &
cli=$!
# The rounds start once the connection is on RDMA (else they would all go
# over TCP while the upgrade is under way).
wait_line "$WORK/client.err" ": on RDMA" 120 || fail "the connection never went on RDMA"
kill -USR1 "$cli"
wait "$cli" || fail "client failed"
wait "$srv" || fail "server failed: the bytes differ"
cat "$WORK/server.out"
grep -q "OK $ROUNDS rounds" "$WORK/server.out" || fail "server did not check every round"
zc=$(stat_of "$WORK/client.err" zcopy_tx_bytes client)
[ "$zc" -gt 0 ] || fail "nothing went zero-copy (the upgrade may have come after the rounds)"
line=$(grep -h "libsovia stats" "$WORK/client.err" | grep " client " | head -1)
stale=$(sed -n 's/.*regcache=[^ ]*stale:\([0-9]*\).*/\1/p' <<<"$line")
unc=$(sed -n 's/.*regcache=[^ ]*uncached:\([0-9]*\).*/\1/p' <<<"$line")
echo "client: zcopy_tx_bytes=$zc regcache: ${line##*regcache=}"
# In the guest we are root: page frame numbers are visible, so the cache
# caches and must have seen the replaced pages.
[ "${stale:-0}" -gt 0 ] || fail "the cache never found a stale entry (stale=$stale uncached=$unc)"
echo "remap: OK"
