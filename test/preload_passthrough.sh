#!/usr/bin/env bash
# Unmodified nc, preloaded, moves a file over loopback TCP byte-identically in
# both directions. On a host without RDMA every connection stays on the
# kernel, so this proves the interposer itself is transparent.
set -euo pipefail
lib=$1
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
head -c 3000000 /dev/urandom >"$tmp/in"
port=$((20000 + RANDOM % 20000))

run() { # direction: "up" (client sends) or "down" (server sends)
	local dir=$1
	rm -f "$tmp/out"
	if [ "$dir" = up ]; then
		LD_PRELOAD=$lib timeout 60 nc -l 127.0.0.1 "$port" >"$tmp/out" &
	else
		LD_PRELOAD=$lib timeout 60 nc -N -l 127.0.0.1 "$port" <"$tmp/in" &
	fi
	local srv=$!
	for _ in $(seq 50); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
	if [ "$dir" = up ]; then
		LD_PRELOAD=$lib timeout 60 nc -N 127.0.0.1 "$port" <"$tmp/in"
	else
		LD_PRELOAD=$lib timeout 60 nc 127.0.0.1 "$port" </dev/null >"$tmp/out"
	fi
	wait "$srv"
	cmp "$tmp/in" "$tmp/out"
	echo "passthrough $dir: $(stat -c %s "$tmp/out") bytes identical"
	port=$((port + 1))
}
run up
run down
