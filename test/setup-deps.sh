#!/usr/bin/env bash
# Installs what building and testing libsovia needs, from Debian 12's own
# packages. Idempotent: packages already there are left alone. ftpd, ftp,
# iperf3, redis and PostgreSQL (with pgbench, in postgresql-contrib) are the real
# programs of the integration tests (their services are not needed: the tests start
# them themselves; PostgreSQL's is left stopped: test/apt-install.sh), as are nginx,
# openbsd-inetd and curl (bed.servers). clang and its runtime
# (libFuzzer, which clang only recommends) build the fuzz targets (test/fuzz/);
# liburing-dev builds the io_uring example (test/bed/progs/sovia_uring.c); man-db
# checks the installed man pages (test/package.sh); jq reads sovia-stat's JSON; CPack's
# shlibdeps runs file; python3 plays a fake view for test/stat.sh. socat, ncat
# and nodejs are programs of the compatibility matrix (test/bed/compat.sh).
set -euo pipefail
PKGS=(build-essential cmake pkg-config libibverbs-dev librdmacm-dev rdma-core
      ibverbs-providers ibverbs-utils libcriterion-dev netcat-openbsd iproute2
      ftpd ftp iperf3 openssl redis-server redis-tools clang libclang-rt-dev
      liburing-dev postgresql postgresql-contrib nginx openbsd-inetd curl man-db jq file python3
      socat ncat nodejs)
SERVICES="postgresql nginx openbsd-inetd" exec "$(dirname "$0")/apt-install.sh" "${PKGS[@]}"
