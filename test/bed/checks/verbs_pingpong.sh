#!/bin/bash
# Verbs smoke test; runs INSIDE the soft-RoCE test bed (test/bed/sovia-bed).
#
#   verbs_pingpong.sh BINARY              server and client on this guest
#   verbs_pingpong.sh BINARY two-hosts    role a = server, role b = client
#
# Uses SOVIA_BED_IP, and in two-hosts mode SOVIA_BED_ROLE / SOVIA_BED_PEER_IP.
# Every process runs under timeout(1), so nothing here can hang: a server that
# never sees a client gives up on its own (-t) and is killed past that.
set -u

bin=${1:?usage: verbs_pingpong.sh BINARY [two-hosts]}
mode=${2:-single}
: "${SOVIA_BED_IP:?not set: run me inside test/bed/sovia-bed}"

if [[ ! -x $bin ]]; then
	echo "verbs_pingpong.sh: $bin is not an executable" >&2
	exit 1
fi

work=$(mktemp -d /tmp/verbs-pingpong.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT
failed=0

fail() {
	echo "FAIL: $*" >&2
	failed=1
}

# check NAME RC OUTFILE ERRFILE REGEX: exit status 0 and the OK line printed.
check() {
	local name=$1 rc=$2 out=$3 err=$4 re=$5
	sed "s/^/[$name stdout] /" "$out"
	sed "s/^/[$name stderr] /" "$err" >&2
	if [[ $rc -ne 0 ]]; then
		fail "$name exited $rc$([[ $rc -eq 124 || $rc -eq 137 ]] && echo ' (timed out)')"
	elif ! grep -Eq "$re" "$out"; then
		fail "$name exited 0 but did not print a line matching '$re'"
	fi
}

SERVER_RE='^verbs-pingpong: server OK [0-9]+ iterations of [0-9]+ bytes'
CLIENT_RE='^verbs-pingpong: OK [0-9]+ iterations of [0-9]+ bytes, median RTT [0-9.]+ us$'

# run_pair PORT ITERS SIZE: server in the background, client retrying to it.
run_pair() {
	local port=$1 iters=$2 size=$3 tag="p$1" spid src crc start
	local args=(-p "$port" -n "$iters" -S "$size")
	start=$SECONDS
	echo "== $iters x $size bytes on $SOVIA_BED_IP:$port (${SOVIA_BED_DEV:-?})"
	timeout -k 5 180 "$bin" -s -a "$SOVIA_BED_IP" "${args[@]}" -t 120 \
		>"$work/$tag.srv.out" 2>"$work/$tag.srv.err" &
	spid=$!
	timeout -k 5 150 "$bin" -a "$SOVIA_BED_IP" "${args[@]}" -t 60 \
		>"$work/$tag.cli.out" 2>"$work/$tag.cli.err"
	crc=$?
	if [[ $crc -ne 0 ]]; then
		# The server would only wait out its own -t: don't sit through that.
		sleep 2
		kill "$spid" 2>/dev/null
	fi
	wait "$spid"
	src=$?
	check server "$src" "$work/$tag.srv.out" "$work/$tag.srv.err" "$SERVER_RE"
	check client "$crc" "$work/$tag.cli.out" "$work/$tag.cli.err" "$CLIENT_RE"
	echo "== done in $((SECONDS - start)) s"
}

# run_one ROLE: one side of the two-hosts test. The guests may come up tens
# of seconds apart, hence the long windows.
run_one() {
	local role=$1 rc
	local args=(-p 7471 -n 1000 -S 64)
	echo "== two-hosts role $role: $SOVIA_BED_IP, peer ${SOVIA_BED_PEER_IP:-?}"
	case $role in
	a)
		timeout -k 5 420 "$bin" -s -a "$SOVIA_BED_IP" "${args[@]}" -t 300 \
			>"$work/srv.out" 2>"$work/srv.err"
		rc=$?
		check server "$rc" "$work/srv.out" "$work/srv.err" "$SERVER_RE"
		;;
	b)
		timeout -k 5 420 "$bin" -a "$SOVIA_BED_PEER_IP" "${args[@]}" -t 300 \
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
	run_pair 7471 1000 64
	# Larger than any RoCE MTU: exercises multi-packet RC messages.
	run_pair 7472 200 65536
	;;
two-hosts)
	: "${SOVIA_BED_PEER_IP:?not set: run me under sovia-bed --two-hosts}"
	run_one "${SOVIA_BED_ROLE:-}"
	;;
*)
	echo "usage: verbs_pingpong.sh BINARY [two-hosts]" >&2
	exit 1
	;;
esac

if [[ $failed -ne 0 ]]; then
	echo "verbs_pingpong.sh: FAILED" >&2
	exit 1
fi
echo "verbs_pingpong.sh: PASSED"
