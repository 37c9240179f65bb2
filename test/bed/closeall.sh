#!/usr/bin/env bash
# A daemon's close-all (a close() loop, close_range, closefrom) on a process
# whose connection is on RDMA: libsovia's own descriptors survive it, the
# application's really go (a new file at a freed number is that file), the
# process does not spin, and a second connection still reaches RDMA
# (test/bed/progs/sovia_closeall.c).
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=info
port=5401
for mode in loop range from; do
	rm -f "$WORK"/*.err "$WORK"/*.out
	LD_PRELOAD=$LIB timeout 300 "$BUILD/bin/sovia-closeall" -s $port \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	srv=$!
	wait_port $port
	# No timeout(1) in between: the signal below is for the client itself
	# (the bed's own timeout bounds the run).
	LD_PRELOAD=$LIB "$BUILD/bin/sovia-closeall" -c "$IP" $port $mode \
		>"$WORK/client.out" 2>"$WORK/client.err" &
	cli=$!
	wait_line "$WORK/client.err" "on RDMA" 120 || fail "$mode: the client never reached RDMA"
	wait_line "$WORK/server.err" "on RDMA" 120 || fail "$mode: the server never reached RDMA"
	kill -USR1 $cli
	rc=0
	wait $cli || rc=$?
	[ $rc = 0 ] || fail "$mode: the client failed ($rc): $(cat "$WORK/client.out")"
	wait $srv || fail "$mode: the server failed"
	cat "$WORK/client.out"
	grep -q "closeall $mode: ok" "$WORK/client.out" || fail "$mode: the client did not finish"
	n=$(grep -c "on RDMA" "$WORK/client.err" || true)
	[ "$n" -ge 2 ] || fail "$mode: the second connection did not reach RDMA ($n)"
	grep -q "warning\|error" "$WORK/client.err" && fail "$mode: libsovia complained"
	port=$((port + 1))
done
echo "closeall: OK"
