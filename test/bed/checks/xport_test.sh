#!/bin/bash
# Protocol core + verbs transport smoke test; runs INSIDE the soft-RoCE test
# bed (test/bed/sovia-bed).
#
#   xport_test.sh BINARY              server and client on this guest, several
#                                     configurations (one way and duplex)
#   xport_test.sh BINARY two-hosts    role a = server, role b = client
#
# BINARY is sovia-xport-test. Uses SOVIA_BED_IP, and in two-hosts mode
# SOVIA_BED_ROLE / SOVIA_BED_PEER_IP. XPORT_TEST_BYTES sets the stream size
# of the one-way variants (default 32m; the default configuration sends the
# program's default of 64m). Every process runs under timeout(1): nothing
# hangs. Under qemu's emulated CPU the single-host run takes about 5 minutes:
# give sovia-bed --timeout 900 or more.
set -u

bin=${1:?usage: xport_test.sh BINARY [two-hosts]}
mode=${2:-single}
bytes=${XPORT_TEST_BYTES:-32m}
: "${SOVIA_BED_IP:?not set: run me inside test/bed/sovia-bed}"

if [[ ! -x $bin ]]; then
	echo "xport_test.sh: $bin is not an executable" >&2
	exit 1
fi

work=$(mktemp -d /tmp/xport-test.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT
failed=0

fail() {
	echo "FAIL: $*" >&2
	failed=1
}

# check NAME RC OUTFILE ERRFILE REGEX: exit status 0 and the OK line printed.
check() {
	local name=$1 rc=$2 out=$3 err=$4 re=$5 why=''
	sed "s/^/[$name] /" "$out"
	sed "s/^/[$name stderr] /" "$err" >&2
	case $rc in
	0) ;;
	2) why=' (DATA MISMATCH)' ;;
	124 | 137) why=' (timed out)' ;;
	esac
	if [[ $rc -ne 0 ]]; then
		fail "$name exited $rc$why"
	elif ! grep -Eq "$re" "$out"; then
		fail "$name exited 0 but printed no line matching '$re'"
	fi
}

SERVER_RE='^sovia-xport-test: OK server received [0-9]+ bytes'
CLIENT_RE='^sovia-xport-test: OK client sent [0-9]+ bytes'

# stat FILE NAME: the value of NAME= on the client's stats line.
stat() {
	sed -n "s/.*client stats:.* $2=\([0-9]*\).*/\1/p" "$1" | head -n 1
}

# run_pair NAME PORT [CLIENT OPTIONS...]: server in the background, the
# client retrying its connection while the server starts.
run_pair() {
	local name=$1 port=$2 spid src crc start
	shift 2
	start=$SECONDS
	echo "== $name: -b $bytes $* on $SOVIA_BED_IP:$port (${SOVIA_BED_DEV:-?})"
	timeout -k 5 300 "$bin" -s -a "$SOVIA_BED_IP" -p "$port" -t 60 \
		>"$work/$name.srv.out" 2>"$work/$name.srv.err" &
	spid=$!
	timeout -k 5 280 "$bin" -a "$SOVIA_BED_IP" -p "$port" -t 20 -b "$bytes" "$@" \
		>"$work/$name.cli.out" 2>"$work/$name.cli.err"
	crc=$?
	if [[ $crc -ne 0 ]]; then
		# The server would wait out its stall limit: don't sit through it.
		sleep 2
		kill "$spid" 2>/dev/null
	fi
	wait "$spid"
	src=$?
	check "$name server" "$src" "$work/$name.srv.out" "$work/$name.srv.err" "$SERVER_RE"
	check "$name client" "$crc" "$work/$name.cli.out" "$work/$name.cli.err" "$CLIENT_RE"
	echo "== $name: done in $((SECONDS - start)) s"
}

# Most of the stream must have gone zero copy under a small threshold.
check_zcopy() {
	local name=$1 out="$work/$1.cli.out" zc tx
	zc=$(stat "$out" tx_zcopy_bytes)
	tx=$(stat "$out" tx_bytes)
	if [[ -z $zc || -z $tx || $tx -eq 0 ]]; then
		fail "$name: no client stats"
	elif ((zc * 10 < tx * 9)); then
		fail "$name: only $zc of $tx bytes went zero copy"
	fi
}

run_one() {
	local role=$1 rc
	local args=(-p 7490 -T 120)
	echo "== two-hosts role $role: $SOVIA_BED_IP, peer ${SOVIA_BED_PEER_IP:-?}"
	case $role in
	a)
		timeout -k 5 480 "$bin" -s -a "$SOVIA_BED_IP" "${args[@]}" -t 300 \
			>"$work/srv.out" 2>"$work/srv.err"
		rc=$?
		check server "$rc" "$work/srv.out" "$work/srv.err" "$SERVER_RE"
		;;
	b)
		timeout -k 5 480 "$bin" -a "$SOVIA_BED_PEER_IP" "${args[@]}" -t 300 -b "$bytes" \
			>"$work/cli.out" 2>"$work/cli.err"
		rc=$?
		check client "$rc" "$work/cli.out" "$work/cli.err" "$CLIENT_RE"
		;;
	*)
		fail "SOVIA_BED_ROLE must be a or b, got '$role'"
		;;
	esac
}

case $mode in
single)
	run_pair default 7481 -b 64m
	run_pair window4 7482 -w 4
	run_pair zcopy 7483 -z 1024
	check_zcopy zcopy
	run_pair zcopy-all 7484 -z 1
	check_zcopy zcopy-all
	run_pair nodelay 7485 -n 1
	run_pair small-bufs 7486 -B 4096 -w 8
	# Both directions at once (smaller: each end also verifies).
	run_pair duplex 7487 -D -b 16m
	run_pair duplex-window4 7488 -D -b 4m -w 4
	;;
two-hosts)
	: "${SOVIA_BED_PEER_IP:?not set: run me under sovia-bed --two-hosts}"
	run_one "${SOVIA_BED_ROLE:-}"
	;;
*)
	echo "usage: xport_test.sh BINARY [two-hosts]" >&2
	exit 1
	;;
esac

if [[ $failed -ne 0 ]]; then
	echo "xport_test.sh: FAILED" >&2
	exit 1
fi
echo "xport_test.sh: PASSED"
