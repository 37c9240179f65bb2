#!/usr/bin/env bash
# A server that forks while its clients are connected: redis-server's
# BGSAVE forks a child that writes the snapshot and leaves by _exit,
# never using the client connections it inherited. Where the kernel
# copies pinned pages at a fork (libibverbs: IBV_FORK_UNNEEDED), the
# parent's connections stay on RDMA through it (src/shares.h); with
# SOVIA_FORK_KEEP=0 every fork takes them back to TCP first, as before.
# Both run here, one after the other, for the comparison.
#
# Each run: one redis-cli session, both ends preloaded. It SETs until its
# connection is on RDMA, asks BGSAVE on that connection, waits until the
# snapshot is written (redis counts the save: its child is gone), then
# SETs and GETs 100 values of 16 KiB each; the answers are compared.
# Asserted with the fork keeping the QP: the snapshot succeeded, every
# answer right, the server's end of the session still on RDMA at its
# close with no switch back to TCP, at least 90% of its bytes each way
# over RDMA by libsovia's statistics, and rxe's packet counter as high as
# the values need (the medium counted outside libsovia). The run without
# shows what the fork cost before (its share is printed, and must be
# lower).
. "$(dirname "$0")/lib.sh"
command -v redis-server >/dev/null || fail "redis-server is not installed (test/setup-deps.sh)"
export SOVIA_LOG=info
N=100
VAL=$(head -c 16384 /dev/zero | tr '\0' v)
PAYLOAD=$((N * 16384))

# The server-side statistics line of the session: the connection that
# received the most.
session_line() {
	grep -h "libsovia stats.* server " "$1" | awk '{
		rx = 0
		for (i = 1; i <= NF; i++)
			if ($i ~ /^(rdma|tcp)_rx_bytes=/) { split($i, kv, "="); rx += kv[2] }
		if (rx > best) { best = rx; line = $0 }
	} END { print line }'
}
field() { sed -n "s/.* $2=\([0-9a-z-]*\).*/\1/p" <<<"$1"; }

run() { # keep port
	local keep=$1 port=$2 tag=keep$1
	SOVIA_FORK_KEEP=$keep LD_PRELOAD="$LIB" redis-server --port "$port" --bind "$IP" \
		--protected-mode no --save '' --appendonly no --dir "$WORK" \
		--dbfilename "dump-$tag.rdb" --loglevel notice \
		>"$WORK/server-$tag.log" 2>"$WORK/server-$tag.err" &
	local srv=$!
	wait_port "$port"
	local p0
	p0=$(rxe_pkts)
	{
		echo "SET warm 1"
		wait_line "$WORK/cli-$tag.err" "on RDMA" 120 || echo "never on RDMA" >&2
		echo "BGSAVE"
		# The snapshot's child is gone once redis counts the save.
		for _ in $(seq 600); do
			redis-cli -h "$IP" -p "$port" info persistence 2>/dev/null | tr -d '\r' |
				grep -q '^rdb_saves:1$' && break
			sleep 0.2
		done
		for i in $(seq $N); do echo "SET k$i $VAL"; done
		for i in $(seq $N); do echo "GET k$i"; done
	} | SOVIA_FORK_KEEP=$keep LD_PRELOAD="$LIB" redis-cli -h "$IP" -p "$port" \
		>"$WORK/cli-$tag.out" 2>"$WORK/cli-$tag.err" || fail "$tag: redis-cli failed"
	PKTS=$(($(rxe_pkts) - p0))
	local status
	status=$(redis-cli -h "$IP" -p "$port" info persistence | tr -d '\r' |
		sed -n 's/^rdb_last_bgsave_status://p')
	redis-cli -h "$IP" -p "$port" shutdown nosave >/dev/null 2>&1 || true
	wait $srv 2>/dev/null || true
	[ "$status" = ok ] || fail "$tag: the snapshot failed ($status)"
	[ -s "$WORK/dump-$tag.rdb" ] || fail "$tag: no snapshot file"
	grep -q "Background saving started" "$WORK/server-$tag.log" ||
		fail "$tag: redis never forked for the snapshot"
	[ "$(grep -c "^$VAL\$" "$WORK/cli-$tag.out")" = $N ] ||
		fail "$tag: $(grep -c "^$VAL\$" "$WORK/cli-$tag.out") of $N answers right"
	local line
	line=$(session_line "$WORK/server-$tag.err")
	[ -n "$line" ] || fail "$tag: no statistics of the session's server end"
	STATE=$(field "$line" state)
	GAVE=$(field "$line" gave_back_bytes)
	TO_TCP=$(sed -n 's/.*switches=to_rdma:[0-9]*,to_tcp:\([0-9]*\).*/\1/p' <<<"$line")
	RX_R=$(field "$line" rdma_rx_bytes) RX_T=$(field "$line" tcp_rx_bytes)
	TX_R=$(field "$line" rdma_tx_bytes) TX_T=$(field "$line" tcp_tx_bytes)
	# A connection that went back to TCP prints its statistics then, and
	# counts nothing after: the shares are of at least the values' bytes.
	local rx_all=$((RX_R + RX_T)) tx_all=$((TX_R + TX_T))
	[ $rx_all -ge $PAYLOAD ] || rx_all=$PAYLOAD
	[ $tx_all -ge $PAYLOAD ] || tx_all=$PAYLOAD
	RX_PCT=$((RX_R * 100 / rx_all)) TX_PCT=$((TX_R * 100 / tx_all))
	echo "redis_fork: SOVIA_FORK_KEEP=$keep: server end state=$STATE to_tcp=${TO_TCP:-?} gave_back=${GAVE:-?};" \
		"requests ${RX_PCT}% over RDMA ($RX_R of $rx_all bytes)," \
		"answers ${TX_PCT}% ($TX_R of $tx_all); rxe sent $PKTS packets"
}

note "BGSAVE with a client connected, the fork keeping the QP"
run 1 6393
KEEP_STATE=$STATE KEEP_RX=$RX_PCT KEEP_TX=$TX_PCT KEEP_TO_TCP=${TO_TCP:-?} KEEP_PKTS=$PKTS
note "the same, every fork taking the connections back to TCP first"
run 0 6394
OLD_RX=$RX_PCT OLD_TX=$TX_PCT

[ "$KEEP_STATE" = rdma ] || fail "the session's server end ended $KEEP_STATE, not rdma"
[ "$KEEP_TO_TCP" = 0 ] || fail "the connection went back to TCP ($KEEP_TO_TCP times)"
[ "$KEEP_RX" -ge 90 ] || fail "requests after the fork: ${KEEP_RX}% over RDMA, want 90%"
[ "$KEEP_TX" -ge 90 ] || fail "answers after the fork: ${KEEP_TX}% over RDMA, want 90%"
# The medium counted outside libsovia: the values both ways over rxe, in
# packets of at most 4 KiB.
[ "$KEEP_PKTS" -ge $((2 * PAYLOAD / 4096)) ] ||
	fail "rxe sent $KEEP_PKTS packets for $((2 * PAYLOAD)) bytes of values"
[ "$OLD_RX" -lt "$KEEP_RX" ] ||
	fail "without keeping, requests were ${OLD_RX}% over RDMA: the test does not see the fork"
echo "redis_fork: OK (requests ${KEEP_RX}% / answers ${KEEP_TX}% over RDMA," \
	"against ${OLD_RX}% / ${OLD_TX}% when the fork goes back to TCP)"
