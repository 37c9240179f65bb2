#!/usr/bin/env bash
# Installs what the benchmark harness needs beyond the build and test
# dependencies (test/setup-deps.sh), from Debian 12's own packages:
# gnuplot for the plots, perftest for raw verbs, librdmacm1 for rsockets'
# preload (librspreload.so), iperf3 for the optional iperf3 runs.
# Idempotent: packages already there are left alone.
set -euo pipefail
PKGS=(gnuplot-nox perftest librdmacm1 rdmacm-utils iperf3 iproute2)
missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "bench/setup-deps: installing ${missing[*]}"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
