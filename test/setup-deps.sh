#!/usr/bin/env bash
# Installs what building and testing libsovia needs, from Debian 12's own
# packages. Idempotent: packages already there are left alone. ftpd, ftp,
# iperf3, redis and PostgreSQL (with pgbench, in postgresql-contrib) are the real
# programs of the integration tests (their services are not needed: the tests start
# them themselves). clang and its runtime
# (libFuzzer, which clang only recommends) build the fuzz targets (test/fuzz/);
# liburing-dev builds the io_uring example (apps/sovia_uring.c).
set -euo pipefail
PKGS=(build-essential cmake pkg-config libibverbs-dev librdmacm-dev rdma-core
      ibverbs-providers ibverbs-utils libcriterion-dev netcat-openbsd iproute2
      ftpd ftp iperf3 openssl redis-server redis-tools clang libclang-rt-dev
      liburing-dev postgresql postgresql-contrib)
missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup-deps: installing ${missing[*]}"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
