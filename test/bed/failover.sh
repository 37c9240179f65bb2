#!/usr/bin/env bash
# The RDMA device goes away in the middle of a transfer: unmodified nc,
# preloaded on both ends, in each direction, for each fault:
#   delete   `rdma link delete` of the rxe device (added back afterwards);
#   down     `ip link set down` of the netdev under it for 3 s.
# The transfer must finish byte-identical with both nc exiting 0, its first
# part over RDMA (rxe counted it) and the rest over TCP; both ends' statistics
# name the failover's cause, and nothing was lost.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=${SOVIA_LOG:-info}
SIZE=${SOVIA_IT_SIZE:-41943040}
NETDEV=${SOVIA_BED_NETDEV:-veth0}
head -c "$SIZE" /dev/urandom >"$WORK/in"
want=$(md5sum <"$WORK/in" | cut -d' ' -f1)

rxe_up() {
	rdma link show "$DEV/1" >/dev/null 2>&1 && return 0
	rdma link add "$DEV" type rxe netdev "$NETDEV" || fail "cannot add $DEV back"
	for _ in $(seq 100); do
		rdma link show "$DEV/1" 2>/dev/null | grep -q ACTIVE && return 0
		sleep 0.1
	done
	fail "$DEV is not active again"
}

fault() { # delete | down
	case $1 in
	delete) timeout 60 rdma link delete "$DEV" || fail "rdma link delete $DEV failed" ;;
	down)
		ip link set "$NETDEV" down
		sleep 3
		ip link set "$NETDEV" up
		;;
	esac
}

case_run() { # fault dir port
	local f=$1 dir=$2 port=$3
	rxe_up
	rm -f "$WORK/out" "$WORK/"*.err
	local pkts0
	pkts0=$(rxe_pkts)
	if [ "$dir" = up ]; then
		LD_PRELOAD=$LIB timeout 600 nc -l "$IP" "$port" >"$WORK/out" 2>"$WORK/server.err" &
	else
		gated "$WORK/server.err" | LD_PRELOAD=$LIB timeout 600 nc -N -l "$IP" "$port" \
			2>"$WORK/server.err" &
	fi
	local srv=$!
	wait_port "$port"
	if [ "$dir" = up ]; then
		gated "$WORK/client.err" | LD_PRELOAD=$LIB timeout 600 nc -N "$IP" "$port" \
			2>"$WORK/client.err" &
	else
		LD_PRELOAD=$LIB timeout 600 nc "$IP" "$port" </dev/null >"$WORK/out" \
			2>"$WORK/client.err" &
	fi
	local cli=$!
	# Some 8 MB over the QP (RoCE packets carry at most 4 KiB), then the fault.
	wait_rxe 2048 "$pkts0" 60 || fail "$f $dir: the transfer never got going on RDMA"
	local crossed=$(($(rxe_pkts) - pkts0))
	fault "$f"
	wait "$cli" || fail "$f $dir: client nc failed"
	wait "$srv" || fail "$f $dir: server nc failed"
	local got
	got=$(md5sum <"$WORK/out" | cut -d' ' -f1)
	[ "$got" = "$want" ] || fail "$f $dir: data differs ($(stat -c %s "$WORK/out") of $SIZE bytes)"
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	local sender=client receiver=server
	[ "$dir" = down ] && sender=server receiver=client
	local rb tb fs fr
	rb=$(stat_of "$WORK/stats" rdma_tx_bytes "$sender")
	tb=$(stat_of "$WORK/stats" tcp_tx_bytes "$sender")
	# The first part over RDMA, the rest (what followed the fault) over TCP.
	[ "$rb" -ge $((4 * 1048576)) ] || fail "$f $dir: only $rb bytes went over RDMA"
	[ "$tb" -ge $((SIZE / 4)) ] || fail "$f $dir: only $tb bytes went over TCP after the fault"
	fs=$(grep -h "libsovia stats" "$WORK/stats" | grep " $sender " |
		sed -n 's/.* failover=\([a-z-]*\).*/\1/p' | head -1)
	fr=$(grep -h "libsovia stats" "$WORK/stats" | grep " $receiver " |
		sed -n 's/.* failover=\([a-z-]*\).*/\1/p' | head -1)
	[ -n "$fs" ] && [ "$fs" != none ] || fail "$f $dir: the sender's statistics name no failover"
	[ -n "$fr" ] && [ "$fr" != none ] || fail "$f $dir: the receiver's statistics name no failover"
	grep -q "resumed over TCP" "$WORK/stats" || fail "$f $dir: nobody logged the resume"
	printf '%s %s: %d bytes identical; rxe packets before the fault %d; %s sent %d over RDMA, %d over TCP; failover %s/%s\n' \
		"$f" "$dir" "$SIZE" "$crossed" "$sender" "$rb" "$tb" "$fs" "$fr"
	echo "FAILOVER_RESULT fault=$f dir=$dir ok"
}

# FAULT:DIRECTION pairs. Down and up again, rxe's connection manager in a
# guest may not connect new QPs for a while: a case after a "down" runs in
# a guest of its own (bed.failover_down).
port=5101
for c in ${SOVIA_FAILOVER_CASES:-delete:up delete:down down:up}; do
	case_run "${c%%:*}" "${c##*:}" $port
	port=$((port + 1))
done
echo "failover: OK"
