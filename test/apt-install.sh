#!/usr/bin/env bash
# Installs Debian packages that are missing (test/setup-deps.sh,
# bench/setup-deps.sh): apt-get install PKG... after an update, with no
# service started by the packages' maintainer scripts. Server packages
# (PostgreSQL, nginx, inetd) are here for the tests and benchmarks, which
# start their own instances: a policy-rc.d keeps the install from starting
# theirs (one already there is left as it is), and the services named in
# SERVICES (space-separated) are stopped and disabled afterwards, so a
# machine where one did start does not keep it running.
#
#   apt-install.sh PKG...
set -euo pipefail
missing=()
for p in "$@"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
echo "${0##*/}: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
POLICY=/usr/sbin/policy-rc.d OWN_POLICY=0
if [ ! -e "$POLICY" ]; then
	printf '#!/bin/sh\n# test/apt-install.sh: no service starts during its install\nexit 101\n' |
		$SUDO tee "$POLICY" >/dev/null
	$SUDO chmod 755 "$POLICY"
	OWN_POLICY=1
fi
rc=0
{ $SUDO apt-get update -q &&
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"; } || rc=$?
[ "$OWN_POLICY" = 1 ] && $SUDO rm -f "$POLICY"
[ "$rc" = 0 ] || exit "$rc"
for s in ${SERVICES:-}; do
	if [ -d /run/systemd/system ]; then
		$SUDO systemctl stop "$s" >/dev/null 2>&1 || true
		$SUDO systemctl disable "$s" >/dev/null 2>&1 || true
	else
		if [ -x "/etc/init.d/$s" ]; then
			$SUDO "/etc/init.d/$s" stop >/dev/null 2>&1 || true
		fi
		$SUDO update-rc.d "$s" disable >/dev/null 2>&1 || true
	fi
done
