#!/usr/bin/env bash
# sovia-stat on this host (no RDMA: connections stay on TCP, with their
# reason): it finds a preloaded process's connection and reports it, in
# the table and as JSON; -p narrows it and fails clearly for a process
# without libsovia; another user is told nothing of root's connections,
# while root sees every user's; --watch repeats; a bad option is refused;
# a stopped process, or one that answers with something else than a view,
# neither holds sovia-stat nor shows in its listing.
#   test/stat.sh LIBSOVIA_SO SOVIA_STAT
set -euo pipefail
lib=$(realpath "${1:?usage: $0 LIBSOVIA_SO SOVIA_STAT}")
stat=${2:?usage: $0 LIBSOVIA_SO SOVIA_STAT}
work=$(mktemp -d /tmp/sovia-stat.XXXXXX)
chmod 755 "$work"
# nobody's processes load the module and run sovia-stat: copies anyone can
# read, wherever the build tree is (a clone under /root is not).
cp "$lib" "$work/libsovia.so"
cp "$(realpath "$stat")" "$work/sovia-stat"
chmod 755 "$work/libsovia.so" "$work/sovia-stat"
lib=$work/libsovia.so stat=$work/sovia-stat
pids=()
cleanup() {
	# The clients' nc and the servers end with their connections; the
	# FIFOs' readers once a writer opens them.
	kill "${pids[@]}" 2>/dev/null || true
	for f in "$work"/hold*; do
		[ -p "$f" ] && timeout 2 sh -c ": >'$f'" || true
	done
	# shellcheck disable=SC2046
	kill $(jobs -p) 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
# The system's python3 (another user may not reach a user's own).
py=$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; }

listen() { # PORT: a plain server that holds the connection open
	nc -l 127.0.0.1 "$1" >/dev/null </dev/null &
	pids+=($!)
	local i
	for _ in $(seq 100); do
		ss -ltnH "sport = :$1" | grep -q . && return
		sleep 0.1
	done
	fail "no listener on $1"
}
# A preloaded client that sends 5 bytes and holds the connection open
# until the FIFO is written; its pid once its view lists the connection.
client() { # PORT FIFO RUNNER...
	local port=$1 fifo=$2
	shift 2
	mkfifo "$fifo"
	chmod 666 "$fifo"
	"$@" env LD_PRELOAD="$lib" sh -c "{ printf hello; cat '$fifo'; } | nc 127.0.0.1 $port" &
}
# PID [FILTER]: wait (bounded) until PID's view lists a connection for
# which the jq FILTER holds (default: any), print the view.
view_of() {
	local out filter=${2:-true}
	for _ in $(seq 300); do
		out=$("$stat" -p "$1" --json 2>/dev/null || true)
		if [ -n "$out" ] && jq -e "[.connections[] | select($filter)] | length > 0" <<<"$out" \
			>/dev/null 2>&1; then
			echo "$out"
			return
		fi
		sleep 0.1
	done
	fail "process $1's view never listed a connection with $filter: $out"
}
# PID WORDS WHAT: sovia-stat -p PID ends (bounded: a hang is 124) with
# status 1 and WORDS.
refused() {
	local out st=0
	out=$(timeout 60 "$stat" -p "$1" 2>&1) || st=$?
	[ "$st" = 1 ] || fail "$3: status $st: $out"
	grep -q "$2" <<<"$out" || fail "$3 says: $out"
}
pid_from() { # FILE: the pid a started program prints first there
	local p
	for _ in $(seq 100); do
		p=$(head -1 "$1")
		[ -n "$p" ] && { echo "$p"; return; }
		sleep 0.1
	done
	fail "no pid in $1: $(cat "$1")"
}
nc_pid() { # PORT: the preloaded nc client connected to it
	local p
	for _ in $(seq 100); do
		p=$(ss -tnpH "dport = :$1" | sed -n 's/.*"nc",pid=\([0-9]*\).*/\1/p' | head -1)
		[ -n "$p" ] && { echo "$p"; return; }
		sleep 0.1
	done
	fail "no nc connected to $1"
}

listen 5941
client 5941 "$work/hold" env
pid=$(nc_pid 5941)
pids+=("$pid")
# Its 5 bytes sent and its fallback known (loopback has no RDMA path).
json=$(view_of "$pid" '.state == "fallback" and .tcp_tx_bytes == 5')
echo "== root's client: $json"
c=$(jq -c '.connections[0]' <<<"$json")
[ "$(jq -r .pid <<<"$c")" = "$pid" ] || fail "pid: $c"
[ "$(jq -r .comm <<<"$c")" = nc ] || fail "comm: $c"
[ "$(jq -r .role <<<"$c")" = client ] || fail "role: $c"
[ "$(jq -r .peer <<<"$c")" = 127.0.0.1:5941 ] || fail "peer: $c"
[ "$(jq -r .tx <<<"$c")/$(jq -r .rx <<<"$c")" = tcp/tcp ] || fail "media: $c"
[ "$(jq -r .state <<<"$c")" = fallback ] || fail "state: $c"
fb=$(jq -r .fallback <<<"$c")
[ -n "$fb" ] && [ "$fb" != none ] || fail "no fallback reason: $c"
[ "$(jq -r .tcp_tx_bytes <<<"$c")" = 5 ] || fail "tcp_tx_bytes: $c"
[ "$(jq -r .rdma_tx_bytes <<<"$c")" = 0 ] || fail "rdma_tx_bytes: $c"
fd=$(jq -r .fd <<<"$c")
[ -S "/proc/$pid/fd/$fd" ] || fail "fd $fd of $pid is not a socket"

table=$("$stat")
head -1 <<<"$table" | grep -q '^PID .*COMMAND .*FALLBACK .*TTR' || fail "table header: $(head -1 <<<"$table")"
grep -Eq "^$pid +nc +$fd +client +127\.0\.0\.1:[0-9]+ +127\.0\.0\.1:5941 +tcp +tcp +fallback +$fb " \
	<<<"$table" || fail "the table lacks the connection: $table"

# Another user's process: root sees it; that user does not see root's.
listen 5942
client 5942 "$work/hold2" as_nobody
npid=$(nc_pid 5942)
pids+=("$npid")
[ "$(stat -c %U "/proc/$npid")" = nobody ] || fail "nc on 5942 is not nobody's"
view_of "$npid" >/dev/null
"$stat" --json | jq -e --argjson p "$npid" '[.connections[] | select(.pid == $p)] | length == 1' \
	>/dev/null || fail "root does not see nobody's connection"
if out=$(as_nobody "$stat" -p "$pid" 2>&1); then
	fail "nobody read root's process: $out"
fi
grep -q "not yours to see" <<<"$out" || fail "nobody's refusal says: $out"
as_nobody "$stat" --json | jq -e --argjson p "$pid" '[.connections[] | select(.pid == $p)] | length == 0' \
	>/dev/null || fail "nobody sees root's connection"
as_nobody "$stat" --json | jq -e --argjson p "$npid" '[.connections[] | select(.pid == $p)] | length == 1' \
	>/dev/null || fail "nobody does not see its own connection"
# sovia-stat as nobody does not even ask root's process; asked anyway,
# it cannot reach it: root's views are in a directory of root's alone.
as_nobody "$py" -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(10)
try:
    s.connect("/dev/shm/libsovia-stat.0/%s" % sys.argv[1])
    data, anc, flags, _ = s.recvmsg(16, socket.CMSG_SPACE(64))
    print(repr(data), len(anc))
except PermissionError:
    print("no entry")' "$pid" >"$work/refusal" 2>&1 || fail "nobody's raw ask: $(cat "$work/refusal")"
[ "$(cat "$work/refusal")" = "no entry" ] || fail "root's process answered nobody: $(cat "$work/refusal")"
[ "$(stat -c '%U %a' /dev/shm/libsovia-stat.0)" = "root 700" ] ||
	fail "root's views are in: $(stat -c '%U %a' /dev/shm/libsovia-stat.0)"
echo "== nobody sees its own connection and not root's; root sees both"

if out=$("$stat" -p $$ 2>&1); then
	fail "-p of a process without libsovia succeeded: $out"
fi
grep -q "has no libsovia view" <<<"$out" || fail "-p without libsovia says: $out"
set +e
"$stat" --bogus >/dev/null 2>&1
[ $? = 2 ] || fail "a bad option's status is not 2"
"$stat" -p abc >/dev/null 2>&1
[ $? = 2 ] || fail "a bad pid's status is not 2"
timeout 2.5 "$stat" -p "$pid" --json --watch 1 >"$work/watch.out"
st=$?
set -e
[ "$st" = 124 ] || fail "--watch ended by itself ($st)"
[ "$(wc -l <"$work/watch.out")" -ge 1 ] || fail "--watch printed nothing"
jq -e '.connections[0].pid' <"$work/watch.out" >/dev/null || fail "--watch's JSON does not parse"

# A connection the program dup()ed is on two of its fds. Where libsovia
# holds it on a copy of its own (which depends on the moment of the dup),
# that copy is no fd of the program's: it shows as "-" (JSON null), else as
# one of the program's two.
listen 5943
LD_PRELOAD="$lib" "$py" -c '
import os, signal, socket
s = socket.create_connection(("127.0.0.1", 5943))
s.sendall(b"hello")
d = os.dup(s.fileno())
print(os.getpid(), s.fileno(), d, flush=True)
signal.pause()' >"$work/dup.out" &
pids+=($!)
read -r dpid fd1 fd2 <<<"$(pid_from "$work/dup.out")"
json=$(view_of "$dpid" '.tcp_tx_bytes == 5')
dfd=$(jq -r '.connections[0].fd' <<<"$json")
case "$dfd" in null | "$fd1" | "$fd2") ;; *) fail "a dup()ed connection's fd is none of $fd1, $fd2: $json" ;; esac
[ "$dfd" != null ] || dfd=-
"$stat" -p "$dpid" | grep -Eq "^$dpid +python3 +$dfd +client " || fail "the table's dup()ed fd: $("$stat" -p "$dpid")"
echo "== a dup()ed connection shows no fd of the program's"

# A process that does not answer (stopped) fills its backlog: each ask
# still ends (2 s for an answer, at once once the backlog is full), and
# the listing of every process goes on past it.
kill -STOP "$pid"
for i in $(seq 11); do
	refused "$pid" "not answering" "ask $i of a stopped process"
done
out=$(timeout 60 "$stat" --json) || fail "the listing with a stopped process: $?"
jq -e --argjson p "$npid" --argjson s "$pid" '([.connections[] | select(.pid == $p)] | length == 1)
	and ([.connections[] | select(.pid == $s)] | length == 0)' <<<"$out" \
	>/dev/null || fail "the listing past a stopped process: $out"
kill -CONT "$pid"
echo "== a stopped process is 'not answering', 11 times, and the listing goes past it"

# A process of the user's may answer as it likes: one that answers with
# something that is not a sealed view (here a pipe, which would hold a
# reader for ever) is refused, and the listing goes past it.
"$py" - >"$work/fake.out" 2>&1 <<'PY' &
import array, fcntl, os, socket
v = os.memfd_create("view", os.MFD_ALLOW_SEALING)
os.write(v, b"libsovia-stat 1 pid=0 version=0\nfd=3 role=client state=rdma\n")
fcntl.fcntl(v, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind("/dev/shm/libsovia-stat.0/%d" % os.getpid())
s.listen(8)
r, w = os.pipe()
print(os.getpid(), flush=True)
while True:
    c, _ = s.accept()
    # A pipe, which would hold a reader for ever; every other time a
    # sealed view with a second fd, which a reader must not keep.
    n = n + 1 if "n" in dir() else 0
    fds = [r] if n % 2 == 0 else [v, w]
    c.sendmsg([b"v"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    c.close()
PY
pids+=($!)
fake=$(pid_from "$work/fake.out")
refused "$fake" "answered with something that is not a view" "a fake view's answer"
refused "$fake" "answered with something that is not a view" "a fake view's two fds"
out=$(timeout 60 "$stat" --json) || fail "the listing with a fake view: $?"
jq -e --argjson p "$fake" '[.connections[] | select(.pid == $p)] | length == 0' <<<"$out" \
	>/dev/null || fail "the listing shows the fake view's: $out"
echo "== a pipe for a view is refused, and the listing goes past it"

# A daemon that drops root after its first connection: its helper listened
# as root, and listens again as the user the process became (sovia-stat
# believes a view only from one of the process's users, or root).
listen 5944
LD_PRELOAD="$lib" "$py" -c '
import os, signal, socket
s = socket.create_connection(("127.0.0.1", 5944))
s.sendall(b"hello")
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
print(os.getpid(), flush=True)
signal.pause()' >"$work/drop.out" &
pids+=($!)
dropped=$(pid_from "$work/drop.out")
view_of "$dropped" '.tcp_tx_bytes == 5' >/dev/null
[ "$(stat -c %U "/proc/$dropped")" = nobody ] || fail "the daemon did not drop root"
# Its helper listened again as the user it became: askers see nobody.
peer_uid() { # PID: the uid its view's listener shows an asker
	"$py" -c '
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect("/dev/shm/libsovia-stat.0/%s" % sys.argv[1])
print(struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1])' "$1"
}
for _ in $(seq 100); do
	[ "$(peer_uid "$dropped")" = 65534 ] && break
	sleep 0.1
done
[ "$(peer_uid "$dropped")" = 65534 ] || fail "the view's listener is still uid $(peer_uid "$dropped")"
echo "== a daemon that dropped root is still seen"
echo "sovia-stat OK: $(wc -l <"$work/watch.out") looks in --watch"
