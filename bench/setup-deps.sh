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
SERVICES="${SERVICES[*]}" exec "$(dirname "$0")/../test/apt-install.sh" "${PKGS[@]}"
