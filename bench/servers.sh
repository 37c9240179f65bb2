#!/usr/bin/env bash
# Servers that fork, prefork or exec, over libsovia and over kernel TCP, in
# one run of the soft-RoCE test bed (issue 29):
#   nginx      master + 2 prefork workers (epoll, sendfile, keep-alive):
#              curl gets a 1 MB and a 50 MB file (cmp), and 1,000 small
#              requests on 4 keep-alive connections (requests/s)
#   postgres   a throwaway cluster (initdb, pg_ctl), a backend forked per
#              connection: pgbench -i, pgbench with 8 clients
#              (transactions/s), COPY ... TO STDOUT of about 50 MB (md5
#              against the server's own)
#   inetd      openbsd-inetd, a program exec'd per connection with the
#              socket on stdin/stdout (cat): nc sends 32 MB and reads
#              them back (cmp)
#   echo-fork  examples/sovia_echo_fork.c, accept then fork: 30 MB each way
# each once with both ends preloaded with libsovia (SOVIA_STATS=1) and once
# on plain kernel TCP (no preload). One line per program and workload:
#   RESULT prog=P workload=W medium=M status=ok|failed bytes_verified=N
#          rdma_bytes=N tcp_bytes=N rdma_share=F rate=R unit=U ...
# and a summary at the end.
#
# What carried the bytes. rdma_bytes and tcp_bytes come from libsovia's
# statistics lines of the workload's clients (curl, pgbench, psql, nc,
# sovia-echo-fork -c), sent plus received: none of them forks, so their
# lines count every byte of their connections. A server's connection that
# goes back to plain TCP at a fork prints a [detach] line and is not counted
# after it, so the servers' lines (srv_rdma_bytes, srv_tcp_bytes: the lines
# that appeared in their stderr files during the workload, every process's)
# are shown beside them, not used for the share. The kernel's view, for a
# cross-check: lo_bytes (bytes sent on loopback, where TCP between two
# sockets on the bed's own address goes), rxe_pkts (packets the rxe device
# sent; rxe loops back its own address's traffic without the netdev) and,
# where the device has it, rxe_xmit (port_xmit_data, in 4-byte words).
#
# A benchmark: a program that fails is reported as failed and the run goes
# on; a low rate or a share of 0 is a result, not a failure. Exit status 0
# unless the arguments are wrong. Every step has a timeout, and every
# process started is ended at the end.
#
# usage: servers.sh --lib LIBSOVIA_SO --build BUILD_DIR --out DIR
#   [--media "libsovia tcp"] [--progs "nginx postgres inetd echo-fork"]
#   [--log LEVEL]   SOVIA_LOG for the libsovia medium's processes (their
#                   lines go to the servers' and clients' files in raw/)
# Run it in the bed:
#   test/bed/sovia-bed --timeout 1500 -- bench/servers.sh \
#       --lib build/preload/libsovia.so --build build --out OUT
set -uo pipefail
LIB="" BUILD="" OUT=""
MEDIA="libsovia tcp"
PROGS="nginx postgres inetd echo-fork"
LOG=""
while [ $# -gt 0 ]; do
	case "$1" in
	--lib) LIB=$2; shift ;;
	--build) BUILD=$2; shift ;;
	--out) OUT=$2; shift ;;
	--media) MEDIA=$2; shift ;;
	--progs) PROGS=$2; shift ;;
	--log) LOG=$2; shift ;;
	*) echo "servers.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
[ -n "$LIB" ] && [ -n "$BUILD" ] && [ -n "$OUT" ] ||
	{ echo "usage: $0 --lib LIBSOVIA_SO --build BUILD_DIR --out DIR" >&2; exit 2; }
LIB=$(realpath "$LIB") BUILD=$(realpath "$BUILD")
IP=${SOVIA_BED_IP:?run me in the test bed: test/bed/sovia-bed -- $0 ...}
DEV=${SOVIA_BED_DEV:-rxe0}
NETDEV=${SOVIA_BED_NETDEV:-}

# Sizes and counts (environment, for a quicker try).
BIG_MB=${SOVIA_SRV_BIG_MB:-50}
SMALL_REQS=${SOVIA_SRV_SMALL_REQS:-1000}
SMALL_CONNS=${SOVIA_SRV_SMALL_CONNS:-4}
SMALL_SIZE=${SOVIA_SRV_SMALL_SIZE:-1024}
PGBENCH_SECS=${SOVIA_SRV_PGBENCH_SECS:-10}
PGBENCH_CLIENTS=${SOVIA_SRV_PGBENCH_CLIENTS:-8}
COPY_MB=${SOVIA_SRV_COPY_MB:-50}
INETD_MB=${SOVIA_SRV_INETD_MB:-32}
ECHO_MB=${SOVIA_SRV_ECHO_MB:-30}

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
RAW=$OUT/raw
rm -rf "$RAW"
mkdir -p "$RAW"
RESULTS=$OUT/results.txt
: >"$RESULTS"
# The servers' data (files served, the database) live in memory: in a
# guest, /tmp is the host's over 9p. AF_UNIX sockets go to SOVIA_BED_TMP.
SCRATCH=$(mktemp -d /dev/shm/sovia-servers.XXXXXX)
chmod 755 "$SCRATCH"
SOCKDIR=$(mktemp -d "${SOVIA_BED_TMP:-/dev/shm}/sovia-servers-sock.XXXXXX")
chmod 777 "$SOCKDIR"
# libsovia's peer tables outlive the processes: each run starts as the
# hosts' first contact (as the integration tests do).
rm -f /dev/shm/libsovia-peers.*

note() { echo "== $(date +%T) $*"; }

# Every process started in the background is recorded here, and its
# process group (setsid) ended at exit.
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
	done
	sleep 0.5
	for p in "${PIDS[@]}"; do
		kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
	done
	rm -rf "$SCRATCH" "$SOCKDIR" /dev/shm/libsovia-peers.*
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Start "$@" in the background in a session of its own (so the whole tree
# can be ended), stdout to $1, stderr to $2; sets BG.
bg() {
	local out=$1 err=$2
	shift 2
	setsid "$@" >"$out" 2>"$err" </dev/null &
	BG=$!
	PIDS+=("$BG")
}
# End the session of process $1: TERM (or signal $2), then KILL after $3 s.
stop_bg() {
	local p=$1 sig=${2:-TERM} grace=${3:-10} i
	kill "-$sig" -- "-$p" 2>/dev/null || kill "-$sig" "$p" 2>/dev/null
	for i in $(seq $((grace * 10))); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL -- "-$p" 2>/dev/null
	wait "$p" 2>/dev/null
}
wait_port() { # port timeout_s pid
	local i
	for i in $(seq $(($2 * 10))); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		[ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && return 1
		sleep 0.1
	done
	return 1
}

# Environment of a medium's processes (both ends).
medium_env() {
	case "$1" in
	libsovia) echo "LD_PRELOAD=$LIB SOVIA_STATS=1 SOVIA_UPGRADE_TIMEOUT_MS=30000${LOG:+ SOVIA_LOG=$LOG}" ;;
	tcp) echo "SOVIA_BENCH_MEDIUM=tcp" ;;
	esac
}

# ---- counters ----
rdfile() { cat "$1" 2>/dev/null || echo 0; }
lo_bytes() { rdfile /sys/class/net/lo/statistics/tx_bytes; }
nd_bytes() { [ -n "$NETDEV" ] && rdfile "/sys/class/net/$NETDEV/statistics/tx_bytes" || echo 0; }
rxe_pkts() { rdfile "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts"; }
rxe_xmit() { rdfile "/sys/class/infiniband/$DEV/ports/1/counters/port_xmit_data"; }
snap() { echo "$(lo_bytes) $(nd_bytes) $(rxe_pkts) $(rxe_xmit)"; }

# Sum of field $2 over the "libsovia stats" lines of role $3 (client,
# server or any) in the files given on stdin (one path a line).
stats_sum() { # files_list_file field role
	local f
	while read -r f; do [ -f "$f" ] && grep -h "libsovia stats" "$f"; done <"$1" |
		{ if [ "$3" = any ]; then cat; else grep " $3 state=" || true; fi; } |
		sed -n "s/.* $2=\([0-9]*\).*/\1/p" | awk '{s += $1} END {printf "%.0f", s + 0}'
}
stats_lines() { # files_list_file role
	local f
	while read -r f; do [ -f "$f" ] && grep -h "libsovia stats" "$f"; done <"$1" |
		{ grep -c " $2 state=" || true; }
}
# "state:count,..." (or fallback) over the lines of role $2.
stats_kinds() { # files_list_file role key
	local f
	while read -r f; do [ -f "$f" ] && grep -h "libsovia stats" "$f"; done <"$1" |
		{ grep " $2 state=" || true; } | sed -n "s/.* $3=\([a-z-]*\).*/\1/p" |
		sort | uniq -c | awk '{printf "%s%s:%s", (NR > 1 ? "," : ""), $2, $1}'
}

# Server stderr files: their line counts are taken before a workload, and
# the lines after them are the workload's (the server's stats lines are
# printed at each connection's close).
SRV_FILES=() # files of the running server
declare -A SRV_MARK
mark_servers() {
	local f
	for f in "${SRV_FILES[@]}"; do SRV_MARK[$f]=$(wc -l <"$f" 2>/dev/null || echo 0); done
}
# Lines of the server files since mark_servers, into file $1; also lines of
# stderr files that appeared since (forked and exec'd processes' own files,
# matched by glob $2).
server_delta() { # outfile glob
	local f n
	: >"$1"
	for f in "${SRV_FILES[@]}"; do
		n=${SRV_MARK[$f]:-0}
		[ -f "$f" ] && tail -n +$((n + 1)) "$f" >>"$1"
	done
	if [ -n "${2:-}" ]; then
		for f in $2; do [ -f "$f" ] && cat "$f" >>"$1" && rm -f "$f"; done
	fi
}

# One RESULT line. Arguments: prog workload medium status bytes_verified
# rate unit secs client_err_list server_delta_file snap_before snap_after
# detail
result() {
	local prog=$1 wl=$2 med=$3 st=$4 bv=$5 rate=$6 unit=$7 secs=$8 clist=$9 sdelta=${10}
	local s0=${11} s1=${12} detail=${13:-}
	local rb tb share srb stb cl sl states fb lo nd pk xm
	read -r l0 n0 p0 x0 <<<"$s0"
	read -r l1 n1 p1 x1 <<<"$s1"
	lo=$((l1 - l0)) nd=$((n1 - n0)) pk=$((p1 - p0)) xm=$((x1 - x0))
	if [ "$med" = libsovia ]; then
		rb=$(($(stats_sum "$clist" rdma_tx_bytes client) + $(stats_sum "$clist" rdma_rx_bytes client)))
		tb=$(($(stats_sum "$clist" tcp_tx_bytes client) + $(stats_sum "$clist" tcp_rx_bytes client)))
		echo "$sdelta" >"$RAW/.sl"
		srb=$(($(stats_sum "$RAW/.sl" rdma_tx_bytes server) + $(stats_sum "$RAW/.sl" rdma_rx_bytes server)))
		stb=$(($(stats_sum "$RAW/.sl" tcp_tx_bytes server) + $(stats_sum "$RAW/.sl" tcp_rx_bytes server)))
		cl=$(stats_lines "$clist" client) sl=$(stats_lines "$RAW/.sl" server)
		states=$(stats_kinds "$clist" client state)
		fb=$(stats_kinds "$clist" client fallback)
		share=$(awk -v r="$rb" -v t="$tb" 'BEGIN {printf "%.2f", (r + t > 0 ? r / (r + t) : 0)}')
	else
		rb=0 tb=NA srb=0 stb=NA cl=0 sl=0 states=none fb=none share=0.00
	fi
	local line="RESULT prog=$prog workload=$wl medium=$med status=$st bytes_verified=$bv"
	line+=" rdma_bytes=$rb tcp_bytes=$tb rdma_share=$share rate=$rate unit=$unit secs=$secs"
	line+=" client_lines=$cl client_states=${states:-none} client_fallbacks=${fb:-none}"
	line+=" srv_lines=$sl srv_rdma_bytes=$srb srv_tcp_bytes=$stb"
	line+=" lo_bytes=$lo netdev_bytes=$nd rxe_pkts=$pk rxe_xmit_words=$xm"
	[ -n "$detail" ] && line+=" detail=${detail// /_}"
	echo "$line" | tee -a "$RESULTS"
}
# "n/m": of the m processes given (still there), n have libsovia mapped:
# the preload reached the server's processes.
# Each process's pid, state, name and whether it has it mapped go to
# RAW/preloaded.log.
preloaded() {
	local n=0 m=0 p y
	for p in "$@"; do
		# Gone, or a zombie (its maps are empty): not counted.
		grep -q . "/proc/$p/maps" 2>/dev/null || continue
		m=$((m + 1))
		y=0
		grep -q libsovia "/proc/$p/maps" 2>/dev/null && y=1 && n=$((n + 1))
		echo "$(date +%T) pid=$p libsovia=$y $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" >>"$RAW/preloaded.log"
	done
	echo "$n/$m"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }
per_s() { awk -v n="$1" -v t="$2" 'BEGIN {printf "%.1f", (t > 0 ? n / t : 0)}'; }
mb_s() { awk -v n="$1" -v t="$2" 'BEGIN {printf "%.2f", (t > 0 ? n / 1048576 / t : 0)}'; }

# ---- data ----
note "data in $SCRATCH"
head -c $((BIG_MB * 1048576)) /dev/urandom >"$SCRATCH/big.bin"
head -c 1048576 /dev/urandom >"$SCRATCH/1mb.bin"
head -c "$SMALL_SIZE" /dev/urandom >"$SCRATCH/small.bin"
head -c $((INETD_MB * 1048576)) /dev/urandom >"$SCRATCH/inetd.in"
chmod 644 "$SCRATCH"/*.bin

# ======================= nginx =======================
NGX_PORT=18080
nginx_conf() { # dir
	# Debian's /etc/nginx/nginx.conf, on its own prefix and the bed's
	# address: user www-data, epoll, sendfile, tcp_nopush, keep-alive
	# (65 s), gzip; worker_processes 2 (Debian says auto: the guest has
	# 2 vCPUs). daemon off, so that the script holds the master.
	cat >"$1/nginx.conf" <<EOF
user www-data;
worker_processes 2;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log;
events {
	worker_connections 768;
	use epoll;
}
http {
	sendfile on;
	tcp_nopush on;
	types_hash_max_size 2048;
	include /etc/nginx/mime.types;
	default_type application/octet-stream;
	keepalive_timeout 65;
	access_log $1/access.log;
	gzip on;
	client_body_temp_path $1/body;
	proxy_temp_path $1/proxy;
	fastcgi_temp_path $1/fastcgi;
	uwsgi_temp_path $1/uwsgi;
	scgi_temp_path $1/scgi;
	server {
		listen $IP:$NGX_PORT;
		root $SCRATCH;
		location / { }
	}
}
EOF
}

nginx_medium() { # medium
	local med=$1 d="$SCRATCH/nginx.$1" s0 s1 t0 t1 rc
	command -v nginx >/dev/null || {
		for w in 1MB "$BIG_MB"MB small; do
			result nginx "$w" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "no nginx (bench/setup-deps.sh)"
		done
		return
	}
	mkdir -p "$d"
	NGX_PORT=$((NGX_PORT + 1))
	nginx_conf "$d"
	note "nginx, $med, port $NGX_PORT"
	# shellcheck disable=SC2046
	bg "$RAW/nginx.$med.out" "$RAW/nginx.$med.err" \
		timeout -k 5 600 env $(medium_env "$med") nginx -p "$d" -c "$d/nginx.conf"
	local ngx=$BG
	SRV_FILES=("$RAW/nginx.$med.err" "$d/error.log")
	if ! wait_port "$NGX_PORT" 90 "$ngx"; then
		echo "nginx ($med) did not start:"
		tail -5 "$RAW/nginx.$med.err" "$d/error.log" 2>/dev/null
		for w in 1MB "$BIG_MB"MB small; do
			result nginx "$w" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "nginx did not start"
		done
		stop_bg "$ngx"
		return
	fi
	sleep 1
	# The master and its workers (their users), for the log.
	ps -o pid,ppid,user,args -g "$ngx" >"$RAW/nginx.$med.ps" 2>/dev/null
	# shellcheck disable=SC2046
	local pre
	pre=$(preloaded $(pgrep -g "$ngx" -x nginx))

	# Whole files: one curl each, the body compared with the file.
	local f name size
	for f in 1mb.bin big.bin; do
		name=1MB size=1048576
		[ "$f" = big.bin ] && name=${BIG_MB}MB size=$((BIG_MB * 1048576))
		local cerr="$RAW/nginx.$med.$name.curl.err" got="$SCRATCH/got.$f"
		mark_servers
		s0=$(snap) t0=$(now)
		# shellcheck disable=SC2046
		timeout -k 5 300 env $(medium_env "$med") curl -sS --fail -o "$got" \
			"http://$IP:$NGX_PORT/$f" 2>"$cerr"
		rc=$?
		t1=$(now)
		sleep 0.5
		s1=$(snap)
		local st=failed bv=0 why="curl exit $rc"
		if [ "$rc" = 0 ] && cmp -s "$got" "$SCRATCH/$f"; then
			st=ok bv=$size why=""
		elif [ "$rc" = 0 ]; then
			why="body differs from the file ($(stat -c %s "$got" 2>/dev/null) bytes)"
		fi
		rm -f "$got"
		echo "$cerr" >"$RAW/.cl"
		local secs
		secs=$(elapsed "$t0" "$t1")
		server_delta "$RAW/nginx.$med.$name.srv" ""
		result nginx "$name" "$med" "$st" "$bv" "$(mb_s "$bv" "$secs")" MiB/s "$secs" \
			"$RAW/.cl" "$RAW/nginx.$med.$name.srv" "$s0" "$s1" "${why:+$why; }srv_preloaded=$pre"
	done

	# Small requests: SMALL_CONNS curl processes at once, each with its
	# share of the requests as URLs of one command (one keep-alive
	# connection each: curl reuses it). Each response's code, size and
	# the connections curl opened are checked (curl's -w lines, on its
	# stderr), and each curl's bodies, one after the other on its stdout,
	# against that many copies of the file.
	local per=$((SMALL_REQS / SMALL_CONNS)) i pids=() cfg
	: >"$RAW/.cl"
	for i in $(seq "$SMALL_CONNS"); do
		cfg="$SCRATCH/curl.$i.cfg"
		for _ in $(seq "$per"); do
			echo "url = \"http://$IP:$NGX_PORT/small.bin\""
		done >"$cfg"
	done
	for _ in $(seq "$per"); do cat "$SCRATCH/small.bin"; done >"$SCRATCH/small.expect"
	mark_servers
	s0=$(snap) t0=$(now)
	for i in $(seq "$SMALL_CONNS"); do
		# shellcheck disable=SC2046
		timeout -k 5 300 env $(medium_env "$med") curl -sS -K "$SCRATCH/curl.$i.cfg" \
			-w '%{stderr}%{http_code} %{size_download} %{num_connects}\n' \
			>"$SCRATCH/small.$i.body" 2>"$RAW/nginx.$med.small.$i.err" &
		pids+=($!)
		echo "$RAW/nginx.$med.small.$i.err" >>"$RAW/.cl"
	done
	rc=0
	for i in "${pids[@]}"; do wait "$i" || rc=$?; done
	t1=$(now)
	sleep 0.5
	s1=$(snap)
	local ok n conns bodies=0
	for i in $(seq "$SMALL_CONNS"); do
		# curl's own lines: "code size connects"
		awk 'NF == 3 && $1 ~ /^[0-9][0-9][0-9]$/' "$RAW/nginx.$med.small.$i.err" \
			>"$RAW/nginx.$med.small.$i.out"
		cmp -s "$SCRATCH/small.$i.body" "$SCRATCH/small.expect" && bodies=$((bodies + 1))
	done
	rm -f "$SCRATCH"/small.*.body "$SCRATCH/small.expect"
	ok=$(cat "$RAW"/nginx."$med".small.*.out | awk -v s="$SMALL_SIZE" '$1 == 200 && $2 == s' | wc -l)
	n=$((per * SMALL_CONNS))
	conns=$(cat "$RAW"/nginx."$med".small.*.out | awk '{c += $3} END {print c + 0}')
	secs=$(elapsed "$t0" "$t1")
	st=failed bv=0 why="curl exit $rc; $ok of $n answers right; $bodies of $SMALL_CONNS connections' bodies right"
	if [ "$rc" = 0 ] && [ "$ok" = "$n" ] && [ "$bodies" = "$SMALL_CONNS" ]; then
		st=ok bv=$((n * SMALL_SIZE)) why=""
	fi
	server_delta "$RAW/nginx.$med.small.srv" ""
	result nginx "small${SMALL_SIZE}Bx$n" "$med" "$st" "$bv" "$(per_s "$ok" "$secs")" req/s "$secs" \
		"$RAW/.cl" "$RAW/nginx.$med.small.srv" "$s0" "$s1" "${why:+$why; }conns=$conns srv_preloaded=$pre"
	rm -f "$SCRATCH"/curl.*.cfg

	# A graceful stop (QUIT): the workers exit and print their lines.
	stop_bg "$ngx" QUIT 20
	cat "$d/error.log" >"$RAW/nginx.$med.error.log" 2>/dev/null
}

# ======================= PostgreSQL =======================
PG_PORT=15432
PGBIN=""
for v in /usr/lib/postgresql/*/bin; do [ -x "$v/postgres" ] && PGBIN=$v; done
PGUSER_OS=postgres
id "$PGUSER_OS" >/dev/null 2>&1 || PGUSER_OS=nobody
PGDATA_DIR="$SCRATCH/pgdata"
AS_PG=(setpriv --reuid="$PGUSER_OS" --regid="$(id -g "$PGUSER_OS")" --init-groups --)

pg_setup() { # the cluster, once: initdb, settings, the COPY table
	[ -n "$PGBIN" ] && command -v pgbench >/dev/null && command -v psql >/dev/null || {
		echo "no PostgreSQL server or pgbench (bench/setup-deps.sh)"
		return 1
	}
	note "postgres: initdb ($PGBIN, as $PGUSER_OS)"
	mkdir -p "$PGDATA_DIR"
	chown "$PGUSER_OS" "$PGDATA_DIR"
	chmod 700 "$PGDATA_DIR"
	timeout -k 5 600 "${AS_PG[@]}" "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 \
		--locale=C >"$RAW/pg.initdb.log" 2>&1 || { tail -5 "$RAW/pg.initdb.log"; return 1; }
	# A throwaway cluster: no durability wanted (fsync off), a socket on
	# the guest's own tmpfs, TCP on the bed's address.
	cat >>"$PGDATA_DIR/postgresql.conf" <<EOF
listen_addresses = '$IP'
unix_socket_directories = '$SOCKDIR'
max_connections = 30
shared_buffers = 64MB
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
max_wal_size = 128MB
EOF
	echo "host all all $IP/32 trust" >>"$PGDATA_DIR/pg_hba.conf"
	pg_start setup "" || return 1
	# The COPY table: rows of 8 md5 strings (about 270 bytes a row).
	local rows=$((COPY_MB * 1048576 / 270))
	timeout -k 5 600 psql -h "$SOCKDIR" -p "$PG_PORT" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 -c \
		"CREATE TABLE big AS SELECT g, repeat(md5(g::text), 8) AS v FROM generate_series(1, $rows) g" \
		>"$RAW/pg.setup.log" 2>&1 || { tail -5 "$RAW/pg.setup.log"; pg_stop; return 1; }
	# What COPY big TO STDOUT must print: its size and md5, by the server.
	timeout -k 5 600 psql -h "$SOCKDIR" -p "$PG_PORT" -U postgres -d postgres -qAt -F ' ' -c \
		"SELECT sum(length(g::text) + length(v) + 2), md5(string_agg(g::text || E'\t' || v || E'\n', '' ORDER BY g)) FROM big" \
		>"$RAW/pg.copy.expect" 2>>"$RAW/pg.setup.log" || { tail -5 "$RAW/pg.setup.log"; pg_stop; return 1; }
	echo "COPY expects: $(cat "$RAW/pg.copy.expect") (bytes md5)"
	pg_stop
}
PG_LOG="" PG_TAG=setup
pg_start() { # tag medium
	# The server's processes all write to PG_LOG (pg_ctl -l), libsovia's
	# lines with them. Where the server's user can open it (OUT may be
	# closed to it); pg_stop copies it to RAW.
	PG_LOG="$SCRATCH/pg.$1.log" PG_TAG=$1
	: >"$PG_LOG"
	chown "$PGUSER_OS" "$PG_LOG"
	local envs=""
	[ -n "$2" ] && envs=$(medium_env "$2")
	# shellcheck disable=SC2086
	timeout -k 5 300 "${AS_PG[@]}" env $envs "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$PG_LOG" -w -t 240 \
		-o "-p $PG_PORT" start >"$RAW/pg.$1.pg_ctl" 2>&1 || {
		echo "postgres ($1) did not start:"
		tail -5 "$RAW/pg.$1.pg_ctl" "$PG_LOG"
		return 1
	}
	SRV_FILES=("$PG_LOG")
}
pg_stop() {
	local pm
	pm=$(head -1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null)
	if ! timeout -k 5 120 "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w stop \
		>"$RAW/pg.$PG_TAG.stop" 2>&1 && [ -n "$pm" ]; then
		# The postmaster this script started; its children follow it.
		kill -QUIT "$pm" 2>/dev/null
	fi
	[ -n "$PG_LOG" ] && cp "$PG_LOG" "$RAW/pg.$PG_TAG.log" 2>/dev/null
}

pg_fail_all() { # medium why
	result postgres pgbench-init "$1" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "$2"
	result postgres "pgbench-c$PGBENCH_CLIENTS" "$1" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "$2"
	result postgres "copy${COPY_MB}MB" "$1" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "$2"
}

pg_medium() { # medium
	local med=$1 s0 s1 t0 t1 rc secs st why
	if [ "$PG_READY" != 1 ]; then
		pg_fail_all "$med" "no cluster"
		return
	fi
	note "postgres, $med, port $PG_PORT"
	if ! pg_start "$med" "$med"; then
		pg_fail_all "$med" "server did not start"
		pg_stop
		return
	fi
	local -a conn=(-h "$IP" -p "$PG_PORT" -U postgres)

	# pgbench -i (scale 1): the client's inserts and the server's work.
	mark_servers
	s0=$(snap) t0=$(now)
	# shellcheck disable=SC2046
	timeout -k 5 300 env $(medium_env "$med") pgbench -i -q "${conn[@]}" postgres \
		>"$RAW/pg.$med.init.out" 2>"$RAW/pg.$med.init.err"
	rc=$?
	t1=$(now)
	sleep 0.5
	s1=$(snap)
	secs=$(elapsed "$t0" "$t1")
	echo "$RAW/pg.$med.init.err" >"$RAW/.cl"
	server_delta "$RAW/pg.$med.init.srv" ""
	st=failed why="pgbench -i exit $rc"
	[ "$rc" = 0 ] && grep -q "^done" "$RAW/pg.$med.init.err" && st=ok why=""
	result postgres pgbench-init "$med" "$st" 0 "$secs" s "$secs" "$RAW/.cl" "$RAW/pg.$med.init.srv" "$s0" "$s1" "$why"

	# pgbench, TPC-B-like, 8 clients (one thread), PGBENCH_SECS seconds.
	local pm
	pm=$(head -1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null)
	mark_servers
	s0=$(snap) t0=$(now)
	# shellcheck disable=SC2046
	timeout -k 5 $((PGBENCH_SECS + 240)) env $(medium_env "$med") pgbench "${conn[@]}" \
		-c "$PGBENCH_CLIENTS" -T "$PGBENCH_SECS" postgres \
		>"$RAW/pg.$med.bench.out" 2>"$RAW/pg.$med.bench.err" &
	local pgb=$! pre="" p1 best=-1
	# The postmaster and its children, looked at while pgbench runs: has
	# the preload reached the backends? The look that found the most
	# processes counts. (Waiting for as many children more as pgbench
	# has clients, by count or by the backends' titles, never saw them
	# in the bed.)
	while kill -0 "$pgb" 2>/dev/null; do
		# shellcheck disable=SC2046
		p1=$(preloaded $pm $(pgrep -P "${pm:-1}" 2>/dev/null))
		[ "${p1#*/}" -gt "$best" ] && best=${p1#*/} pre=$p1
		echo "-- look: $p1" >>"$RAW/preloaded.log"
		sleep 1
	done
	wait "$pgb"
	rc=$?
	t1=$(now)
	sleep 0.5
	s1=$(snap)
	secs=$(elapsed "$t0" "$t1")
	echo "$RAW/pg.$med.bench.err" >"$RAW/.cl"
	server_delta "$RAW/pg.$med.bench.srv" ""
	local tps txs fails
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time).*/\1/p' "$RAW/pg.$med.bench.out" | head -1)
	txs=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$RAW/pg.$med.bench.out" | head -1)
	fails=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$RAW/pg.$med.bench.out" | head -1)
	st=failed why="pgbench exit $rc"
	[ "$rc" = 0 ] && [ -n "$tps" ] && [ "${fails:-0}" = 0 ] && st=ok why=""
	result postgres "pgbench-c$PGBENCH_CLIENTS" "$med" "$st" 0 "${tps:-0}" tps "$secs" "$RAW/.cl" \
		"$RAW/pg.$med.bench.srv" "$s0" "$s1" "${why:+$why; }transactions=${txs:-0} failed=${fails:-NA} srv_preloaded=$pre"

	# COPY big TO STDOUT through psql: size and md5 against the server's.
	local got="$SCRATCH/copy.out"
	mark_servers
	s0=$(snap) t0=$(now)
	# shellcheck disable=SC2046
	timeout -k 5 300 env $(medium_env "$med") psql "${conn[@]}" -d postgres -qAt -v ON_ERROR_STOP=1 \
		-c "COPY big TO STDOUT" >"$got" 2>"$RAW/pg.$med.copy.err"
	rc=$?
	t1=$(now)
	sleep 0.5
	s1=$(snap)
	secs=$(elapsed "$t0" "$t1")
	local size sum exp_size exp_sum
	size=$(stat -c %s "$got" 2>/dev/null || echo 0)
	sum=$(md5sum <"$got" | cut -d' ' -f1)
	rm -f "$got"
	read -r exp_size exp_sum <"$RAW/pg.copy.expect"
	st=failed bv=0 why="psql exit $rc; $size bytes, md5 $sum; expected $exp_size, $exp_sum"
	[ "$rc" = 0 ] && [ "$size" = "$exp_size" ] && [ "$sum" = "$exp_sum" ] && st=ok bv=$size why=""
	echo "$RAW/pg.$med.copy.err" >"$RAW/.cl"
	server_delta "$RAW/pg.$med.copy.srv" ""
	result postgres "copy${COPY_MB}MB" "$med" "$st" "$bv" "$(mb_s "$bv" "$secs")" MiB/s "$secs" "$RAW/.cl" \
		"$RAW/pg.$med.copy.srv" "$s0" "$s1" "$why"
	pg_stop
}

# ======================= inetd =======================
INETD_PORT=18790
inetd_medium() { # medium
	local med=$1 d="$SCRATCH/inetd.$1" s0 s1 t0 t1 rc secs st why bv
	command -v inetd >/dev/null || {
		result inetd "echo${INETD_MB}MB" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "no inetd (bench/setup-deps.sh)"
		return
	}
	mkdir -p "$d"
	INETD_PORT=$((INETD_PORT + 1))
	# The service: cat with the socket as stdin and stdout. inetd gives
	# it the socket as stderr too: the wrapper sends stderr to a file of
	# its own first, where cat's libsovia says whether it continued the
	# connection (cat closes stderr before it exits: no statistics line).
	# It forks nothing (a command substitution would be a second holder
	# of the connection, which then stays on TCP).
	cat >"$d/svc" <<EOF
#!/bin/sh
exec 2>>"$RAW/inetd.$med.svc.\$\$.err"
export SOVIA_LOG=info
exec cat
EOF
	chmod 755 "$d/svc"
	echo "$IP:$INETD_PORT stream tcp nowait root $d/svc svc" >"$d/inetd.conf"
	note "inetd, $med, port $INETD_PORT"
	# -d: debug, in the foreground; -E: keep the environment (LD_PRELOAD,
	# SOVIA_STATS) for the services it starts.
	# shellcheck disable=SC2046
	bg "$RAW/inetd.$med.out" "$RAW/inetd.$med.err" \
		timeout -k 5 300 env $(medium_env "$med") inetd -d -E "$d/inetd.conf"
	local pid=$BG
	SRV_FILES=("$RAW/inetd.$med.err")
	if ! wait_port "$INETD_PORT" 60 "$pid"; then
		result inetd "echo${INETD_MB}MB" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "inetd did not start"
		stop_bg "$pid"
		return
	fi
	# shellcheck disable=SC2046
	PRE_INETD=$(preloaded $(pgrep -g "$pid" -x inetd))
	local got="$SCRATCH/inetd.got"
	mark_servers
	s0=$(snap) t0=$(now)
	# shellcheck disable=SC2046
	timeout -k 5 300 env $(medium_env "$med") nc -N "$IP" "$INETD_PORT" <"$SCRATCH/inetd.in" \
		>"$got" 2>"$RAW/inetd.$med.nc.err"
	rc=$?
	t1=$(now)
	sleep 1
	s1=$(snap)
	secs=$(elapsed "$t0" "$t1")
	st=failed bv=0 why="nc exit $rc, $(stat -c %s "$got" 2>/dev/null) bytes back"
	[ "$rc" = 0 ] && cmp -s "$got" "$SCRATCH/inetd.in" && st=ok bv=$((2 * INETD_MB * 1048576)) why=""
	rm -f "$got"
	echo "$RAW/inetd.$med.nc.err" >"$RAW/.cl"
	server_delta "$RAW/inetd.$med.srv" "$RAW/inetd.$med.svc.*.err"
	local pre
	pre=$(grep -c "continued after the exec" "$RAW/inetd.$med.srv" || true)
	result inetd "echo${INETD_MB}MB" "$med" "$st" "$bv" "$(mb_s "$bv" "$secs")" MiB/s "$secs" "$RAW/.cl" \
		"$RAW/inetd.$med.srv" "$s0" "$s1" "${why:+$why; }both_ways inetd_preloaded=$PRE_INETD svc_continued=${pre:-0}"
	stop_bg "$pid"
}

# ======================= sovia-echo-fork =======================
ECHO_PORT=18890
echo_medium() { # medium
	local med=$1 s0 s1 t0 t1 rc src secs st why bv
	local ef=$BUILD/bin/sovia-echo-fork
	[ -x "$ef" ] || {
		result echo-fork "echo${ECHO_MB}MB" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "no $ef"
		return
	}
	ECHO_PORT=$((ECHO_PORT + 1))
	note "sovia-echo-fork, $med, port $ECHO_PORT"
	# shellcheck disable=SC2046
	bg "$RAW/echo.$med.server.out" "$RAW/echo.$med.server.err" \
		timeout -k 5 400 env $(medium_env "$med") "$ef" -s "$ECHO_PORT" 1
	local pid=$BG
	SRV_FILES=("$RAW/echo.$med.server.err")
	if ! wait_port "$ECHO_PORT" 60 "$pid"; then
		result echo-fork "echo${ECHO_MB}MB" "$med" failed 0 0 - 0 /dev/null "" "0 0 0 0" "0 0 0 0" "server did not start"
		stop_bg "$pid"
		return
	fi
	# shellcheck disable=SC2046
	local pre
	pre=$(preloaded $(pgrep -g "$pid" -x sovia-echo-fork))
	mark_servers
	s0=$(snap) t0=$(now)
	# shellcheck disable=SC2046
	timeout -k 5 300 env $(medium_env "$med") "$ef" -c "$IP" "$ECHO_PORT" $((ECHO_MB * 1048576)) 29 \
		>"$RAW/echo.$med.client.out" 2>"$RAW/echo.$med.client.err"
	rc=$?
	t1=$(now)
	# The server exits once its one child did (it prints OK then).
	local i
	for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	src=0
	kill -0 "$pid" 2>/dev/null && src=timeout
	stop_bg "$pid"
	s1=$(snap)
	secs=$(elapsed "$t0" "$t1")
	st=failed bv=0 why="client exit $rc; server $(head -c 100 "$RAW/echo.$med.server.out" | tr '\n' ' ')$src"
	if [ "$rc" = 0 ] && grep -q "^OK" "$RAW/echo.$med.client.out" &&
		grep -q "^OK 1 connections" "$RAW/echo.$med.server.out"; then
		st=ok bv=$((2 * ECHO_MB * 1048576)) why=""
	fi
	echo "$RAW/echo.$med.client.err" >"$RAW/.cl"
	server_delta "$RAW/echo.$med.srv" ""
	result echo-fork "echo${ECHO_MB}MB" "$med" "$st" "$bv" "$(mb_s "$bv" "$secs")" MiB/s "$secs" "$RAW/.cl" \
		"$RAW/echo.$med.srv" "$s0" "$s1" "${why:+$why; }both_ways srv_preloaded=$pre"
}

# ======================= the run =======================
note "bed: $SOVIA_BED_MODE, $DEV on ${NETDEV:-?} at $IP; library $LIB"
PG_READY=0
case " $PROGS " in *" postgres "*) pg_setup && PG_READY=1 ;; esac
for med in $MEDIA; do
	for p in $PROGS; do
		case $p in
		nginx) nginx_medium "$med" ;;
		postgres) pg_medium "$med" ;;
		inetd) inetd_medium "$med" ;;
		echo-fork) echo_medium "$med" ;;
		*) echo "servers.sh: unknown program $p" ;;
		esac
	done
done

# ======================= summary =======================
note "summary (rates under emulation are noise; compare the two media of one run)"
printf '%-10s %-16s %-9s %-7s %14s %12s %14s %7s %12s\n' prog workload medium status bytes_verified rate rdma_bytes share lo_bytes
sed 's/^RESULT //' "$RESULTS" | while read -r line; do
	g() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
	printf '%-10s %-16s %-9s %-7s %14s %12s %14s %7s %12s\n' "$(g prog)" "$(g workload)" "$(g medium)" \
		"$(g status)" "$(g bytes_verified)" "$(g rate) $(g unit)" "$(g rdma_bytes)" "$(g rdma_share)" "$(g lo_bytes)"
done
echo "ratios libsovia/tcp (rate):"
awk '{for (i = 2; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
      k = v["prog"] " " v["workload"]
      if (v["status"] == "ok") r[k, v["medium"]] = v["rate"]
      if (!(k in seen)) {seen[k] = 1; order[++n] = k}}
     END {for (i = 1; i <= n; i++) {k = order[i]
          if (r[k, "libsovia"] != "" && r[k, "tcp"] > 0) printf "  %-28s %.2f\n", k, r[k, "libsovia"] / r[k, "tcp"]
          else printf "  %-28s n/a\n", k}}' "$RESULTS"
echo "results: $RESULTS; logs: $RAW"
exit 0
