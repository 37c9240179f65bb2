#!/usr/bin/env bash
# Our own example programs (examples/), preloaded on both ends. They are
# plain socket programs; every one checks every byte it gets (a seeded
# pattern: the servers check the stream, the clients check the echo) and
# exits non-zero on any difference.
#
# 1. epoll: an edge-triggered epoll echo server (non-blocking accepted
#    sockets, EPOLLET, reads until EAGAIN) and CLIENTS concurrent
#    non-blocking clients in one epoll loop. Bytes exact; and the
#    connections stay on RDMA in the epoll sets, carrying the echo after
#    their switch (before preload/ served epoll, epoll_ctl took them back
#    to TCP); one that stays on TCP must have finished on it first. A
#    failure of that medium check is reported after the other cases ran, so
#    they are still checked.
# 2. fork: a forking echo server (the parent accepts, forks, closes its
#    copy; the child echoes), several concurrent clients: bytes only. Then
#    clients one after the other: the parent hands each connection to its
#    child at the fork, and redirects the upgrade request there once it
#    has closed its copy; the echo goes over RDMA (asserted per
#    connection).
# 3. exec: a server that fork+execs cat with the socket as stdin/stdout;
#    several concurrent clients: bytes only, as for fork. Then clients one
#    after the other: the connection handed to the child at the fork is
#    handed on across the exec, and cat (preloaded) carries the echo over
#    RDMA (asserted per connection). Again with sed, whose glibc stdio
#    on the socket libsovia's constructor takes over, and with an stdio
#    echo whose last bytes exit() writes.
# 4. prefork: workers accept on the socket they inherited; the parent
#    redirects each upgrade request to its worker, and the echo goes over
#    RDMA (asserted per connection). Again with sed, whose glibc stdio
#    on the socket libsovia's constructor takes over, and with an stdio
#    echo whose last bytes exit() writes.
# 5. fork and exec again, one connection each, the parent held (SIGUSR1)
#    between accept and fork until the connection is on RDMA and the
#    client's bytes came over the QP: the connection was upgraded before
#    the fork, and goes back to TCP at it with every unread byte given back.
#
# Every wait is for an event ("on RDMA", rxe packets, the programs' exit),
# bounded only against hangs.
. "$(dirname "$0")/lib.sh"
APPS=$BUILD/bin
CLIENTS=${SOVIA_IT_CLIENTS:-4}
BYTES=${SOVIA_IT_ECHO_BYTES:-8000000}
# The epoll case's echo must outlast the upgrades of its concurrent
# connections for any of them to switch (2 MB each did not under TSan).
EPOLL_BYTES=${SOVIA_IT_EPOLL_BYTES:-16000000}
# The held case's client must still be writing when the fork's child
# takes the connection to RDMA again, after TCP carried what it could
# meanwhile (7 MB in a slow run).
HELD_BYTES=${SOVIA_IT_HELD_BYTES:-16000000}
export SOVIA_LOG=${SOVIA_LOG:-info}
LATER=()
later() { echo "FAIL (reported at the end): $*" >&2; LATER+=("$*"); }

epoll_case() {
	local port=5041
	rm -f "$WORK/"*.err
	local p0 t0
	p0=$(rxe_pkts) t0=$(date +%s.%N)
	LD_PRELOAD=$LIB timeout 600 "$APPS/sovia-echo-epoll" -s $port "$CLIENTS" \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port $port
	LD_PRELOAD=$LIB run_logged "$WORK/client.out" "$WORK/client.err" \
		timeout 600 "$APPS/sovia-echo-epoll" -c "$IP" $port "$CLIENTS" "$EPOLL_BYTES"
	wait "$srv" || fail "epoll: the server failed"
	cat "$WORK/server.out"
	grep -q "^OK $CLIENTS connections" "$WORK/server.out" || fail "epoll: the server did not serve everyone"
	printf 'epoll: %d clients x %d bytes echoed exactly in %.1f s\n' "$CLIENTS" "$EPOLL_BYTES" \
		"$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')"

	# The medium: epoll_ctl must not take a stream back to TCP (no
	# connection detached), and every connection that switched carried
	# bytes over RDMA after it. Not every connection switches: writes
	# never wait for the upgrade, and the upgrades of concurrent
	# connections take a few hundred ms under emulation (the helper makes
	# the QPs one after the other), as long as one connection's whole
	# echo on TCP. Such a connection may stay on TCP only for that reason:
	# its client shut down before its QP was up (the server sees its QP
	# called off), or the server had closed it before its request came
	# (the client's request is rejected); and it must have carried all of
	# its bytes on TCP.
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/epoll.stats"
	local role n det rb tb bad rdma_all=0
	for role in server client; do
		n=$(grep -c "libsovia stats.* $role state=rdma " "$WORK/epoll.stats" || true)
		det=$(grep -c "libsovia stats.* $role state=detached " "$WORK/epoll.stats" || true)
		rb=$(stat_of "$WORK/epoll.stats" rdma_tx_bytes $role)
		tb=$(stat_of "$WORK/epoll.stats" tcp_tx_bytes $role)
		rdma_all=$((rdma_all + rb))
		echo "epoll $role: $n of $CLIENTS connections on RDMA at close, $det went back to TCP;" \
			"rdma_tx_bytes=$rb tcp_tx_bytes=$tb;" \
			"fallbacks: $(grep -h "libsovia stats.* $role " "$WORK/epoll.stats" |
				sed -n 's/.* fallback=\([a-z-]*\).*/\1/p' | sort | uniq -c | xargs)"
		[ "$det" -eq 0 ] || later "epoll: $det $role connections went back to TCP"
		[ "$n" -ge 1 ] || later "epoll: no $role connection switched to RDMA"
		bad=$(grep -h "libsovia stats.* $role state=" "$WORK/epoll.stats" |
			awk -v role="$role" -v bytes="$EPOLL_BYTES" '{
				st = fb = ""; rt = rr = tt = 0
				for (i = 1; i <= NF; i++) {
					split($i, kv, "=")
					if (kv[1] == "state") st = kv[2]
					else if (kv[1] == "fallback") fb = kv[2]
					else if (kv[1] == "rdma_tx_bytes") rt = kv[2]
					else if (kv[1] == "rdma_rx_bytes") rr = kv[2]
					else if (kv[1] == "tcp_tx_bytes") tt = kv[2]
				}
				if (st == "rdma") {
					if (rt + rr == 0)
						print "a " role " on RDMA moved nothing over it"
					next
				}
				if (st == "detached")
					next # counted above
				late = role == "client" ? (fb == "shut-down-before-upgrade" || fb == "rejected") \
							: (fb == "called-off-by-peer" || (st == "tcp" && fb == "none"))
				if (!late)
					print "a " role " stayed on TCP: state " st ", fallback " fb
				else if (tt < bytes)
					print "a " role " stayed on TCP (" fb ") after only " tt " bytes on it"
			}')
		[ -z "$bad" ] || later "epoll: $(echo "$bad" | paste -sd ';')"
	done
	local dp=$(($(rxe_pkts) - p0))
	echo "epoll: rxe packets +$dp"
	[ "$dp" -ge $((rdma_all / 4096)) ] || later "epoll: rxe sent only $dp packets for $rdma_all bytes over RDMA"
}

# Concurrent clients of a server that forks at once ($1: program, $2: port).
concurrent_case() {
	local prog=$1 port=$2 name=${1#sovia-}
	if [ -n "${SOVIA_IT_TSAN:-}" ] && [ "$prog" = sovia-echo-fork ]; then
		echo "$name: skipped under TSan (a child that serves its connection starts its helper thread after a threaded fork)"
		return
	fi
	rm -f "$WORK/"*.err
	LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" -s $port "$CLIENTS" \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$! i pids=()
	wait_port $port
	for i in $(seq "$CLIENTS"); do
		LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" -c "$IP" $port $((BYTES / 2)) "$i" \
			>"$WORK/client$i.out" 2>"$WORK/client$i.err" &
		pids+=($!)
	done
	for i in $(seq "$CLIENTS"); do
		wait "${pids[i - 1]}" || fail "$name: client $i failed"
		grep -q "^OK" "$WORK/client$i.out" || fail "$name: client $i did not finish"
	done
	wait "$srv" || fail "$name: the server failed"
	grep -q "^OK $CLIENTS connections" "$WORK/server.out" || fail "$name: the server did not serve everyone"
	echo "$name: $CLIENTS concurrent clients x $((BYTES / 2)) bytes echoed exactly"
}

# Servers of several processes, clients one after the other, each served
# over RDMA in the process that holds its connection, both ways, from its
# switch on; the port's owner redirects each upgrade request there. (What
# went on TCP before the switch is the fresh client process's rdma_cm
# start-up: its share is printed, not judged. Each client pauses after
# its first 64 KiB until it is on RDMA, so that it cannot finish on TCP
# first.)
# - prefork (nginx's model): 2 workers accept on the listening socket they
#   inherited; the parent keeps it and owns the port's RDMA listener.
# - fork (inetd's and PostgreSQL's model): the parent accepts, forks and
#   closes its copy; each connection is handed to the child at the fork.
# - exec (inetd's): as fork, and the child puts the connection on its
#   stdin and stdout and execs cat (exec-sed: sed; exec-stdio: an fread and
#   fwrite echo that leaves its last bytes to exit()), which continues it.
# $1: prefork|fork|exec|exec-sed|exec-stdio. Under TSan they skip themselves: the child's helper
# thread is a thread started after a threaded fork.
many_process_case() {
	local name=$1 port n=4 i holder mode
	if [ -n "${SOVIA_IT_TSAN:-}" ]; then
		echo "$name: skipped under TSan (a child's helper thread after a threaded fork)"
		return
	fi
	local prog=sovia-echo-fork
	case $name in
	prefork) port=5046 holder=worker mode=(-p 2) ;;
	fork) port=5047 holder=child mode=(-s) ;;
	exec) port=5048 holder=cat mode=(-s) prog=sovia-execcat ;;
	exec-sed) port=5049 holder=sed mode=(-s) prog=sovia-execcat ;;
	exec-stdio) port=5050 holder=execcat-e mode=(-s) prog=sovia-execcat ;;
	esac
	local -x EXECCAT_PROG=""
	[ "$name" = exec-sed ] && EXECCAT_PROG="sed -n p"
	[ "$name" = exec-stdio ] && EXECCAT_PROG="$APPS/sovia-execcat -e"
	rm -f "$WORK/"*.err
	LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" "${mode[@]}" $port $n \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port $port
	for i in $(seq $n); do
		# The client sends its first 64 KiB and goes on only once its
		# connection is on RDMA: the rest cannot all pass on TCP while
		# the holder starts up (an exec'd program's rdma_cm takes
		# seconds under emulation), so the medium is asserted whatever
		# the machine's speed.
		rm -f "$WORK/go"
		LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" -c "$IP" $port $((BYTES / 4)) "$i" \
			"$WORK/go" >"$WORK/client$i.out" 2>"$WORK/client$i.err" &
		local cli=$!
		wait_line "$WORK/client$i.err" ": on RDMA" 300 ||
			{ cat "$WORK/client$i.err" >&2; fail "$name: client $i never went on RDMA"; }
		touch "$WORK/go"
		wait "$cli" || { cat "$WORK/client$i.err" >&2; fail "$name: client $i failed"; }
		cat "$WORK/client$i.out"
		grep -q "^OK" "$WORK/client$i.out" || fail "$name: client $i did not finish"
		grep -q "another process of the server holds it" "$WORK/client$i.err" ||
			fail "$name: client $i was not redirected to its $holder"
		[ "$(state_of "$WORK/client$i.err" client)" = rdma ] ||
			fail "$name: client $i did not end on RDMA: $(grep "libsovia stats" "$WORK/client$i.err" | cut -c1-300)"
		local rt rr tt
		rt=$(stat_of "$WORK/client$i.err" rdma_tx_bytes client)
		rr=$(stat_of "$WORK/client$i.err" rdma_rx_bytes client)
		tt=$(stat_of "$WORK/client$i.err" tcp_tx_bytes client)
		[ "$rt" -gt 0 ] && [ "$rr" -gt 0 ] ||
			fail "$name: client $i moved nothing over RDMA one way (sent $rt, received $rr)"
		echo "$name: client $i: rdma_tx_bytes=$rt rdma_rx_bytes=$rr tcp_tx_bytes=$tt" \
			"($((rt * 100 / (rt + tt)))% of its bytes over RDMA)"
	done
	wait "$srv" || fail "$name: the server failed"
	grep -q "^OK $n connections" "$WORK/server.out" || fail "$name: the server did not serve everyone"
	local on_rdma handed pid
	if [ "${name%-*}" = exec ]; then
		# cat closes its stderr before it exits (gnulib's close_stdout):
		# no statistics line; each cat that continued the connection
		# says when it is on RDMA.
		on_rdma=0
		for pid in $(sed -n 's/^libsovia\[\([0-9]*\)\]: info: fd 0: continued after the exec.*/\1/p' "$WORK/server.err"); do
			grep -q "^libsovia\[$pid\]: info: fd [0-9]*: on RDMA" "$WORK/server.err" &&
				on_rdma=$((on_rdma + 1))
		done
	else
		on_rdma=$(grep -c "libsovia stats.* server state=rdma " "$WORK/server.err" || true)
	fi
	[ "$on_rdma" -eq $n ] || fail "$name: $on_rdma of $n connections on RDMA at the ${holder}s"
	if [ "$name" != prefork ]; then
		handed=$(grep -c "handed to the fork's child before its upgrade" "$WORK/server.err" || true)
		[ "$handed" -eq $n ] || fail "$name: $handed of $n connections handed to a child"
	fi
	if [ "${name%-*}" = exec ]; then
		local went
		went=$(grep -c "continued after the exec" "$WORK/server.err" || true)
		[ "$went" -eq $n ] || fail "$name: $went of $n connections continued by $holder"
	elif [ "$name" = prefork ]; then
		echo "prefork: workers not ready for their first connection: $(grep -c "RDMA is not ready" "$WORK/server.err" || true)"
	fi
	echo "$name: $n clients x $((BYTES / 4)) bytes echoed exactly, each on RDMA in its $holder"
}

# One connection, the server held between accept and fork until it is on
# RDMA and the client's bytes came over the QP ($1: program, $2: port). The
# server serves two connections, so its listening socket (whose RDMA
# listener the client asks again) stays open while the first is served; a
# short second client ends it.
held_case() {
	local prog=$1 port=$2 name=${1#sovia-}
	if [ -n "${SOVIA_IT_TSAN:-}" ] && [ "$prog" = sovia-echo-fork ]; then
		echo "$name held: skipped under TSan (the child that serves it starts its helper thread after a threaded fork)"
		return 0
	fi
	rm -f "$WORK/"*.err
	LD_PRELOAD=$LIB "$APPS/$prog" -s -S $port 2 >"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port $port
	local p0
	p0=$(rxe_pkts)
	LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" -c "$IP" $port "$HELD_BYTES" 99 \
		>"$WORK/client.out" 2>"$WORK/client.err" &
	local cli=$!
	wait_line "$WORK/server.err" ": on RDMA" 120 || fail "$name held: the connection never went on RDMA"
	# The client fills the held server's window (32 x 32 KiB: hundreds of
	# packets; the upgrade itself sends about a dozen).
	wait_rxe 100 "$p0" || fail "$name held: no RDMA traffic after the upgrade"
	kill -USR1 "$srv"
	wait "$cli" || fail "$name held: the client failed"
	grep -q "^OK" "$WORK/client.out" || fail "$name held: the client did not finish"
	# The child's statistics come at its exit, after the client's end.
	for _ in $(seq 100); do
		[ "$(stats_lines "$WORK/server.err" server | wc -l)" -ge 2 ] && break
		sleep 0.1
	done
	cat "$WORK/server.err" "$WORK/client.err" >"$WORK/stats"
	LD_PRELOAD=$LIB timeout 600 "$APPS/$prog" -c "$IP" $port 100000 98 \
		>"$WORK/client2.out" 2>"$WORK/client2.log" &
	local cli2=$!
	kill -USR1 "$srv" # taken once the second client is accepted
	wait "$cli2" || fail "$name held: the second client failed"
	wait "$srv" || fail "$name held: the server failed"
	# On RDMA first, then back to TCP at the fork, in that order.
	local on det
	on=$(grep -n ": on RDMA" "$WORK/server.err" | head -1 | cut -d: -f1)
	det=$(grep -n "libsovia stats \[detach\].* server " "$WORK/server.err" | head -1 | cut -d: -f1)
	[ -n "$det" ] || fail "$name held: the server never went back to TCP"
	[ "$on" -lt "$det" ] || fail "$name held: the server was not on RDMA before the fork"
	local rdma back gotback
	rdma=$(stat_of "$WORK/stats" rdma_tx_bytes client)
	back=$(stat_of "$WORK/stats" gave_back_bytes server)
	gotback=$(stat_of "$WORK/stats" got_back_bytes client)
	[ "$rdma" -gt 0 ] || fail "$name held: nothing went over RDMA before the fork"
	[ "$back" -gt 0 ] && [ "$back" = "$gotback" ] || fail "$name held: gave back $back, got back $gotback"
	echo "$name held: $HELD_BYTES bytes echoed exactly; on RDMA before the fork" \
		"(client rdma_tx_bytes=$rdma), $back bytes given back at the fork"
	# Once the parent closed its copy the child holds it alone (the
	# fork handed it over, src/stream_back.c, or a fork that kept it on
	# the QP handed it as the parent let go, src/stream_keep.c): the
	# client, sent on to the child, and the child move it to RDMA again.
	# execcat's child execs cat, which continues a connection handed at
	# the fork but not one handed as the parent let go: told, not
	# asserted.
	local cl
	cl=$(stats_lines "$WORK/stats" server | { grep " state=rdma " || true; } | tail -1)
	echo "$name held: the child's stream echoed $(stats_field "${cl:-none}" rdma_tx_bytes)" \
		"bytes over RDMA after the fork"
	[ "$prog" = sovia-echo-fork ] || return 0
	grep -q "another process of the server holds it: at its port" "$WORK/client.err" ||
		fail "$name held: the client was not sent on to the child"
	[ -n "$cl" ] || fail "$name held: the child did not move the connection to RDMA again"
	# How much of the echo is left once the child is on RDMA again
	# depends on how fast TCP carried it meanwhile (the parent lets go of
	# its copy when it likes): any byte proves the medium, the byte count
	# would only time the machine.
	[ "$(stats_field "$cl" rdma_tx_bytes)" -gt 0 ] ||
		fail "$name held: the child echoed nothing over RDMA"
}

epoll_case
concurrent_case sovia-echo-fork 5042
concurrent_case sovia-execcat 5043
many_process_case prefork
many_process_case fork
many_process_case exec
many_process_case exec-sed
many_process_case exec-stdio
held_case sovia-echo-fork 5044
held_case sovia-execcat 5045
if [ ${#LATER[@]} -gt 0 ]; then
	echo "--- the epoll case's statistics:" >&2
	grep -h "libsovia stats" "$WORK/epoll.stats" | cut -c1-300 >&2 || true
	fail "$(printf '%s; ' "${LATER[@]}")"
fi
echo "examples: OK"
