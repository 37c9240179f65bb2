#!/usr/bin/env bash
# "Readable" means a read finds data, also while a connection switches to
# RDMA under an application that waits in select, poll or epoll while other
# connections stream (test/bed/progs/sovia_ready.c): the peer's switch puts its
# challenge echo on TCP, bytes the kernel calls readable but that are
# libsovia's. iperf3 hung on exactly that (its control connection); the
# race is narrow, so this is a check of the rule under load, and iperf3.sh
# is the program that showed it.
#
# Most connections must reach RDMA, so the waits really spanned switches
# (the first may not: its server closes before the first upgrade request,
# which sets up the device, arrives).
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
# One run: the server, then `client` (a build of progs/sovia_ready.c) with N
# connections; files are named with `tag`. Most must reach RDMA.
ready_run() { # port n client tag
	local port=$1 n=$2 client=$3 tag=$4 srv on
	LD_PRELOAD=$LIB "$BUILD/bin/sovia-ready" -s "$port" "$n" >"$WORK/$tag-server.out" \
		2>"$WORK/$tag-server.err" &
	srv=$!
	wait_port "$port"
	LD_PRELOAD=$LIB run_logged "$WORK/$tag-client.out" "$WORK/$tag-client.err" \
		timeout 600 "$BUILD/bin/$client" -c "$IP" "$port" "$n"
	wait $srv || fail "$tag: the server failed"
	cat "$WORK/$tag-server.out" "$WORK/$tag-client.out"
	# The client's four busy connections log "on RDMA" as well.
	on=$(($(grep -c "on RDMA" "$WORK/$tag-client.err" || true) - 4))
	[ "$on" -ge $((n / 2)) ] || fail "$tag: only $on of $n client connections reached RDMA"
	echo "ready: $tag OK ($n connections, $on on RDMA, switched while their client waited)"
}
ready_run 5082 "${SOVIA_IT_READY_N:-30}" sovia-ready plain

# The same client built with _FORTIFY_SOURCE, as Debian's packages are: its
# poll is __poll_chk, which must see what waits on the QP as poll does.
nm -D "$BUILD/bin/sovia-ready-fortified" | grep -q "U __poll_chk" ||
	fail "sovia-ready-fortified does not call __poll_chk"
ready_run 5084 "${SOVIA_IT_READY_FORTIFIED_N:-8}" sovia-ready-fortified fortified

# A server that closes while its connection switches: the client must read
# the answer and then EOF, not a reset (the close used to leave the client's
# challenge echo unread, and the kernel answered with RST). The server's
# close time sweeps 0-60 ms after its answer, across the switch; the sweep
# must reach it (connections that end on RDMA), or the race went untested.
CPORT=5083
CN=${SOVIA_IT_CLOSERACE_N:-120}
LD_PRELOAD=$LIB "$BUILD/bin/sovia-ready" -S $CPORT "$CN" 500 \
	>"$WORK/cr-server.out" 2>"$WORK/cr-server.err" &
crs=$!
wait_port $CPORT
LD_PRELOAD=$LIB run_logged "$WORK/cr-client.out" "$WORK/cr-client.err" \
	timeout 600 "$BUILD/bin/sovia-ready" -C "$IP" $CPORT "$CN"
wait $crs || fail "the close-race server failed"
cat "$WORK/cr-server.out"
rdma=$(grep "libsovia stats" "$WORK/cr-server.err" | grep -c " server state=rdma" || true)
mid=$(grep -c "closed while switching" "$WORK/cr-server.err" || true)
[ "$rdma" -ge 1 ] || fail "no close-race connection reached RDMA: the sweep never met the switch"
echo "ready: close race OK ($CN connections, $rdma ended on RDMA, $mid closed by the server mid-switch)"
