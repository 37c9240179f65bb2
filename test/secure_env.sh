#!/usr/bin/env bash
# Issue 53, finding 6: a set-id program (libsovia loaded by
# /etc/ld.so.preload) does not take its settings from the invoking
# user's environment: libsovia reads them with secure_getenv. The program
# links libsovia's preload objects and prints its settings; set-uid root
# and run by nobody with SOVIA_WARDEN_PORT=0 and SOVIA_DISABLE=1, it must
# print the defaults; run plainly, the settings it is given.
#
#   test/secure_env.sh SETID_ENV_PROGRAM
set -euo pipefail
prog=${1:?usage: $0 SETID_ENV_PROGRAM}
[ "$(id -u)" = 0 ] || { echo "secure_env: needs root (set-uid root, run as nobody)" >&2; exit 1; }
# Where nobody can run it, whatever the clone's directory allows.
dir=$(mktemp -d /tmp/sovia-secure-env.XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
cp "$prog" "$dir/setid-env"
chown root:root "$dir/setid-env"
chmod 4755 "$dir/setid-env"
if findmnt -n -o OPTIONS --target "$dir" | grep -qw nosuid; then
	echo "secure_env: $dir is on a nosuid mount: cannot test" >&2
	exit 1
fi
plain=$(SOVIA_WARDEN_PORT=0 SOVIA_DISABLE=1 "$dir/setid-env")
[ "$plain" = "warden_port=0 disable=1" ] ||
	{ echo "FAIL: run plainly, the settings were not taken: $plain" >&2; exit 1; }
setid=$(SOVIA_WARDEN_PORT=0 SOVIA_DISABLE=1 setpriv --reuid=65534 --regid=65534 --clear-groups \
	"$dir/setid-env")
[ "$setid" = "warden_port=1011 disable=0" ] ||
	{ echo "FAIL: set-uid, the invoking user's settings were taken: $setid" >&2; exit 1; }
echo "secure_env: plainly '$plain'; set-uid '$setid'"
