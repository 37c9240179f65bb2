#!/usr/bin/env bash
# A hostile peer (test/bed/progs/sovia_hostile.c) against real preloaded programs.
# The most a peer may do is make its own connection fall back or reset: it
# never hangs the process, exhausts its memory or injects a byte. Each case
# judges the victim, not the attacker: the bytes its application got (cmp),
# its statistics line, its exit, its peak memory (VmHWM).
#
#   flood           2000 upgrade requests for 4-tuples nobody accepted: past
#                   the server's cap each is rejected at once, "busy" (reason
#                   2); a real client meanwhile gets its bytes
#   garbage         requests with random private data: all rejected; a real
#                   client afterwards still reaches RDMA
#   to-rdma-max     a genuine upgrade, then TO_RDMA at 2^64-1: the challenge
#                   fails, TCP carries both ways intact
#   back0           a genuine upgrade, MBs both ways, then BACK with X = 0
#                   after more than its buffers can hold unread (16 of 64
#                   KiB: 2 x 16 x 1 MiB, the most a libsovia peer with 16
#                   buffers lags): reset as malformed, the stream is not
#                   written again on TCP
#   ignore-back     the server detaches (fork) and the peer keeps sending
#                   DATA: the give-back buffer is bounded, fork() returns
#   ignore-back-silent  the same peer goes silent instead: the detach ends
#                   after its deadline, fork() returns, the connection ends
#   withhold        receive buffers advertised but never posted: the
#                   server's RNR retries end, it resumes over TCP
#   rogue-listener  a rogue binds the port on rdma_cm before the real server
#                   (plain and preloaded): what the client writes into the
#                   server's stream is measured (KNOWN-HOLE when 8 bytes are
#                   injected); what we guarantee is asserted
#   rogue-switch    the same rogue answers the client's TO_RDMA with its own,
#                   against an echo server: the wrong echo sends the client
#                   back to TCP, its bytes intact, and nothing hangs
#   rogue-reflect   the same, with the client's own challenge as the rogue's:
#                   the echo server hands it back, and it must not pass
#   rogue-warden    sovia-warden runs on the server's host, the rogue holds
#                   the port: the warden sends the client to the real
#                   server's listener (RDMA), or keeps it on TCP for a plain
#                   server; the rogue is asked by nobody
#   warden-stale    a local user (nobody) registers an address, closes its
#                   listener and keeps the registration; root's server on
#                   every address of that port still gets its clients
#   warden-hang     nobody registers a socket whose close sleeps for an
#                   hour and opens 1,100 idle connections to a warden of
#                   256 files: it neither sleeps nor spins, drops them,
#                   answers the user's next registration, and vouches
#   stat-linger     nobody's view answers root's sovia-stat with such a
#                   socket: sovia-stat returns and lists root's connection
#   rogue-privileged  clients with SOVIA_PRIVILEGED_PORTS=1: on the rogue's
#                   port they stay on TCP and the server's stream is the
#                   client's alone; a rogue run as nobody cannot listen below
#                   1024, where the real server's libsovia takes the client
#                   to RDMA
#
# SOVIA_HOSTILE_CASES picks cases (default: all). SOVIA_HOSTILE_RSS_MB is
# the bound of a victim's memory (default 128; the victims' peaks in these
# cases are 1-11 MB when nothing leaks). SOVIA_HOSTILE_RNR: the RNR
# retries the withholding peer asks of the server's QP (default 7, for
# ever: an attacker asks what it likes). Every case runs, then the script
# fails if any did.
. "$(dirname "$0")/lib.sh"
export SOVIA_LOG=${SOVIA_LOG:-info}
H=$BUILD/bin/sovia-hostile
V=$BUILD/bin/sovia-victim
RSS_MB=${SOVIA_HOSTILE_RSS_MB:-128}
# A cap on pending requests above this one is no cap worth the name.
FLOOD=${SOVIA_HOSTILE_FLOOD:-2000}
FLOOD_CAP=${SOVIA_HOSTILE_FLOOD_CAP:-1024}
TOP=$WORK

# The pid of the program that timeout(1) pid $1 runs.
child_of() {
	local c
	for _ in $(seq 100); do
		c=$(pgrep -P "$1" | head -1 || true)
		[ -n "$c" ] && { echo "$c"; return 0; }
		sleep 0.1
	done
	echo "$1"
}

# Follow process $1's memory until it exits: its peak VmHWM (kB) in $2. If
# VmRSS passes $3 MiB, $2.over says so and the attacker whose pid is in
# file $4 is killed: a leak shows as a failure, not as the guest's OOM.
mem_watch() {
	local pid=$1 out=$2 lim=$(($3 * 1024)) pidfile=${4:-/nonexistent}
	echo 0 >"$out"
	tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-60 >"$out.who" 2>/dev/null || true
	(
		peak=0
		while [ -r "/proc/$pid/status" ]; do
			rss=0 hwm=0
			while read -r k v _; do
				case $k in VmRSS:) rss=$v ;; VmHWM:) hwm=$v ;; esac
			done <"/proc/$pid/status" 2>/dev/null || true
			[ "$hwm" -gt "$peak" ] && peak=$hwm && echo "$peak" >"$out"
			if [ "$rss" -gt "$lim" ] && [ ! -e "$out.over" ]; then
				echo "VmRSS $rss kB" >"$out.over"
				[ -r "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null
			fi
			sleep 1
		done
	) &
}

# The victim's memory stayed bounded: $1 the watch's file, $2 what it is.
assert_mem() {
	[ -e "$1.over" ] && fail "$2: memory unbounded: $(cat "$1.over") (bound $RSS_MB MiB)"
	local peak
	peak=$(cat "$1")
	[ "$peak" -le $((RSS_MB * 1024)) ] || fail "$2: VmHWM $peak kB (bound $RSS_MB MiB)"
	echo "$2 ($(cat "$1.who")): VmHWM $peak kB (bound $RSS_MB MiB)"
}

# A program's status $2 says it ended by itself (not timeout's 124, not a
# signal).
assert_ended() {
	[ "$2" -ne 124 ] && [ "$2" -lt 128 ] || fail "$1 did not end by itself (status $2)"
}

# Field $2 of the line starting with $3 in file $1.
field() {
	sed -n "s/^$3 .*\b$2=\([^ ]*\).*/\1/p" "$1" | tail -1
}

# File $1 is a prefix of file $2 (and not empty).
assert_prefix() {
	local n
	n=$(stat -c %s "$1")
	[ "$n" -gt 0 ] || fail "$3: got no bytes"
	cmp -n "$n" "$1" "$2" >/dev/null || fail "$3: bytes differ from what was sent: $(cmp -n "$n" "$1" "$2" 2>&1 | head -1)"
}

stat_line() { grep -h "libsovia stats" "$1" | grep " $2 " | tail -1 | cut -c1-200; }
failover_of() {
	{ grep -h "libsovia stats" "$1" || true; } | { grep " $2 " || true; } |
		sed -n 's/.* failover=\([a-z-]*\).*/\1/p' | head -1
}

# ---- flood --------------------------------------------------------------------

# A preloaded client sends cli.in: its first 64 KiB, the rest once its
# upgrade is settled, so that its statistics tell which medium it got.
real_client() { # port stderr-file
	{
		head -c 65536 "$WORK/cli.in"
		wait_line "$2" "on RDMA\|stays on TCP" 60 || true
		tail -c +65537 "$WORK/cli.in"
	} | LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$1" >/dev/null 2>"$2"
}

case_flood() {
	local port=$1
	head -c 262144 /dev/urandom >"$WORK/cli.in"
	# A server that keeps listening (nc -l closes its listening socket at
	# its accept, and requests after it find no listener at all) and only
	# reads: one that ends its sending before a client's switch never
	# proves itself, and holds the client up for the whole upgrade timeout
	# (not what this case is about).
	# Connection 1 comes while the flood's requests are pending, 2 after.
	LD_PRELOAD=$LIB timeout 600 "$V" -a "$IP" -p "$port" -n 2 -o "$WORK/vout" \
		>"$WORK/victim.out" 2>"$WORK/victim.err" &
	local vic=$!
	wait_port "$port"
	mem_watch "$(child_of $vic)" "$WORK/mem" "$RSS_MB"
	"$H" flood -a "$IP" -p "$port" -n "$FLOOD" -t 90 >"$WORK/flood.out" 2>"$WORK/flood.err" &
	local fl=$!
	wait_line "$WORK/flood.out" "requests sent\|_RESULT" 300 || fail "the flood never got its requests out"
	local c1=0 c2=0 vrc=0 frc=0
	real_client "$port" "$WORK/client1.err" || c1=$?
	wait "$fl" || frc=$?
	cat "$WORK/flood.out"
	real_client "$port" "$WORK/client2.err" || c2=$?
	wait "$vic" || vrc=$?
	cat "$WORK/victim.out"
	[ "$frc" = 0 ] || fail "the flood could not be made"
	assert_ended "the victim" "$vrc"
	[ "$c1" = 0 ] && [ "$c2" = 0 ] && [ "$vrc" = 0 ] || fail "clients $c1 $c2, victim $vrc"
	cmp "$WORK/cli.in" "$WORK/vout.1" || fail "the victim got other bytes from the client during the flood"
	cmp "$WORK/cli.in" "$WORK/vout.2" || fail "the victim got other bytes from the client after the flood"
	echo "flood: client during: $(stat_line "$WORK/client1.err" client)"
	echo "flood: client after: $(stat_line "$WORK/client2.err" client)"
	assert_mem "$WORK/mem" "flood: the victim"
	local f="$WORK/flood.out" busy sent acc
	busy=$(field "$f" busy FLOOD_RESULT) sent=$(field "$f" sent FLOOD_RESULT)
	acc=$(field "$f" accepted FLOOD_RESULT)
	[ "$sent" = "$FLOOD" ] || fail "the flood sent $sent of $FLOOD requests"
	[ "$acc" = 0 ] || fail "$acc requests for 4-tuples nobody accepted were accepted"
	[ "$busy" -ge $((FLOOD - FLOOD_CAP)) ] ||
		fail "pending requests are not capped: $busy of $FLOOD rejected busy (want >= $((FLOOD - FLOOD_CAP)))"
}

# ---- garbage ------------------------------------------------------------------

case_garbage() {
	local port=$1 n=300
	head -c $((2 * GATE)) /dev/urandom >"$WORK/in"
	LD_PRELOAD=$LIB timeout 600 nc -l "$IP" "$port" </dev/null >"$WORK/server.out" \
		2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	mem_watch "$(child_of $srv)" "$WORK/mem" "$RSS_MB"
	run_logged "$WORK/garbage.out" "$WORK/garbage.err" "$H" garbage -a "$IP" -p "$port" -n $n -t 60
	local f="$WORK/garbage.out" sent ans acc unr
	sent=$(field "$f" sent GARBAGE_RESULT) ans=$(field "$f" answered GARBAGE_RESULT)
	acc=$(field "$f" accepted GARBAGE_RESULT) unr=$(field "$f" unreachable GARBAGE_RESULT)
	[ "$sent" = $n ] || fail "garbage: $sent of $n requests went out"
	[ "$acc" = 0 ] || fail "garbage: $acc requests with garbage private data were accepted"
	[ "$ans" = $n ] && [ "$unr" = 0 ] || fail "garbage: $ans of $n answered, $unr unreachable (all must be rejected)"
	# The server is unharmed: a real client reaches RDMA and its bytes
	# arrive (all but the first MiB over the QP).
	local crc=0 src=0
	gated "$WORK/client.err" | LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" \
		>"$WORK/client.out" 2>"$WORK/client.err" || crc=$?
	wait "$srv" || src=$?
	assert_ended "the server nc" "$src"
	[ "$crc" = 0 ] && [ "$src" = 0 ] || fail "nc failed: client $crc, server $src"
	cmp "$WORK/in" "$WORK/server.out" || fail "the server got other bytes than the client sent"
	grep -q "on RDMA" "$WORK/server.err" || fail "the server's connection never reached RDMA"
	assert_rdma_carried "$WORK/client.err" client $((GATE / 2)) $((2 * GATE))
	assert_mem "$WORK/mem" "garbage: the server"
}

# ---- to-rdma-max --------------------------------------------------------------

case_to_rdma_max() {
	local port=$1
	head -c 262144 /dev/urandom >"$WORK/srv.in"
	"$H" pattern -n $((4096 + 65536)) >"$WORK/want"
	# nc -l quits at its peer's EOF whenever its input buffer is empty
	# (netcat-openbsd), leaving the rest of its input unsent. The attacker
	# ends its sending at once, so nc's writes must not wait for a first
	# contact's hold (which a peer that fails the challenge ends anyway).
	LD_PRELOAD=$LIB SOVIA_PEER_HOLD_MS=0 timeout 300 nc -N -l "$IP" "$port" <"$WORK/srv.in" \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	mem_watch "$(child_of $srv)" "$WORK/mem" "$RSS_MB"
	run_logged "$WORK/hostile.out" "$WORK/hostile.err" \
		"$H" to-rdma-max -a "$IP" -p "$port" -o "$WORK/got" -t 120
	local src=0
	wait "$srv" || src=$?
	assert_ended "the server nc" "$src"
	[ "$src" = 0 ] || fail "the server nc failed ($src)"
	[ "$(field "$WORK/hostile.out" upgrade TORDMAMAX_RESULT)" = accepted ] ||
		fail "the attack never reached the server's QP"
	cmp "$WORK/want" "$WORK/server.out" || fail "the server's application got other bytes than TCP carried"
	cmp "$WORK/srv.in" "$WORK/got" || fail "the peer got other bytes than the server wrote"
	local fb
	fb=$(fallback_of "$WORK/server.err" server)
	[ "$fb" = challenge-failed ] || fail "server fallback '$fb', want challenge-failed"
	[ "$(stat_of "$WORK/server.err" rdma_rx_bytes server)" = 0 ] || fail "the server took bytes from the QP"
	echo "to-rdma-max: the server stayed on TCP ($fb), both streams intact"
	assert_mem "$WORK/mem" "to-rdma-max: the server"
}

# ---- back0 ----------------------------------------------------------------------

case_back0() {
	local port=$1
	head -c $((40 * 1048576)) /dev/urandom >"$WORK/srv.in"
	head -c 262144 /dev/urandom >"$WORK/cli.in"
	"$H" pattern -n $((1048576)) >"$WORK/want"
	# Connection 1 is the attacker's, connection 2 a real client's.
	# It writes once the peer's first byte came: over the QP, then.
	LD_PRELOAD=$LIB timeout 600 "$V" -a "$IP" -p "$port" -n 2 -i "$WORK/srv.in" -g 1 \
		-o "$WORK/vout" >"$WORK/victim.out" 2>"$WORK/victim.err" &
	local vic=$!
	wait_port "$port"
	mem_watch "$(child_of $vic)" "$WORK/mem" "$RSS_MB"
	run_logged "$WORK/hostile.out" "$WORK/hostile.err" \
		"$H" back0 -a "$IP" -p "$port" -n $((36 * 1048576)) -o "$WORK/got" -t 240
	wait_line "$WORK/victim.out" "conn 1: read" 180 || fail "the victim is stuck on the attacked connection"
	local crc=0 vrc=0
	LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" <"$WORK/cli.in" >"$WORK/client.out" \
		2>"$WORK/client.err" || crc=$?
	wait "$vic" || vrc=$?
	cat "$WORK/victim.out"
	assert_ended "the victim" "$vrc"
	[ "$vrc" = 0 ] || fail "the victim failed ($vrc)"
	local f="$WORK/hostile.out"
	[ "$(field "$f" back_sent BACK0_RESULT)" = yes ] || fail "the BACK never went out"
	local got_qp rew ended
	got_qp=$(field "$f" got_qp BACK0_RESULT) rew=$(field "$f" rewritten BACK0_RESULT)
	ended=$(field "$f" ended BACK0_RESULT)
	[ "$got_qp" -gt $((32 * 1048576)) ] || fail "only $got_qp bytes of the server's came over the QP before the BACK"
	assert_prefix "$WORK/got" "$WORK/srv.in" "back0: the server's stream before the BACK"
	assert_prefix "$WORK/vout.1" "$WORK/want" "back0: the victim's application"
	[ "$rew" = 0 ] || fail "the server wrote $rew bytes of its stream again on TCP, from X = 0"
	[ "$ended" != no ] || fail "the server neither reset the connection nor ended it"
	# Only that connection: the next one is served whole.
	[ "$crc" = 0 ] || fail "the real client's nc failed ($crc)"
	cmp "$WORK/cli.in" "$WORK/vout.2" || fail "the victim got other bytes from the real client"
	cmp "$WORK/srv.in" "$WORK/client.out" || fail "the real client got other bytes"
	assert_mem "$WORK/mem" "back0: the victim"
}

# ---- ignore-back --------------------------------------------------------------

# The victim reads 1 MiB, then fork() takes the connection back to TCP
# (BACK: the fork that keeps connections on RDMA is off for it); the peer
# never answers: $2 bytes of DATA in all (after the BACK, for the victim
# to give back), then silence, for at most $3 s.
ignore_back_run() {
	local port=$1 bytes=$2 secs=$3 k=1048576
	head -c 262144 /dev/urandom >"$WORK/cli.in"
	"$H" pattern -n $((16 * k)) >"$WORK/want"
	SOVIA_FORK_KEEP=0 LD_PRELOAD=$LIB timeout 900 "$V" -a "$IP" -p "$port" -n 2 -k $k -x fork -o "$WORK/vout" \
		>"$WORK/victim.out" 2>"$WORK/victim.err" &
	local vic=$!
	wait_port "$port"
	mem_watch "$(child_of $vic)" "$WORK/mem" "$RSS_MB" "$WORK/attacker.pid"
	"$H" ignore-back -a "$IP" -p "$port" -n "$bytes" -t "$secs" >"$WORK/hostile.out" \
		2>"$WORK/hostile.err" &
	echo $! >"$WORK/attacker.pid"
	local hrc=0 crc=0 vrc=0
	wait "$(cat "$WORK/attacker.pid")" || hrc=$?
	cat "$WORK/hostile.out"
	wait_line "$WORK/victim.out" "conn 1: read" 180 || { cat "$WORK/victim.out"; fail "the victim is stuck on the attacked connection"; }
	LD_PRELOAD=$LIB timeout 300 nc -N "$IP" "$port" <"$WORK/cli.in" >"$WORK/client.out" \
		2>"$WORK/client.err" || crc=$?
	wait "$vic" || vrc=$?
	cat "$WORK/victim.out"
	[ ! -e "$WORK/mem.over" ] || fail "the victim's memory grew past $RSS_MB MiB ($(cat "$WORK/mem.over")) while the peer ignored its BACK: the attacker was stopped"
	assert_ended "the victim" "$vrc"
	[ "$hrc" = 0 ] || fail "the attack could not be made ($hrc)"
	local f="$WORK/hostile.out"
	[ "$(field "$f" server_back IGNOREBACK_RESULT)" = yes ] || fail "the victim's fork() sent no BACK"
	grep -q "conn 1: fork() returned" "$WORK/victim.out" || fail "the victim's fork() never returned"
	local ended
	ended=$(field "$f" ended IGNOREBACK_RESULT)
	case $ended in
	reset-message | qp-error | disconnected | tcp-reset | tcp-end) ;;
	*) fail "the victim never ended the connection of a peer that ignored its BACK (in $secs s; $(field "$f" sent_after_back IGNOREBACK_RESULT) bytes after the BACK)" ;;
	esac
	assert_prefix "$WORK/vout.1" "$WORK/want" "the victim's application"
	[ "$vrc" = 0 ] && [ "$crc" = 0 ] || fail "victim $vrc, real client $crc"
	cmp "$WORK/cli.in" "$WORK/vout.2" || fail "the victim got other bytes from the real client"
	assert_mem "$WORK/mem" "the victim"
}

# GBs of DATA after the BACK: the give-back buffer's bound resets it.
case_ignore_back() {
	ignore_back_run "$1" $((4096 * 1048576)) 300
}

# Silence after the BACK: the detach's deadline ends it.
case_ignore_back_silent() {
	ignore_back_run "$1" $((2 * 1048576)) 180
}

# ---- withhold -------------------------------------------------------------------

case_withhold() {
	local port=$1
	head -c $((4 * 1048576)) /dev/urandom >"$WORK/in"
	"$H" pattern -n 4096 >"$WORK/want"
	# The server's first MiB goes before the upgrade, on TCP; the rest once
	# it is on RDMA, into buffers that are not there.
	gated "$WORK/server.err" | LD_PRELOAD=$LIB timeout 300 nc -N -l "$IP" "$port" \
		>"$WORK/server.out" 2>"$WORK/server.err" &
	local srv=$!
	wait_port "$port"
	mem_watch "$(child_of $srv)" "$WORK/mem" "$RSS_MB"
	run_logged "$WORK/hostile.out" "$WORK/hostile.err" \
		"$H" withhold -a "$IP" -p "$port" -R "${SOVIA_HOSTILE_RNR:-7}" -o "$WORK/got" -t 120
	local f="$WORK/hostile.out"
	[ "$(field "$f" record WITHHOLD_RESULT)" = yes ] ||
		fail "the server's QP never failed on RNR: no resume record in 120 s ($(field "$f" got_qp WITHHOLD_RESULT) bytes came over the QP)"
	local src=0
	wait "$srv" || src=$?
	assert_ended "the server nc" "$src"
	[ "$src" = 0 ] || fail "the server nc failed ($src)"
	[ "$(field "$f" rcv WITHHOLD_RESULT)" = 4096 ] || fail "the server's record holds $(field "$f" rcv WITHHOLD_RESULT) of our 4096 bytes"
	cmp "$WORK/in" "$WORK/got" || fail "the server's bytes after its record are not its stream"
	cmp "$WORK/want" "$WORK/server.out" || fail "the server's application got other bytes"
	local fo
	fo=$(failover_of "$WORK/server.err" server)
	[ -n "$fo" ] && [ "$fo" != none ] || fail "the server's statistics name no failover"
	echo "withhold: the server resumed over TCP (failover=$fo), its stream intact after the record"
	assert_mem "$WORK/mem" "withhold: the server"
}

# ---- rogue listener -------------------------------------------------------------

# A rogue on the port, then the real server ($2: plain or preloaded), then a
# preloaded client.
rogue_run() {
	local port=$1 kind=$2
	"$H" rogue -a "$IP" -p "$port" -t 60 >"$WORK/rogue.$kind.out" 2>"$WORK/rogue.$kind.err" &
	local rg=$!
	wait_line "$WORK/rogue.$kind.out" "listening" 60 || fail "$kind: the rogue could not listen"
	local pre=
	[ "$kind" = preloaded ] && pre=$LIB
	# The server replies once both lines are in; the client sends its
	# second once its switch is settled one way or the other, and ends
	# once the reply is in.
	{
		wait_size "$WORK/server.$kind.out" 12 60 || true
		printf 'secret-reply\n'
	} | LD_PRELOAD=$pre timeout 120 nc -N -l "$IP" "$port" >"$WORK/server.$kind.out" \
		2>"$WORK/server.$kind.err" &
	local srv=$!
	wait_port "$port"
	local crc=0 src=0
	{
		printf 'part1\n'
		wait_line "$WORK/client.$kind.err" "on RDMA\|stays on TCP\|plain TCP" 60 || true
		printf 'part2\n'
		wait_size "$WORK/client.$kind.out" 13 60 || true
	} | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" "$port" >"$WORK/client.$kind.out" \
		2>"$WORK/client.$kind.err" || crc=$?
	wait "$srv" || src=$?
	kill -TERM "$rg" 2>/dev/null || true # it prints its results and ends
	wait "$rg" || true
	cat "$WORK/rogue.$kind.out"
	assert_ended "$kind: the client" "$crc"
	assert_ended "$kind: the server" "$src"
	[ "$crc" = 0 ] && [ "$src" = 0 ] || fail "$kind: client $crc, server $src"
	# What we guarantee: the client reads only the server's bytes, the
	# rogue reads none of the client's.
	printf 'secret-reply\n' | cmp - "$WORK/client.$kind.out" ||
		fail "$kind: the client got other bytes: $(cat -A "$WORK/client.$kind.out")"
	local leaked
	leaked=$(sed -n 's/^ROGUE_RESULT .*client_data=\([0-9]*\).*/\1/p' "$WORK/rogue.$kind.out" |
		awk '{s += $1} END {print s + 0}')
	[ "$leaked" = 0 ] || fail "$kind: the rogue read $leaked bytes of the client's"
	# The server's stream is the client's, but for the rogue's 8 bytes.
	printf 'part1\npart2\n' >"$WORK/want"
	sed 's/ROGUECHL//' "$WORK/server.$kind.out" | cmp -s - "$WORK/want" ||
		fail "$kind: the server got other bytes: $(cat -A "$WORK/server.$kind.out")"
	local reqs fb
	reqs=$(grep -c "^rogue: request " "$WORK/rogue.$kind.out" || true)
	fb=$(fallback_of "$WORK/client.$kind.err" client)
	if grep -q ROGUECHL "$WORK/server.$kind.out"; then
		echo "KNOWN-HOLE ${ROGUE_CASE:-rogue-listener} $kind server: its application received the rogue's 8 bytes" \
			"($(cat -A "$WORK/server.$kind.out" | tr '\n' ' ')); the client's request went to the" \
			"rogue ($reqs request(s)) and it fell back: ${fb:-none}"
	else
		echo "PASS ${ROGUE_CASE:-rogue-listener} $kind server: no injected bytes ($reqs request(s) reached the rogue; client fallback ${fb:-none})"
	fi
}

case_rogue_listener() {
	rogue_run "$1" plain
	rogue_run $(($1 + 1)) preloaded
}

case_rogue_privileged() {
	local port=$1 low=$((900 + $1 % 100))
	# The rogue's port is not privileged: the client never asks for RDMA
	# there, so it writes no echo at all.
	SOVIA_PRIVILEGED_PORTS=1 rogue_run "$port" plain
	grep -q ROGUECHL "$WORK/server.plain.out" && fail "rogue-privileged: 8 bytes injected"
	local fb
	fb=$(fallback_of "$WORK/client.plain.err" client)
	[ "$fb" = unprivileged-port ] || fail "rogue-privileged: the client's fallback is '$fb'"
	grep -q "^rogue: request " "$WORK/rogue.plain.out" &&
		fail "rogue-privileged: the client's request reached the rogue"
	# Below 1024 a user without CAP_NET_BIND_SERVICE cannot listen first;
	# the same user can above (so it is the port that is refused).
	local nobody="setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all"
	$nobody "$H" rogue -a "$IP" -p $((port + 50)) -t 1 >"$WORK/rogue.high.out" 2>&1 || true
	$nobody "$H" rogue -a "$IP" -p "$low" -t 5 >"$WORK/rogue.low.out" 2>&1 || true
	cat "$WORK/rogue.high.out" "$WORK/rogue.low.out"
	grep -q "rogue: listening" "$WORK/rogue.high.out" ||
		fail "rogue-privileged: a user without privilege cannot use rdma_cm at all here"
	grep -q "cannot listen.*Permission denied" "$WORK/rogue.low.out" ||
		fail "rogue-privileged: a user without privilege was not refused port $low"
	head -c $((4 * 1048576)) /dev/urandom >"$WORK/in"
	# The server writes once the client's bytes are in (a server done
	# writing before the switch has nothing to prove itself with).
	{ wait_size "$WORK/low.out" $((4 * 1048576)) 100 || true; printf 'ok\n'; } |
		LD_PRELOAD=$LIB timeout 120 nc -N -l "$IP" "$low" >"$WORK/low.out" 2>"$WORK/low.srv.err" &
	local srv=$! crc=0 src=0
	wait_port "$low"
	# The first MiB on TCP, the rest once the client is on RDMA; it stays
	# until the server's reply is in.
	{ gated "$WORK/low.cli.err"; wait_size "$WORK/low.back" 3 100 || true; } |
		SOVIA_PRIVILEGED_PORTS=1 LD_PRELOAD=$LIB timeout 120 \
		nc -N "$IP" "$low" >"$WORK/low.back" 2>"$WORK/low.cli.err" || crc=$?
	wait "$srv" || src=$?
	[ "$crc" = 0 ] && [ "$src" = 0 ] || fail "rogue-privileged: port $low: client $crc, server $src"
	cmp "$WORK/in" "$WORK/low.out" || fail "rogue-privileged: port $low: other bytes"
	printf 'ok\n' | cmp - "$WORK/low.back" || fail "rogue-privileged: port $low: the client got other bytes"
	assert_rdma_carried "$WORK/low.cli.err" client $((2 * 1048576)) $((2 * 1048576))
	echo "PASS rogue-privileged: no request to the rogue's port; below 1024 the rogue is refused and the client is on RDMA"
}

# sovia-warden on the server's host (started here, as root), the same rogue
# on the port first: the client asks the warden, which knows no listener
# for a plain server (TCP, "unvouched") and sends it to a preloaded
# server's own listener, elsewhere since the rogue holds the port. No
# request reaches the rogue, no byte of its reaches a server.
case_rogue_warden() {
	local port=$1 fb
	start_warden
	local wd=$WD
	ROGUE_CASE=rogue-warden rogue_run "$port" plain
	grep -q ROGUECHL "$WORK/server.plain.out" && fail "rogue-warden: 8 bytes injected into a plain server"
	grep -q "^rogue: request " "$WORK/rogue.plain.out" &&
		fail "rogue-warden: the plain server's client asked the rogue"
	fb=$(fallback_of "$WORK/client.plain.err" client)
	[ "$fb" = unvouched ] || fail "rogue-warden: the plain server's client: fallback '$fb'"
	grep -q "a request for .*:$port: unknown" "$WORK/warden.err" ||
		fail "rogue-warden: the warden was not asked for port $port"

	local p2=$((port + 1))
	"$H" rogue -a "$IP" -p "$p2" -t 90 >"$WORK/rogue.pre.out" 2>"$WORK/rogue.pre.err" &
	local rg=$!
	wait_line "$WORK/rogue.pre.out" "listening" 60 || fail "rogue-warden: the rogue could not listen"
	head -c $((4 * 1048576)) /dev/urandom >"$WORK/in"
	{ wait_size "$WORK/pre.out" $((4 * 1048576)) 100 || true; printf 'ok\n'; } |
		LD_PRELOAD=$LIB timeout 120 nc -N -l "$IP" "$p2" >"$WORK/pre.out" 2>"$WORK/pre.srv.err" &
	local srv=$! crc=0 src=0
	wait_port "$p2"
	local p0
	p0=$(rxe_pkts)
	{ gated "$WORK/pre.cli.err"; wait_size "$WORK/pre.back" 3 100 || true; } |
		LD_PRELOAD=$LIB timeout 120 \
		nc -N "$IP" "$p2" >"$WORK/pre.back" 2>"$WORK/pre.cli.err" || crc=$?
	wait "$srv" || src=$?
	local dp=$(($(rxe_pkts) - p0))
	kill "$rg" 2>/dev/null || true
	wait "$rg" || true
	[ "$crc" = 0 ] && [ "$src" = 0 ] || fail "rogue-warden: preloaded: client $crc, server $src"
	cmp "$WORK/in" "$WORK/pre.out" || fail "rogue-warden: the preloaded server got other bytes"
	printf 'ok\n' | cmp - "$WORK/pre.back" || fail "rogue-warden: the client got other bytes"
	grep -q "^rogue: request " "$WORK/rogue.pre.out" &&
		fail "rogue-warden: the preloaded server's client asked the rogue"
	grep -q "registered with sovia-warden\|the listener at .*:$p2 is at RDMA port" "$WORK/warden.err" ||
		fail "rogue-warden: the server's listener was not registered"
	grep -q "a request for .*:$p2: to RDMA port" "$WORK/warden.err" ||
		fail "rogue-warden: the warden did not send the client to the server's listener"
	assert_rdma_carried "$WORK/pre.cli.err" client $((2 * 1048576)) $((2 * 1048576))
	# The medium: 3 MiB over the QP are at least 768 packets at rxe's
	# largest MTU (4096).
	[ "$dp" -ge 768 ] || fail "rogue-warden: rxe sent only $dp packets during 4 MiB"
	kill "$wd"
	wait "$wd" || true
	grep -v "^sovia-warden: a request\|^sovia-warden: uid" "$WORK/warden.err" || true
	echo "PASS rogue-warden: plain server: client on TCP (unvouched), nothing injected;" \
		"preloaded server behind the rogue: on RDMA ($dp rxe packets), the rogue asked by nobody"
}

# The rogue switches back at the offset the client's TO_RDMA names and
# sends DATA, to a preloaded client of an echo server, which hands back
# what the client wrote there: the rogue's challenge (-s), or with -x the
# client's own, which the rogue gave it as its challenge. The client's
# second line goes once its switch is settled, one way or the other.
rogue_echo_run() { # port rogue-flag name
	local port=$1 flag=$2 name=$3
	"$H" rogue "$flag" -a "$IP" -p "$port" -t 60 >"$WORK/rogue.out" 2>"$WORK/rogue.err" &
	local rg=$!
	wait_line "$WORK/rogue.out" "listening" 60 || fail "the rogue could not listen"
	timeout 120 "$V" -a "$IP" -p "$port" -e -o "$WORK/vout" >"$WORK/victim.out" \
		2>"$WORK/victim.err" &
	local vic=$!
	wait_port "$port"
	local crc=0 vrc=0
	{
		printf 'part1\n'
		wait_line "$WORK/client.err" "on RDMA\|stays on TCP" 60 || true
		printf 'part2\n'
		sleep 2
	} | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" "$port" >"$WORK/client.out" \
		2>"$WORK/client.err" || crc=$?
	wait "$vic" || vrc=$?
	kill -TERM "$rg" 2>/dev/null || true
	wait "$rg" || true
	cat "$WORK/rogue.out" "$WORK/victim.out"
	local leaked sw
	leaked=$(field "$WORK/rogue.out" client_data ROGUE_RESULT)
	sw=$(field "$WORK/rogue.out" client_switch_seq ROGUE_RESULT)
	[ -n "$leaked" ] || fail "the client's request never reached the rogue"
	grep -q "INJECTED BY ROGUE" "$WORK/client.out" &&
		fail "the rogue's bytes reached the client's application (hijacked; it read $leaked bytes of the client's): $(cat -A "$WORK/client.out" | tr '\n' ' ')"
	[ "$leaked" = 0 ] || fail "the rogue read $leaked bytes of the client's over the QP (hijacked)"
	assert_ended "the client" "$crc"
	assert_ended "the echo server" "$vrc"
	# What the client read is the echo of what it wrote: its lines, and
	# the 8 challenge bytes if it wrote them at its switch point.
	local fb
	fb=$(fallback_of "$WORK/client.err" client)
	printf 'part1\npart2\n' >"$WORK/want"
	if cmp -s "$WORK/want" "$WORK/client.out"; then
		echo "PASS $name: the client wrote no challenge into the stream (fallback ${fb:-none})"
		return 0
	fi
	head -c "$sw" "$WORK/client.out" >"$WORK/got"
	tail -c +$((sw + 9)) "$WORK/client.out" >>"$WORK/got"
	cmp -s "$WORK/want" "$WORK/got" || fail "the client got other bytes: $(cat -A "$WORK/client.out")"
	echo "KNOWN-HOLE $name: the 8 challenge bytes the client wrote came back to its application at $sw (fallback ${fb:-none})"
}

case_rogue_reflect() {
	rogue_echo_run "$1" -x rogue-reflect
}

case_rogue_switch() {
	rogue_echo_run "$1" -s rogue-switch
}

# ---- a local user against the root parts (issue 53, docs/faults.md) ------------

NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all"
L=$BUILD/bin/sovia-local

# sovia-warden as its systemd unit runs it: root with CAP_NET_BIND_SERVICE
# alone and no new privileges ($1: its file limit; default, the shell's).
# Its pid in WD.
start_warden() {
	local lim=()
	[ -n "${1:-}" ] && lim=(prlimit --nofile="$1")
	"${lim[@]}" setpriv --bounding-set=-all,+net_bind_service --inh-caps=-all --no-new-privs \
		"$BUILD/tools/sovia-warden" -v 2>"$WORK/warden.err" &
	WD=$!
	wait_line "$WORK/warden.err" "answering at" 60 ||
		fail "sovia-warden did not start: $(cat "$WORK/warden.err")"
	local eff
	eff=$(awk '/^CapEff/ {print $2}' "/proc/$WD/status")
	[ "$eff" = 0000000000000400 ] ||
		fail "the warden runs with capabilities $eff, not CAP_NET_BIND_SERVICE alone"
}
warden_ticks() { awk '{print $14 + $15}' "/proc/$WD/stat"; }
# Connections queued at the warden's socket, not accepted yet.
warden_backlog() { ss -xlH | awk '$5 == "/run/sovia/warden.sock" {print $3}'; }

# A preloaded nc server on $2:$1 ('*': every address) and a preloaded
# client of IP:$1 sending 2 MiB, the second on RDMA: the warden sent the
# client to the server's listener, and the QP carried it.
warden_transfer() { # port listen-address name
	local port=$1 name=$3 crc=0 src=0 p0 at=()
	[ "$2" = '*' ] || at=("$2")
	head -c $((2 * 1048576)) /dev/urandom >"$WORK/in"
	LD_PRELOAD=$LIB timeout 120 nc -4 -l "${at[@]}" "$port" </dev/null >"$WORK/$name.out" \
		2>"$WORK/$name.srv.err" &
	local srv=$!
	wait_port "$port"
	p0=$(rxe_pkts)
	gated "$WORK/$name.cli.err" | LD_PRELOAD=$LIB timeout 120 nc -N "$IP" "$port" \
		>/dev/null 2>"$WORK/$name.cli.err" || crc=$?
	wait "$srv" || src=$?
	local dp=$(($(rxe_pkts) - p0))
	[ "$crc" = 0 ] && [ "$src" = 0 ] || fail "$name: client $crc, server $src"
	cmp "$WORK/in" "$WORK/$name.out" || fail "$name: the server got other bytes"
	assert_rdma_carried "$WORK/$name.cli.err" client 1048576 1048576
	# 1 MiB over the QP is at least 256 packets at rxe's largest MTU.
	[ "$dp" -ge 256 ] || fail "$name: rxe sent only $dp packets during 2 MiB"
	grep -q "a request for .*:$port: to RDMA port" "$WORK/warden.err" ||
		fail "$name: the warden did not send the client to the server's listener"
}

# Finding 1: nobody registers IP:port as served at a port of its choice,
# closes its listener and keeps its registration open; root's server then
# listens on every address at that port. The stale exact entry must not
# outrank the live wildcard one: the client goes to root's listener.
case_warden_stale() {
	local port=$1 bogus=$(($1 + 5))
	start_warden
	$NOBODY "$L" register -a "$IP" -p "$port" -r "$bogus" >"$WORK/local.out" 2>&1 &
	wait_line "$WORK/local.out" "closed the listener" 30 ||
		fail "warden-stale: the local user: $(cat "$WORK/local.out")"
	grep -q "answer y" "$WORK/local.out" ||
		fail "warden-stale: the local user's live listener was refused: $(cat "$WORK/local.out")"
	warden_transfer "$port" '*' stale
	grep -q "a request for .*:$port: to RDMA port $bogus\$" "$WORK/warden.err" &&
		fail "warden-stale: the warden answered with the closed listener's port"
	echo "PASS warden-stale: the gone listener's registration sent no client astray; root's server on RDMA"
}

# Findings 2 and 3: nobody registers a socket whose close would sleep for
# an hour, then opens 1,100 connections that never register, against a
# warden limited to 256 files. The warden neither sleeps nor spins, drops
# the idle connections, answers the same user's next registration, and a
# server's client still reaches RDMA through it.
case_warden_hang() {
	local port=$1 t0 t1 i
	start_warden 256
	$NOBODY "$L" hang-warden -a "$IP" -p $((port + 5)) -n 1100 >"$WORK/local.out" 2>&1 &
	wait_line "$WORK/local.out" "never register" 60 ||
		fail "warden-hang: the local user: $(cat "$WORK/local.out")"
	t0=$(warden_ticks)
	sleep 3
	t1=$(warden_ticks)
	[ $((t1 - t0)) -lt "$(getconf CLK_TCK)" ] ||
		fail "warden-hang: the warden spun: $((t1 - t0)) ticks of CPU in 3 s"
	for i in $(seq 300); do
		[ "$(warden_backlog)" = 0 ] && break
		sleep 0.1
	done
	[ "$(warden_backlog)" = 0 ] ||
		fail "warden-hang: $(warden_backlog) connections still wait at the warden after 30 s"
	$NOBODY "$L" register -a "$IP" -p $((port + 6)) -r 40001 >"$WORK/local2.out" 2>&1 &
	wait_line "$WORK/local2.out" "answer" 30 || fail "warden-hang: the user's next registration got no answer"
	grep -q "answer y" "$WORK/local2.out" ||
		fail "warden-hang: the user's next registration was refused: $(cat "$WORK/local2.out")"
	warden_transfer "$port" "$IP" hang
	echo "PASS warden-hang: $((t1 - t0)) ticks in 3 s, the idle connections dropped, the user's next" \
		"registration answered, root's server on RDMA through the warden"
}

# Finding 4: nobody's process answers root's sovia-stat on its view socket
# with a socket whose close would sleep for an hour. sovia-stat returns at
# once and still lists root's connections on RDMA.
case_stat_linger() {
	local port=$1 rc=0
	$NOBODY "$L" stat-view -a "$IP" -p $((port + 5)) >"$WORK/local.out" 2>&1 &
	wait_line "$WORK/local.out" "answers with the lingering socket" 30 ||
		fail "stat-linger: the local user: $(cat "$WORK/local.out")"
	# A connection of root's on RDMA, held open by FIFOs (opened both
	# ways here first: neither open then waits for the other end).
	mkfifo "$WORK/hold" "$WORK/feed"
	exec 8<>"$WORK/feed" 9<>"$WORK/hold"
	LD_PRELOAD=$LIB timeout 120 nc -l "$IP" "$port" <"$WORK/hold" >/dev/null 2>"$WORK/srv.err" &
	local srv=$!
	wait_port "$port"
	LD_PRELOAD=$LIB timeout 120 nc "$IP" "$port" <"$WORK/feed" >/dev/null 2>"$WORK/cli.err" &
	local cli=$!
	head -c 65536 /dev/zero >&8
	wait_line "$WORK/cli.err" "on RDMA" 60 || fail "stat-linger: the connection never went on RDMA"
	timeout 60 "$BUILD/tools/sovia-stat" >"$WORK/stat.out" 2>"$WORK/stat.err" || rc=$?
	exec 8>&- 9>&-
	kill "$cli" "$srv" 2>/dev/null || true
	[ "$rc" = 0 ] || fail "stat-linger: sovia-stat exited $rc: $(cat "$WORK/stat.err")"
	grep -q "answered a reader" "$WORK/local.out" ||
		fail "stat-linger: sovia-stat never asked the local user's view"
	grep -Eq '^[0-9]+ +nc .* rdma ' "$WORK/stat.out" ||
		fail "stat-linger: root's connection on RDMA is not listed: $(cat "$WORK/stat.out")"
	echo "PASS stat-linger: sovia-stat returned past the lingering answer, root's nc listed on RDMA"
}

# ---- the cases ------------------------------------------------------------------

port=5600
failed=
for c in ${SOVIA_HOSTILE_CASES:-flood garbage to-rdma-max back0 ignore-back ignore-back-silent withhold rogue-listener rogue-switch rogue-reflect rogue-privileged rogue-warden warden-stale warden-hang stat-linger}; do
	note "$c"
	rm -f /dev/shm/libsovia-peers.*
	# Not in an || list: errexit would be off inside.
	set +e
	start=$SECONDS
	(
		set -e
		WORK=$TOP/$c
		mkdir -p "$WORK"
		trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
		"case_${c//-/_}" "$port"
	)
	rc=$?
	set -e
	if [ "$rc" = 0 ]; then
		echo "HOSTILE_RESULT case=$c PASS in $((SECONDS - start)) s"
	else
		echo "HOSTILE_RESULT case=$c FAIL in $((SECONDS - start)) s"
		failed="$failed $c"
	fi
	port=$((port + 10))
done
[ -z "$failed" ] || { echo "hostile: FAILED:$failed" >&2; exit 1; }
echo "hostile: OK"
