#!/usr/bin/env bash
# Listeners of every address family the kernel accepts on, over real
# rdma_cm and rxe. A server that listens as Node, Java, Go, python's
# http.server and Debian's ftpd -D do (the IPv6 wildcard with IPV6_V6ONLY
# off) serves its IPv4 clients through IPv4-mapped addresses; one bound to
# an IPv4 address in its mapped form (ftpd's passive data listener of such
# a session) too; IPv6 clients reach an IPv6 server over the device's IPv6
# GID; and an IPv6-only socket leaves the port's IPv4 clients to an IPv4
# socket beside it (nginx's "listen 80; listen [::]:80").
#
# Each case: a python server (a program we did not write the socket code
# of) receives SIZE bytes from a preloaded nc, both preloaded; the bytes
# must arrive intact, and all but the gated first MiB over RDMA by both
# ends' statistics, with the rxe device's counter moving.
. "$(dirname "$0")/lib.sh"
IP6=${SOVIA_BED_IP6:?the bed gives its device an IPv6 address}
SIZE=${SOVIA_IT_FAMILY_BYTES:-4194304}
head -c "$SIZE" /dev/urandom >"$WORK/in"

# srv.py PORT V6ONLY ADDR OUT: one connection's bytes into OUT.
cat >"$WORK/srv.py" <<'EOF'
import socket, sys
port, v6only, addr, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if fam == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
s.bind((addr, port))
s.listen(8)
c, _ = s.accept()
with open(out, "wb") as f:
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        f.write(b)
EOF

serve() { # name port v6only addr
	LD_PRELOAD=$LIB SOVIA_LOG=info timeout 120 /usr/bin/python3 "$WORK/srv.py" "$2" "$3" "$4" \
		"$WORK/$1.got" 2>"$WORK/$1-server.err" &
}

send() { # name nc-args...
	local name=$1
	shift
	gated "$WORK/$name-client.err" |
		LD_PRELOAD=$LIB SOVIA_LOG=info timeout 120 nc -N "$@" 2>"$WORK/$name-client.err" ||
		fail "$name: the client failed"
}

check() { # name p0
	local name=$1 p0=$2
	cmp -s "$WORK/in" "$WORK/$name.got" || fail "$name: the server received other bytes"
	assert_rdma_carried "$WORK/$name-client.err" client $((SIZE - GATE)) "$GATE"
	local rx
	rx=$(stat_of "$WORK/$name-server.err" rdma_rx_bytes server)
	[ "$rx" -ge $((SIZE - GATE)) ] || fail "$name: the server received only $rx bytes over RDMA"
	local pk=$(($(rxe_pkts) - p0))
	[ "$pk" -ge $(((SIZE - GATE) / 4096)) ] || fail "$name: rxe sent only $pk packets"
	echo "PASS $name: $SIZE bytes intact, server rdma_rx_bytes=$rx, rxe packets +$pk"
}

one() { # name port v6only listen-addr nc-args...
	local name=$1 port=$2 v6only=$3 addr=$4 p0
	shift 4
	note "$name: server on [$addr]:$port v6only=$v6only; nc $*"
	serve "$name" "$port" "$v6only" "$addr"
	local srv=$!
	wait_port "$port"
	p0=$(rxe_pkts)
	send "$name" "$@" "$port"
	wait "$srv" || fail "$name: the server failed"
	check "$name" "$p0"
}

one dual-v4 5001 0 :: -4 "$IP"
one dual-mapped-client 5002 0 :: -6 "::ffff:$IP"
one mapped-listener 5003 0 "::ffff:$IP" -4 "$IP"
one v6 5004 1 :: -6 "$IP6"
one v6-specific 5005 0 "$IP6" -6 "$IP6"

# Two sockets on one port, one per family: each family's client reaches
# its own socket over RDMA.
note "neighbours: [::]:5006 v6only=1 beside 0.0.0.0:5006"
serve nb6 5006 1 ::
s6=$!
serve nb4 5006 0 0.0.0.0
s4=$!
for _ in $(seq 300); do
	[ "$(ss -ltnH "sport = :5006" | wc -l)" -ge 2 ] && break
	sleep 0.1
done
p0=$(rxe_pkts)
send nb4 -4 "$IP" 5006
wait "$s4" || fail "nb4: the IPv4 server failed"
check nb4 "$p0"
p0=$(rxe_pkts)
send nb6 -6 "$IP6" 5006
wait "$s6" || fail "nb6: the IPv6 server failed"
check nb6 "$p0"
echo "PASS family: every listener shape carried its client over RDMA"
