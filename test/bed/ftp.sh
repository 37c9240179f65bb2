#!/usr/bin/env bash
# FTP as in the SOVIA paper: Debian's ftpd (linux-ftpd, standalone with -D:
# it forks a child per session, and listens on the IPv6 wildcard, taking
# IPv4 sessions as IPv4-mapped addresses, as Debian runs it) and the ftp client (tnftp), both preloaded,
# move files of the paper's sizes (19,090,223 and 145,864,380 bytes) with
# get and put, in passive and active mode, byte-identically. The data
# connections must go over RDMA: both ends' statistics show the file on the
# QP, and the rxe device counted the packets.
#
# The control connection is accepted by the daemon, which forks at once and
# hands it to the session child; the child dup2()s it onto 0 and 1 and
# speaks through stdio (getc(stdin), printf): libsovia's FILEs take glibc's
# place at the dup2, and the connection goes to RDMA. Every data connection
# is created later, in the session child (passive: it listens and accepts;
# active: it connects from port 20 to the client's listener), and is
# upgraded.
#
# The login is a throwaway user that exists only for ftpd: ftpd runs in its
# own mount namespace, where copies of /etc/passwd, shadow and group with the
# user added are bound over the real ones, and where a file is bound over
# /dev/null, because ftpd sends its stderr (libsovia's statistics) there.
# Nothing outside that namespace changes: the test bed's guest shares the
# host's root file system.
#
# Then one session per mode moves the smaller file four times (get, put,
# get, put), and every one of the four data connections must go over RDMA,
# and so must the session's control connection (both ends end on RDMA,
# ftpd's commands and replies over the QP).
# In active mode ftpd switches its euid to root and back around each data
# connection's bind (port 20), after which the kernel refuses the RDMA
# files opened before: libsovia moves its rdma_cm ids to a channel of the
# new credentials and rings rxe's doorbell through ioctl (a library that
# did not kept the second to fourth connections on TCP).
#
# Sizes: SOVIA_IT_FTP_SIZES (default the paper's smaller, 19090223; the
# bigger, 145864380, proves nothing the smaller does not); modes and
# directions: SOVIA_IT_FTP_MODES (default "passive active") and
# SOVIA_IT_FTP_DIRS (default "get put"); SOVIA_IT_FTP_TIMEOUT bounds one
# transfer (default 600 s).
#
# SOVIA_IT_FTP_BENCH=1 times the transfers for the benchmark's table
# (bench/bed-run.sh) instead of testing libsovia: LIB may be any preload
# (rsockets') or "none" (kernel TCP), the file must still arrive intact,
# nothing is asserted about RDMA, and each transfer prints
# "FTPTIME <mode> <dir> <size> <seconds>".
. "$(dirname "$0")/lib.sh"
SIZES=${SOVIA_IT_FTP_SIZES:-19090223}
MODES=${SOVIA_IT_FTP_MODES:-passive active}
DIRS=${SOVIA_IT_FTP_DIRS:-get put}
TMO=${SOVIA_IT_FTP_TIMEOUT:-600} # per transfer, against hangs
BENCH=${SOVIA_IT_FTP_BENCH:-0}
[ "$LIB" = none ] && LIB=""
FTPD=/usr/sbin/in.ftpd
command -v ftp >/dev/null && [ -x $FTPD ] || fail "needs ftp and ftpd (test/setup-deps.sh)"
export SOVIA_LOG=${SOVIA_LOG:-info}
CTRL=21 # ftpd -D serves the "ftp" service's port
FTPD_PID=""
stop_ftpd() { [ -z "$FTPD_PID" ] || kill "$FTPD_PID" 2>/dev/null || true; }
trap 'stop_ftpd; kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

# The throwaway login, in copies of the account files.
chmod 755 "$WORK"
mkdir -p "$WORK/etc" "$WORK/home"
FTPUSER=soviaftp
getent passwd "$FTPUSER" >/dev/null && fail "user $FTPUSER exists already"
uid=64990
while getent passwd $uid >/dev/null || getent group $uid >/dev/null; do uid=$((uid + 1)); done
PW=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
cp /etc/passwd /etc/shadow /etc/group "$WORK/etc/"
echo "$FTPUSER:x:$uid:$uid:libsovia ftp test:$WORK/home:/bin/bash" >>"$WORK/etc/passwd"
echo "$FTPUSER:$(openssl passwd -6 "$PW"):19000:0:99999:7:::" >>"$WORK/etc/shadow"
echo "$FTPUSER:x:$uid:" >>"$WORK/etc/group"
chown "$uid:$uid" "$WORK/home"
: >"$WORK/ftpd.err"
chmod 666 "$WORK/ftpd.err"

# Run "$@" (preloaded) in a mount namespace of its own that has the user and
# sees $WORK/ftpd.err as /dev/null.
in_ftpd_ns() {
	unshare -m --propagation private -- sh -c '
		w=$1 lib=$2; shift 2
		for f in passwd shadow group; do mount --bind "$w/etc/$f" /etc/$f || exit 1; done
		mount --bind "$w/ftpd.err" /dev/null || exit 1
		exec env LD_PRELOAD="$lib" "$@"' sh "$WORK" "$LIB" "$@"
}

# The statistics lines of the data connections (not the control port's):
# by the two addresses' ports (the 4th and 6th fields), since a counter
# such as "timeout:21 " further on must not hide a line.
data_lines() {
	{ grep -h "libsovia stats" "$@" || true; } |
		awk -v p=":$CTRL" 'function is_ctrl(a) { return substr(a, length(a) - length(p) + 1) == p }
			!is_ctrl($4) && !is_ctrl($6)'
}
dstat() { # $1: field, $2...: files; summed over the data connections
	local f=$1
	shift
	data_lines "$@" | sed -n "s/.* $f=\([0-9]*\).*/\1/p" | awk '{s += $1} END {print s + 0}'
}

# One session, one transfer: $1 passive|active, $2 get|put, $3 size.
transfer() {
	local mode=$1 dir=$2 size=$3 pas=on
	[ "$mode" = active ] && pas=off
	local src=$WORK/home/f$size
	local cmd
	if [ "$dir" = get ]; then
		rm -f "$WORK/got"
		cmd="get f$size $WORK/got"
	else
		rm -f "$WORK/home/up"
		cmd="put $src up"
	fi
	local lines0 p0 t0
	lines0=$(wc -l <"$WORK/ftpd.err") p0=$(rxe_pkts) t0=$(date +%s.%N)
	local rc=0
	LD_PRELOAD=$LIB timeout -k 10 "$TMO" ftp -n -v "$IP" $CTRL >"$WORK/ftp.out" 2>"$WORK/client.err" <<-EOF || rc=$?
		user $FTPUSER $PW
		binary
		passive $pas
		$cmd
		quit
	EOF
	if [ "$rc" -ne 0 ]; then
		echo "--- ftp's output:" >&2
		cat "$WORK/ftp.out" >&2
		fail "$mode $dir $size: ftp exited with $rc"
	fi
	local t1
	t1=$(date +%s.%N)
	grep -q "^226 " "$WORK/ftp.out" || { cat "$WORK/ftp.out" >&2; fail "$mode $dir $size: no 226 reply"; }
	local out=$WORK/got
	[ "$dir" = put ] && out=$WORK/home/up
	[ "$(md5sum <"$out" | cut -d' ' -f1)" = "${MD5[$size]}" ] ||
		fail "$mode $dir $size: the file differs ($(stat -c %s "$out") bytes)"
	rm -f "$out"
	local dp=$(($(rxe_pkts) - p0)) secs
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
	if [ "$BENCH" = 1 ]; then
		echo "FTPTIME $mode $dir $size $secs"
		return 0
	fi

	# The stats: the client's file, and what ftpd wrote during this session.
	# A connection on RDMA prints its line when its close has finished
	# (the helper thread, once the FIN is delivered), which may come after
	# ftpd's 226: wait for both ends' lines, within the session's exit.
	local i
	for i in $(seq 300); do
		tail -n +$((lines0 + 1)) "$WORK/ftpd.err" >"$WORK/server.session"
		[ -n "$(data_lines "$WORK/server.session")" ] &&
			[ -n "$(data_lines "$WORK/client.err")" ] && break
		sleep 0.1
	done
	local snd=$WORK/server.session rcv=$WORK/client.err
	[ "$dir" = put ] && snd=$WORK/client.err rcv=$WORK/server.session
	data_lines "$snd" "$rcv" | cut -c1-200
	local n rb tb rr
	n=$(data_lines "$snd" | grep -c " state=rdma " || true)
	rb=$(dstat rdma_tx_bytes "$snd")
	tb=$(dstat tcp_tx_bytes "$snd")
	rr=$(dstat rdma_rx_bytes "$rcv")
	[ "$n" -ge 1 ] || fail "$mode $dir $size: the sender's data connection was not on RDMA" \
		"(looked $i times for the lines; client.err: $(stat -c '%s bytes, changed %z' "$WORK/client.err"), now $(date '+%T.%N'))"
	# The first transfer is the two hosts' first contact: its first
	# megabytes go over TCP while the upgrade runs. From then on both ends
	# know each other (the peer table), their new connections hold their
	# first writes for the QP, and at least 90% of each file goes over it.
	local want=$((size * 9 / 10))
	[ "$TRANSFERS" = 0 ] && want=$((size / 2))
	TRANSFERS=$((TRANSFERS + 1))
	[ "$rb" -ge "$want" ] && [ "$rr" -ge "$want" ] ||
		fail "$mode $dir $size: RDMA carried only $rb bytes (received $rr; want $want)"
	[ $((rb + tb)) -eq "$size" ] || fail "$mode $dir $size: the sender sent $((rb + tb)) bytes"
	[ "$dp" -ge $((size / 2 / 4096)) ] || fail "$mode $dir $size: rxe sent only $dp packets"
	printf '%s %s %d: identical in %.1f s; sender rdma_tx_bytes=%d tcp_tx_bytes=%d; receiver rdma_rx_bytes=%d; rxe packets +%d\n' \
		"$mode" "$dir" "$size" "$secs" \
		"$rb" "$tb" "$rr" "$dp"
}

# One session, four transfers of the file of $2 bytes (get, put, get, put):
# $1 passive|active. Each data connection's sender (the end whose line
# shows the whole file sent) sent at least 90% of it over RDMA.
session() {
	local mode=$1 size=$2 pas=on
	[ "$mode" = active ] && pas=off
	local outs="$WORK/got1 $WORK/got2 $WORK/home/up1 $WORK/home/up2" f
	rm -f $outs
	local p0 rc=0
	lines0=$(wc -l <"$WORK/ftpd.err") p0=$(rxe_pkts) # lines0: the caller's too
	LD_PRELOAD=$LIB timeout -k 10 $((TMO * 4)) ftp -n -v "$IP" $CTRL >"$WORK/ftp.out" 2>"$WORK/client.err" <<-EOF || rc=$?
		user $FTPUSER $PW
		binary
		passive $pas
		get f$size $WORK/got1
		put $WORK/home/f$size up1
		get f$size $WORK/got2
		put $WORK/home/f$size up2
		quit
	EOF
	[ "$rc" -eq 0 ] || { cat "$WORK/ftp.out" >&2; fail "session $mode: ftp exited with $rc"; }
	[ "$(grep -c '^226 ' "$WORK/ftp.out")" -eq 4 ] ||
		{ cat "$WORK/ftp.out" >&2; fail "session $mode: not four transfers complete"; }
	for f in $outs; do
		[ "$(md5sum <"$f" | cut -d' ' -f1)" = "${MD5[$size]}" ] ||
			fail "session $mode: $f differs ($(stat -c %s "$f") bytes)"
	done
	rm -f $outs
	local i
	for i in $(seq 300); do
		tail -n +$((lines0 + 1)) "$WORK/ftpd.err" >"$WORK/server.session"
		[ "$(data_lines "$WORK/server.session" | wc -l)" -ge 4 ] &&
			[ "$(data_lines "$WORK/client.err" | wc -l)" -ge 4 ] && break
		sleep 0.1
	done
	data_lines "$WORK/server.session" "$WORK/client.err" | cut -c1-200
	local senders
	senders=$(data_lines "$WORK/server.session" "$WORK/client.err" |
		sed -n 's/.* rdma_tx_bytes=\([0-9]*\).* tcp_tx_bytes=\([0-9]*\).*/\1 \2/p' |
		awk -v n="$size" '$1 + $2 == n {print $1}')
	[ "$(echo "$senders" | grep -c .)" -eq 4 ] ||
		fail "session $mode: $(echo "$senders" | grep -c .) senders of the whole file, not 4" \
			"(data lines: server $(data_lines "$WORK/server.session" | wc -l), client" \
			"$(data_lines "$WORK/client.err" | wc -l), after $i looks; log lines before: $lines0)"
	local want=$((size * 9 / 10)) rb
	for rb in $senders; do
		[ "$rb" -ge "$want" ] || fail "session $mode: a data connection sent only $rb bytes over RDMA (want $want): $senders"
	done
	local dp=$(($(rxe_pkts) - p0))
	[ "$dp" -ge $((size * 2 / 4096)) ] || fail "session $mode: rxe sent only $dp packets"
	echo "session $mode: 4 transfers of $size bytes, identical; over RDMA: $(echo $senders); rxe packets +$dp"
}

# The control connection's statistics line: the server's (local port 21,
# the 4th field) or the client's (peer port 21, the 6th).
ctrl_line() { # $1 file, $2 field
	{ grep -h "libsovia stats" "$1" || true; } |
		awk -v p=":$CTRL" -v f="$2" 'substr($f, length($f) - length(p) + 1) == p' | tail -1
}
# The last session's control connection ended on RDMA at both ends, with
# ftpd's commands and replies over the QP.
control_on_rdma() { # $1 label
	local i sl cl l srx stx
	for i in $(seq 100); do
		tail -n +$((lines0 + 1)) "$WORK/ftpd.err" >"$WORK/server.session"
		[ -n "$(ctrl_line "$WORK/server.session" 4)" ] && break
		sleep 0.1
	done
	sl=$(ctrl_line "$WORK/server.session" 4) cl=$(ctrl_line "$WORK/client.err" 6)
	echo "$1 control: server: ${sl:0:200}"
	echo "$1 control: client: ${cl:0:200}"
	for l in "$sl" "$cl"; do
		[[ "$l" == *" state=rdma fallback=none "* ]] ||
			fail "$1: the control connection did not end on RDMA: ${l:-no line}"
	done
	srx=$(sed -n 's/.* rdma_rx_bytes=\([0-9]*\).*/\1/p' <<<"$sl")
	stx=$(sed -n 's/.* rdma_tx_bytes=\([0-9]*\).*/\1/p' <<<"$sl")
	[ "${srx:-0}" -gt 0 ] && [ "${stx:-0}" -gt 0 ] ||
		fail "$1: ftpd's commands and replies did not go over RDMA: $sl"
}

TRANSFERS=0
rm -f /dev/shm/libsovia-peers.* # a first contact, whatever ran before
declare -A MD5
for size in $SIZES; do
	head -c "$size" /dev/urandom >"$WORK/home/f$size"
	MD5[$size]=$(md5sum <"$WORK/home/f$size" | cut -d' ' -f1)
done
chown -R "$uid:$uid" "$WORK/home"

! ss -ltn "sport = :$CTRL" | grep -q LISTEN || fail "port $CTRL is taken"
in_ftpd_ns $FTPD -D -n || fail "ftpd -D did not start"
wait_port $CTRL
# ss shows a dual-stack IPv6 wildcard as "*" ([::] when IPv6 only).
ss -ltnH "sport = :$CTRL" | grep -Eq '(\*|\[::\]):'"$CTRL"'\b' ||
	fail "ftpd -D does not listen on the IPv6 wildcard: $(ss -ltnH "sport = :$CTRL")"
FTPD_PID=$(ss -ltnpH "sport = :$CTRL" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
[ -n "$FTPD_PID" ] || fail "no pid for ftpd"

for size in $SIZES; do
	for mode in $MODES; do
		for dir in $DIRS; do
			transfer $mode $dir "$size"
		done
	done
done
if [ "$BENCH" = 1 ]; then
	stop_ftpd
	exit 0
fi
for mode in $MODES; do
	session $mode "${SIZES%% *}"
	control_on_rdma "ftpd -D $mode"
done
stop_ftpd

# As Debian's ftpd package configures it: started by inetd (openbsd-inetd)
# for each control connection, with the connection as its stdin, stdout and
# stderr (a wrapper sends stderr to the log first). ftpd continues the
# connection inetd accepted and moves it to RDMA before the login, whose
# credential changes it survives; each session's data connections go over
# RDMA as above.
command -v inetd >/dev/null || fail "needs openbsd-inetd (bench/setup-deps.sh)"
for i in $(seq 100); do ! ss -ltn "sport = :$CTRL" | grep -q LISTEN && break; sleep 0.1; done
cat >"$WORK/ftpd-svc" <<SVC
#!/bin/sh
exec 2>>"$WORK/ftpd.err"
exec $FTPD -n
SVC
chmod 755 "$WORK/ftpd-svc"
echo "$IP:$CTRL stream tcp nowait root $WORK/ftpd-svc ftpd-svc" >"$WORK/inetd.conf"
# -d: in the foreground; -E: the environment (LD_PRELOAD) goes to ftpd.
in_ftpd_ns inetd -d -E "$WORK/inetd.conf" >"$WORK/inetd.out" 2>&1 &
wait_port $CTRL
FTPD_PID=$(ss -ltnpH "sport = :$CTRL" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
[ -n "$FTPD_PID" ] || fail "no pid for inetd"
for mode in $MODES; do
	# Each ftpd reopens its stderr on /dev/null (this file) with "w": it
	# truncates it. Emptied here first, the session's lines are all of it.
	: >"$WORK/ftpd.err"
	session $mode "${SIZES%% *}"
	control_on_rdma "inetd $mode"
done
stop_ftpd
echo "ftp: OK"
