#!/usr/bin/env bash
# What a user installs, runs and watches, over soft-RoCE: the installed
# package (host.package put it in place), not the build tree.
#
# 1. The public API: the example built with `pkg-config --cflags --libs
#    libsovia` against /usr/include/sovia.h asks about its own connection.
#    Under the installed sovia-run both ends say RDMA; run plainly, they
#    are told nothing is accelerated.
# 2. sovia-stat shows the right state:
#    - nc moving 64 MiB, then holding the connection open: both ends on
#      RDMA each way, and each end's bytes over RDMA and TCP add up to
#      the 64 MiB (rxe's own counter saw them go);
#    - a redis server with four clients: its four connections on RDMA;
#    - a client of a plain nc server: on TCP, fallback "rejected";
#    and its --json parses (jq reads every answer).
. "$(dirname "$0")/lib.sh"
command -v sovia-run >/dev/null && command -v sovia-stat >/dev/null ||
	fail "libsovia's package is not installed (host.package installs it)"
command -v redis-server >/dev/null || fail "redis-server is not installed (test/setup-deps.sh)"
version=$(pkg-config --modversion libsovia)
unset SOVIA_STATS

pids=()
cleanup() {
	kill "${pids[@]}" 2>/dev/null || true
	for f in "$WORK"/hold*; do
		[ -p "$f" ] && timeout 2 sh -c ": >'$f'" || true
	done
}
trap 'cleanup; kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK" /dev/shm/libsovia-peers.*' EXIT

# ---- 1. The API --------------------------------------------------------------
mkdir "$WORK/ask"
cp "$(dirname "$0")/../../examples/sovia_ask.c" "$WORK/ask/"
# shellcheck disable=SC2046
cc -o "$WORK/ask/sovia-ask" "$WORK/ask/sovia_ask.c" $(pkg-config --cflags --libs libsovia) ||
	fail "the example does not build against the installed header"
ask_pair() { # PORT RUNNER...
	local port=$1
	shift
	"$@" "$WORK/ask/sovia-ask" server "$port" "$IP" >"$WORK/ask/server.out" 2>"$WORK/ask-server.err" &
	local srv=$!
	wait_port "$port"
	"$@" "$WORK/ask/sovia-ask" client "$IP" "$port" 256 >"$WORK/ask/client.out" \
		2>"$WORK/ask-client.err" || fail "sovia-ask client failed"
	wait "$srv" || fail "sovia-ask server failed"
	cat "$WORK/ask/client.out" "$WORK/ask/server.out"
}
out=$(ask_pair 5951 env)
echo "$out"
grep -qx "client: not accelerated (libsovia is not loaded)" <<<"$out" || fail "plain client: $out"
grep -qx "server: not accelerated (libsovia is not loaded)" <<<"$out" || fail "plain server: $out"
out=$(ask_pair 5952 sovia-run)
echo "$out"
grep -q "^client: libsovia $version managed=1 tx=rdma rx=rdma state=rdma fallback=none rdma_tx_bytes=[1-9]" \
	<<<"$out" || fail "preloaded client: $out"
grep -q "^server: libsovia $version managed=1 tx=rdma rx=rdma state=rdma fallback=none .*rdma_rx_bytes=[1-9]" \
	<<<"$out" || fail "preloaded server: $out"

# ---- sovia-stat ------------------------------------------------------------------
# The connections sovia-stat -p lists, one JSON object per line.
conns() { # PID
	local out
	out=$(sovia-stat -p "$1" --json) || fail "sovia-stat -p $1 failed"
	jq -c '.connections[]' <<<"$out" || fail "sovia-stat's JSON does not parse: $out"
}
# Wait (at most $2 s: a deadline, since one look takes long under emulation)
# until the jq filter $1 holds for sovia-stat's whole answer, left in
# $WORK/view. Not in a command substitution: its fail must end the test.
wait_view() {
	local end=$((SECONDS + $2)) out
	while :; do
		out=$(sovia-stat --json) || fail "sovia-stat failed"
		if jq -e "$1" <<<"$out" >/dev/null 2>&1; then
			echo "$out" >"$WORK/view"
			return
		fi
		[ $SECONDS -lt $end ] || break
		# Now and then, where the connections are (fd, state, bytes each way).
		[ $((SECONDS % 30)) -gt 0 ] || jq -c '[.connections[] | [.fd, .state,
			.rdma_tx_bytes + .tcp_tx_bytes, .rdma_rx_bytes + .tcp_rx_bytes]]' <<<"$out" >&2 || true
		sleep 1
	done
	echo "$out" >&2
	fail "sovia-stat never showed: $1"
}
# ---- 2a. nc moving 64 MiB, then holding on ---------------------------------
SIZE=67108864
mkfifo "$WORK/hold-nc"
sovia-run nc -l "$IP" 5953 >/dev/null 2>"$WORK/nc-server.err" &
pids+=($!)
wait_port 5953
p0=$(rxe_pkts)
{ head -c $SIZE /dev/zero; cat "$WORK/hold-nc"; } | sovia-run nc "$IP" 5953 2>"$WORK/nc-client.err" &
pids+=($!)
sel='([.connections[] | select(.peer | endswith(":5953")) | select(.tcp_tx_bytes + .rdma_tx_bytes == '$SIZE')] | length == 1)'
sel="$sel"' and ([.connections[] | select(.local | endswith(":5953")) | select(.tcp_rx_bytes + .rdma_rx_bytes == '$SIZE')] | length == 1)'
wait_view "$sel" 300
view=$(cat "$WORK/view")
cli=$(jq -c '.connections[] | select(.peer | endswith(":5953"))' <<<"$view")
srv=$(jq -c '.connections[] | select(.local | endswith(":5953"))' <<<"$view")
echo "nc client: $cli"
echo "nc server: $srv"
for c in "$cli" "$srv"; do
	[ "$(jq -r '.tx + "/" + .rx + "/" + .state + "/" + .fallback' <<<"$c")" = rdma/rdma/rdma/none ] ||
		fail "nc: not on RDMA both ways: $c"
done
[ "$(jq -r .role <<<"$cli")/$(jq -r .role <<<"$srv")" = client/server ] || fail "nc: roles"
[ "$(jq -r .comm <<<"$cli")" = nc ] || fail "nc: comm $(jq -r .comm <<<"$cli")"
ctx=$(jq .rdma_tx_bytes <<<"$cli") srx=$(jq .rdma_rx_bytes <<<"$srv")
[ "$ctx" -ge $((SIZE / 2)) ] || fail "nc: only $ctx of $SIZE bytes over RDMA"
[ "$srx" = "$ctx" ] || fail "nc: the server got $srx bytes over RDMA, the client sent $ctx"
[ "$(jq .time_to_rdma_us <<<"$cli")" -gt 0 ] || fail "nc: no time to RDMA"
dp=$(($(rxe_pkts) - p0))
[ "$dp" -ge $((ctx / 4096)) ] || fail "nc: rxe sent only $dp packets for $ctx bytes"
sovia-stat | tee "$WORK/table" | grep -Eq "^[0-9]+ +nc +[0-9]+ +client +[0-9.]+:[0-9]+ +$IP:5953 +rdma +rdma +rdma +none " ||
	fail "sovia-stat's table lacks the nc client: $(cat "$WORK/table")"
cat "$WORK/table"
note "nc: $ctx of $SIZE bytes over RDMA by sovia-stat, rxe packets +$dp"

# ---- 2b. redis with four clients ----------------------------------------------
sovia-run redis-server --port 6393 --bind "$IP" --protected-mode no --save '' --appendonly no \
	--dir "$WORK" --loglevel warning >"$WORK/redis.log" 2>"$WORK/redis.err" &
pids+=($!)
wait_port 6393
rpid=$(ss -ltnpH "sport = :6393" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
[ -n "$rpid" ] || fail "no pid for redis-server"
for i in 1 2 3 4; do
	mkfifo "$WORK/hold-redis$i"
	{ printf 'PING\r\n'; cat "$WORK/hold-redis$i"; } | sovia-run nc "$IP" 6393 >"$WORK/redis$i.out" \
		2>"$WORK/redis-client$i.err" &
	pids+=($!)
done
sel='([.connections[] | select(.pid == '$rpid' and .role == "server" and .state == "rdma" and .tx == "rdma" and .rx == "rdma")] | length == 4)'
sel="$sel"' and ([.connections[] | select(.peer | endswith(":6393")) | select(.state == "rdma")] | length == 4)'
wait_view "$sel" 300
conns "$rpid" >"$WORK/redis.view"
cat "$WORK/redis.view"
[ "$(wc -l <"$WORK/redis.view")" = 4 ] || fail "redis: sovia-stat -p lists $(wc -l <"$WORK/redis.view") connections"
for i in 1 2 3 4; do
	grep -q PONG "$WORK/redis$i.out" || fail "redis client $i got no PONG"
done
note "redis: four clients, each connection on RDMA both ways at both ends"

# ---- 2c. A plain server's client -------------------------------------------------
mkfifo "$WORK/hold-plain"
nc -l "$IP" 5954 >/dev/null </dev/null &
pids+=($!)
wait_port 5954
{ printf hi; cat "$WORK/hold-plain"; } | sovia-run nc "$IP" 5954 2>"$WORK/plain-client.err" &
pids+=($!)
wait_view '[.connections[] | select(.peer | endswith(":5954")) | select(.state == "fallback")] | length == 1' 120
view=$(cat "$WORK/view")
c=$(jq -c '.connections[] | select(.peer | endswith(":5954"))' <<<"$view")
echo "plain server's client: $c"
[ "$(jq -r '.tx + "/" + .rx + "/" + .fallback' <<<"$c")" = tcp/tcp/rejected ] ||
	fail "plain peer: not TCP with fallback rejected: $c"
[ "$(jq .tcp_tx_bytes <<<"$c")/$(jq .rdma_tx_bytes <<<"$c")" = 2/0 ] || fail "plain peer: bytes $c"
echo "installed OK: API over RDMA and plain; sovia-stat for nc, redis x4 and a plain peer"
