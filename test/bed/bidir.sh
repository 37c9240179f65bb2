#!/usr/bin/env bash
# Both ends send at once with small windows, and the readers start late:
# both send windows fill completely before anyone reads. The connection must
# still finish, byte-exact, in both directions (credits come back through
# the control reserve). The writers' 64 KiB and 300 KB writes go zero-copy
# (threshold 64 KiB) from one reused buffer, through the registration
# cache.
. "$(dirname "$0")/lib.sh"
export SOVIA_WINDOW=4 SOVIA_BUF_SIZE=4096 SOVIA_REG_THRESHOLD=64k
BYTES=${SOVIA_IT_BIDIR:-20000000}
# The hosts talk once first: the writers then hold their first bytes for
# the QP. (On a first contact the writes go on TCP until the upgrade,
# whose time under emulation varies: one CI run took 2.4 s, the readers
# started at 1.5 s, and TCP carried more than half: first_mb.sh and ftp.sh
# cover first contacts.)
first_contact 5030
# A run takes seconds; one in CI once made no progress for 300 s.
hang_watch 200 sovia-bidir
LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-bidir" -s "$IP" 5031 "$BYTES" -d 1500 \
	>"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5031
LD_PRELOAD=$LIB run_logged "$WORK/client.out" "$WORK/client.err" \
	timeout 300 "$BUILD/bin/sovia-bidir" -c "$IP" 5031 "$BYTES" -d 1500
wait "$srv" || { cat "$WORK/server.err" >&2; fail "server failed"; }
grep -q "OK $BYTES bytes" "$WORK/server.out" || fail "server did not get everything"
cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
for role in client server; do
	assert_rdma_carried "$WORK/stats" $role $((BYTES / 2)) $((BYTES / 2))
	stalls=$(stat_of "$WORK/stats" credit_stalls $role)
	[ "$stalls" -gt 0 ] || fail "$role never ran out of credits: the window was not filled"
	echo "$role: credit_stalls=$stalls"
	zc=$(stat_of "$WORK/stats" zcopy_tx_bytes $role)
	[ "$zc" -gt 0 ] || fail "$role sent nothing zero-copy"
	echo "$role: zcopy_tx_bytes=$zc"
done
echo "bidir: OK"
