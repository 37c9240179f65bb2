#!/usr/bin/env bash
# Installs what the benchmark harness needs beyond the build and test
# dependencies (test/setup-deps.sh), from Debian 12's own packages:
# gnuplot for the plots, perftest for raw verbs, librdmacm1 for rsockets'
# preload (librspreload.so), iperf3 for the optional iperf3 runs, and for
# bench/servers.sh (forking/prefork/exec servers, issue 29) nginx, a
# PostgreSQL server with pgbench (postgresql-contrib), openbsd-inetd,
# curl and netcat.
# Idempotent: packages already there are left alone.
#
# The server packages' own services are not wanted on the host:
# bench/servers.sh starts its own instances with its own configuration in
# a temporary directory, on the test bed's address. A policy-rc.d keeps
# the maintainer scripts from starting them during the install (one that
# is already there is left as it is), and afterwards they are stopped and
# disabled, so a machine where they did start does not keep them running.
set -euo pipefail
PKGS=(gnuplot-nox perftest librdmacm1 rdmacm-utils iperf3 iproute2
	nginx postgresql postgresql-contrib openbsd-inetd curl netcat-openbsd)
SERVICES=(nginx postgresql openbsd-inetd)
missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "bench/setup-deps: installing ${missing[*]}"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	POLICY=/usr/sbin/policy-rc.d OWN_POLICY=0
	if [ ! -e "$POLICY" ]; then
		printf '#!/bin/sh\n# bench/setup-deps.sh: no service starts during its install\nexit 101\n' |
			$SUDO tee "$POLICY" >/dev/null
		$SUDO chmod 755 "$POLICY"
		OWN_POLICY=1
	fi
	rc=0
	{ $SUDO apt-get update -q &&
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; } || rc=$?
	[ "$OWN_POLICY" = 1 ] && $SUDO rm -f "$POLICY"
	[ "$rc" = 0 ] || exit "$rc"
	for s in "${SERVICES[@]}"; do
		if [ -d /run/systemd/system ]; then
			$SUDO systemctl stop "$s" >/dev/null 2>&1 || true
			$SUDO systemctl disable "$s" >/dev/null 2>&1 || true
		else
			[ -x "/etc/init.d/$s" ] && { $SUDO "/etc/init.d/$s" stop >/dev/null 2>&1 || true; }
			$SUDO update-rc.d "$s" disable >/dev/null 2>&1 || true
		fi
	done
fi
