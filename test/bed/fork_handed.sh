#!/usr/bin/env bash
# A process on RDMA hands its connection to a forked child and lets go of
# its own copy; the child, holding it alone, moves it to RDMA again as a
# stream of its own, from where both directions stand (src/shares.h,
# sv_shares_adopt). The child's first write takes the connection back to
# TCP (its copy claims it) while the parent still holds its own. Run twice:
#  - client: the parent exits (a daemon's start); the server, unmodified
#    nc, is revived by the child's request;
#  - server: an accept-then-fork server whose connection went to RDMA
#    before the fork; the parent closes its copy and keeps listening. Its
#    client, unmodified nc, taken back by the server, asks again; the
#    parent answers "later", then, once the child adopted the connection
#    at its own RDMA listener, redirects the client there;
#  - client with SOVIA_FORK_KEEP=0: the fork takes the connection back to
#    TCP first, and shares it with the child at once (as a claim would);
#    the parent's exit then hands it on as in the first run.
#
# sovia-forkwrite [-l] ... leave: the parent sends 1 MiB, its child 64 KiB,
# the parent lets go, and the child sends 40 MiB more.
# Asserted: nc received the file byte for byte; the parent's stream went
# back to TCP (detached) and handed the connection on; the child's stream
# reached RDMA, and so did the peer's second one; the last part went over
# RDMA by libsovia's statistics at both ends (at least 80%: the child's
# writes go on over TCP until the switch), and rxe sent the packets it
# needs.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
HEAD=$((1 << 20)) CHILD=65536 REST=$((40 << 20))
head -c $((HEAD + CHILD + REST)) /dev/urandom >"$WORK/in"

# run ROLE PORT KEEP: ROLE is the forking process's (client or server),
# KEEP its SOVIA_FORK_KEEP.
run() {
	local role=$1 port=$2 keep=$3 peer fw fwl srv cli
	rm -f "$WORK"/go1 "$WORK"/go2 "$WORK"/out "$WORK"/*.err
	if [ "$role" = client ]; then
		peer=server fw=client.err fwl=
		LD_PRELOAD=$LIB timeout 300 nc -l "$IP" "$port" >"$WORK/out" 2>"$WORK/server.err" &
		srv=$!
		wait_port "$port"
	else
		peer=client fw=server.err fwl=-l
	fi
	SOVIA_FORK_KEEP=$keep LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-forkwrite" $fwl "$IP" "$port" "$HEAD" \
		"$CHILD" "$WORK/go1" "$WORK/go2" leave <"$WORK/in" 2>"$WORK/$fw" &
	local fwp=$!
	if [ "$role" = server ]; then
		wait_port "$port"
		LD_PRELOAD=$LIB timeout 300 nc "$IP" "$port" </dev/null >"$WORK/out" \
			2>"$WORK/client.err" &
		cli=$!
	fi
	wait_line "$WORK/$fw" "on RDMA" 120 || fail "$role: the parent never reached RDMA"
	touch "$WORK/go1"
	wait_line "$WORK/$fw" "handed to the fork's children" 120 ||
		fail "$role: the parent's let-go did not hand the connection on"
	if [ "$role" = server ]; then
		# The child adopts it while it waits; the client, redirected
		# to it, moves with it (its "later" retries back off to 3.2 s).
		for _ in $(seq 600); do
			[ "$(grep -c "on RDMA" "$WORK/server.err")" -ge 2 ] && break
			sleep 0.1
		done
	else
		wait "$fwp" || fail "sovia-forkwrite's parent failed"
	fi
	local p0
	p0=$(rxe_pkts)
	touch "$WORK/go2"
	if [ "$role" = server ]; then
		wait "$fwp" || fail "sovia-forkwrite failed"
		wait "$cli" || fail "nc failed"
	else
		wait "$srv" || fail "nc failed"
	fi
	local pkts=$(($(rxe_pkts) - p0))
	# The child's statistics line comes at its exit, after nc's end.
	for _ in $(seq 100); do
		[ "$(grep -c "libsovia stats.* $role " "$WORK/$fw")" -ge 2 ] && break
		sleep 0.1
	done
	cmp -s "$WORK/in" "$WORK/out" ||
		fail "$role: nc received other bytes ($(stat -c %s "$WORK/out") of $(stat -c %s "$WORK/in"))"

	[ "$keep" = 1 ] || grep -q "plain TCP for the fork; back to RDMA once one process holds it" \
		"$WORK/$fw" || fail "$role: the fork did not share the connection it took back"
	grep -q "no one else holds it: it moves to RDMA again" "$WORK/$fw" ||
		fail "$role: the child did not take the connection over"
	[ "$role" = client ] || grep -q "another process of the server holds it: at its port" \
		"$WORK/client.err" || fail "server: the parent did not redirect the client to its child"
	[ "$(stats_lines "$WORK/$fw" "$role" | wc -l)" -ge 2 ] || fail "$role: fewer than two streams"
	[ "$(stats_lines "$WORK/$peer.err" "$peer" | wc -l)" -ge 2 ] || fail "$peer: fewer than two streams"
	stats_lines "$WORK/$fw" "$role" | head -1 | grep -q " state=detached " ||
		fail "$role: the parent's stream did not go back to TCP"
	local ml pl
	ml=$(stats_lines "$WORK/$fw" "$role" | tail -1)
	pl=$(stats_lines "$WORK/$peer.err" "$peer" | tail -1)
	[ "$(stats_field "$ml" state)" = rdma ] || fail "$role: the child's stream ended $(stats_field "$ml" state)"
	[ "$(stats_field "$pl" state)" = rdma ] || fail "$peer: its second stream ended $(stats_field "$pl" state)"
	local tx rx
	tx=$(stats_field "$ml" rdma_tx_bytes) rx=$(stats_field "$pl" rdma_rx_bytes)
	echo "fork_handed ($role, SOVIA_FORK_KEEP=$keep): the child's stream sent $tx and the $peer's second got $rx bytes" \
		"over RDMA of the last $REST; rxe sent $pkts packets meanwhile"
	[ "$tx" -ge $((REST * 8 / 10)) ] || fail "$role: ${tx} of $REST bytes over RDMA"
	[ "$rx" -ge $((REST * 8 / 10)) ] || fail "$peer: ${rx} of $REST bytes over RDMA"
	[ "$pkts" -ge $((REST * 8 / 10 / 4096)) ] || fail "rxe sent $pkts packets for $REST bytes"
}

run client 5302 1
run server 5304 1
run client 5306 0
echo "fork_handed: OK"
