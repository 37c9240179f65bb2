#!/usr/bin/env bash
# Churn: a preloaded client opens, uses and closes connection after
# connection to a preloaded server (sovia-bench's conn test: connect, a
# header, one byte back, close), 4,000 in all. Past the first thousand,
# the server's file descriptors and RSS do not grow, nor do the device's
# QPs, CQs and MRs (the `rdma resource` counts; the client has exited by
# then, so they are the server's): a connection holds 4 fds, a QP, a CQ
# and an MR while it lives, so a leak of any would show by thousands, and
# the RSS bound (2 MiB over 3,000) shows a leak of 700 bytes each. And
# the connections went over RDMA (the peer is known: each holds its first
# bytes for its QP).
. "$(dirname "$0")/lib.sh"
N=${SOVIA_IT_CHURN:-4000}
FIRST=1000
export SOVIA_STATS=1
LD_PRELOAD=$LIB "$BUILD/bin/sovia-bench" server -b "$IP" -p 5050 >"$WORK/server.out" 2>"$WORK/server.err" &
srv=$!
wait_port 5050
res() { # the device's count of $1 (qp, cq, mr)
	rdma resource show | sed -n "s/.* $1 \([0-9]*\).*/\1/p" | head -1
}
count() { # the server's fds and RSS (KiB), the device's QPs, CQs and MRs:
	# the least of a few looks, so that a connection still closing is not
	# counted
	local i f r q c m fmin=999999 rmin=999999999 qmin=999999 cmin=999999 mmin=999999
	for i in 1 2 3 4 5; do
		f=$(ls "/proc/$srv/fd" | wc -l)
		r=$(awk '/^VmRSS/ {print $2}' "/proc/$srv/status")
		q=$(res qp) c=$(res cq) m=$(res mr)
		[ "$f" -lt "$fmin" ] && fmin=$f
		[ "$r" -lt "$rmin" ] && rmin=$r
		[ "$q" -lt "$qmin" ] && qmin=$q
		[ "$c" -lt "$cmin" ] && cmin=$c
		[ "$m" -lt "$mmin" ] && mmin=$m
		sleep 0.5
	done
	echo "$fmin $rmin $qmin $cmin $mmin"
}
[ -n "$(res qp)" ] && [ -n "$(res mr)" ] || fail "no QP and MR counts from rdma resource show"
client() { # connections
	LD_PRELOAD=$LIB timeout 1200 "$BUILD/bin/sovia-bench" client -H "$IP" -p 5050 -t conn \
		-d 1200 -n "$1" >"$WORK/client.out" 2>"$WORK/client.err" || fail "client failed"
	grep -q "status=ok conns=$1 " "$WORK/client.out" || fail "client: $(cat "$WORK/client.out")"
}
# First contact: a ping-pong long enough to reach RDMA, so that the
# hosts know each other.
LD_PRELOAD=$LIB timeout 120 "$BUILD/bin/sovia-bench" client -H "$IP" -p 5050 -t lat -s 64 -w 1 -d 1 \
	-n 100 >/dev/null 2>"$WORK/warm.err" || fail "first contact failed"
grep -q "client state=rdma" "$WORK/warm.err" || fail "first contact: not on RDMA: $(cat "$WORK/warm.err")"
client "$FIRST"
kill -0 "$srv" 2>/dev/null || fail "the server died"
set -- $(count)
f0=$1 r0=$2 q0=$3 c0=$4 m0=$5
client $((N - FIRST))
kill -0 "$srv" 2>/dev/null || fail "the server died"
set -- $(count)
f1=$1 r1=$2 q1=$3 c1=$4 m1=$5
echo "server after $FIRST connections: fds $f0, RSS $r0 KiB; device: QPs $q0, CQs $c0, MRs $m0"
echo "server after $N connections: fds $f1, RSS $r1 KiB; device: QPs $q1, CQs $c1, MRs $m1"
rdma_n=$(grep -c "libsovia stats.* client state=rdma " "$WORK/client.err" || true)
echo "the client's last $((N - FIRST)) connections: $rdma_n on RDMA"
[ "$f1" -le $((f0 + 2)) ] || fail "the server's fds grew from $f0 to $f1"
[ "$r1" -le $((r0 + 2048)) ] || fail "the server's RSS grew from $r0 to $r1 KiB"
[ "$q1" -le $((q0 + 2)) ] || fail "the device's QPs grew from $q0 to $q1"
[ "$c1" -le $((c0 + 2)) ] || fail "the device's CQs grew from $c0 to $c1"
[ "$m1" -le $((m0 + 2)) ] || fail "the device's MRs grew from $m0 to $m1"
[ $((rdma_n * 100)) -ge $(((N - FIRST) * 99)) ] || fail "only $rdma_n connections on RDMA"
"$BUILD/bin/sovia-bench" client -H "$IP" -p 5050 -t quit >/dev/null 2>&1 || true
echo "churn: OK"
