#!/usr/bin/env bash
# Real servers that fork, both ends preloaded (issue 29): each workload's
# data verified and at least 80% of its bytes over RDMA, by its clients'
# statistics (bench/servers.sh says how it counts them):
#   nginx as Debian configures it (a master and 2 prefork workers that
#     accept on the inherited listener and drop root, epoll, sendfile):
#     curl fetches a 1 MB and an 8 MB file (cmp), each a fresh process
#     whose first connection is a first contact, and 200 small requests on
#     4 keep-alive connections (every answer checked);
#   PostgreSQL, a backend forked per connection (accept then fork): pgbench
#     -i, pgbench with 8 clients for 10 s (exit 0, no failed transaction),
#     and a COPY ... TO STDOUT of about 8 MB (size and md5 against the
#     server's own);
#   sovia-echo-fork, accept then fork: 8 MB each way, checked byte by byte;
#   openbsd-inetd, which forks and execs cat with the connection on its
#     stdin and stdout: nc sends 8 MB and reads them back (cmp), and cat
#     must have continued the connection after the exec.
# The sizes prove the share (a connection that stayed on TCP, or went
# back, shows in any of them); bench/servers.sh's defaults measure rates.
# Every client connection must end on RDMA. bench/servers.sh drives the
# programs (with the libsovia medium only); this test judges its results.
#
# SOVIA_IT_SERVERS_PROGS overrides the programs ("nginx postgres echo-fork
# inetd").
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROGS=${SOVIA_IT_SERVERS_PROGS:-nginx postgres echo-fork inetd}
MIN_PCT=80
export SOVIA_SRV_BIG_MB=${SOVIA_SRV_BIG_MB:-8} SOVIA_SRV_SMALL_REQS=${SOVIA_SRV_SMALL_REQS:-200}
export SOVIA_SRV_PGBENCH_SECS=${SOVIA_SRV_PGBENCH_SECS:-10} SOVIA_SRV_COPY_MB=${SOVIA_SRV_COPY_MB:-8}
export SOVIA_SRV_INETD_MB=${SOVIA_SRV_INETD_MB:-8} SOVIA_SRV_ECHO_MB=${SOVIA_SRV_ECHO_MB:-8}

"$ROOT/bench/servers.sh" --lib "$LIB" --build "$BUILD" --out "$WORK/out" --media libsovia \
	--progs "$PROGS" >"$WORK/servers.out" 2>"$WORK/servers.err" ||
	{ cat "$WORK/servers.out" >&2; fail "bench/servers.sh failed"; }
RES=$WORK/out/results.txt
[ -s "$RES" ] || { cat "$WORK/servers.out" >&2; fail "no results"; }

field() { # line name
	sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"
}

# $1 program, $2 workload, $3 1 when the workload's bytes are checked here
judge() {
	local line st rb tb states n pct
	line=$(grep "^RESULT prog=$1 workload=$2 medium=libsovia " "$RES") ||
		fail "$1 $2: no result"
	st=$(field "$line" status)
	[ "$st" = ok ] || fail "$1 $2: $st ($(field "$line" detail))"
	if [ "$3" = 1 ]; then
		[ "$(field "$line" bytes_verified)" -gt 0 ] || fail "$1 $2: no bytes verified"
	fi
	rb=$(field "$line" rdma_bytes) tb=$(field "$line" tcp_bytes)
	[ $((rb + tb)) -gt 0 ] || fail "$1 $2: its clients printed no statistics"
	pct=$((rb * 100 / (rb + tb)))
	[ "$pct" -ge "$MIN_PCT" ] ||
		fail "$1 $2: $pct% of the bytes over RDMA ($rb of $((rb + tb))), below $MIN_PCT%"
	states=$(field "$line" client_states)
	n=$(field "$line" client_lines)
	[ "$states" = "rdma:$n" ] ||
		fail "$1 $2: not every client connection ended on RDMA: $states ($(field "$line" client_fallbacks))"
	echo "$1 $2: $pct% of $((rb + tb)) bytes over RDMA, $n client connection(s) on RDMA"
}

for p in $PROGS; do
	case $p in
	nginx)
		judge nginx 1MB 1
		judge nginx "${SOVIA_SRV_BIG_MB}MB" 1
		judge nginx "small1024Bx$SOVIA_SRV_SMALL_REQS" 1
		;;
	postgres)
		judge postgres pgbench-init 0
		judge postgres pgbench-c8 0
		judge postgres "copy${SOVIA_SRV_COPY_MB}MB" 1
		;;
	echo-fork) judge echo-fork "echo${SOVIA_SRV_ECHO_MB}MB" 1 ;;
	inetd)
		judge inetd "echo${SOVIA_SRV_INETD_MB}MB" 1
		line=$(grep "^RESULT prog=inetd workload=echo${SOVIA_SRV_INETD_MB}MB medium=libsovia " "$RES")
		[ "$(field "$line" detail | sed -n 's/.*svc_continued=\([0-9]*\).*/\1/p')" = 1 ] ||
			fail "inetd: cat did not continue the connection after the exec ($(field "$line" detail))"
		;;
	*) fail "no judgement for $p" ;;
	esac
done
echo "servers: OK"
