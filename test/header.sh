#!/usr/bin/env bash
# include/sovia.h builds in strict C (c99 -pedantic) and in C++, and its
# calls keep their contract with and without the module: the version or
# NULL, EBADF for a closed fd, EINVAL for a missing or short struct, and
# managed=0 with fallback "none" for an fd that is not a connection.
#   test/header.sh LIBSOVIA_SO
set -euo pipefail
lib=${1:?usage: $0 LIBSOVIA_SO}
inc=$(dirname "$0")/../include
work=$(mktemp -d /tmp/sovia-header.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
cat >"$work/probe.c" <<'C'
#include <sovia.h>
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	struct sovia_conn_info info;
	const char *v = sovia_version();
	printf("version=%s\n", v ? v : "(null)");
	memset(&info, 0, sizeof(info));
	info.size = sizeof(info);
	/* One call a statement: printf's arguments have no order. */
	errno = 0;
	int rc = sovia_conn_info(999, &info);
	printf("closed=%d,%s\n", rc, errno == EBADF ? "EBADF" : "?");
	errno = 0;
	rc = sovia_conn_info(0, NULL);
	printf("null=%d,%s\n", rc, errno == EINVAL ? "EINVAL" : "?");
	info.size = 4;
	errno = 0;
	rc = sovia_conn_info(0, &info);
	printf("short=%d,%s\n", rc, errno == EINVAL ? "EINVAL" : "?");
	info.size = sizeof(info);
	rc = sovia_conn_info(1, &info);
	printf("stdout=%d managed=%u tx=%u rx=%u fallback=%s\n", rc, info.managed, info.tx_medium,
	       info.rx_medium, info.fallback);
	return 0;
}
C
gcc -std=c99 -pedantic -Wall -Wextra -Werror -I"$inc" -o "$work/probe-c" "$work/probe.c" ||
	fail "sovia.h does not build as c99 -pedantic"
cp "$work/probe.c" "$work/probe.cc"
g++ -std=c++11 -pedantic -Wall -Wextra -Werror -I"$inc" -o "$work/probe-cxx" "$work/probe.cc" ||
	fail "sovia.h does not build as C++"
version=$(sed -n 's/^project(libsovia VERSION \([0-9.]*\).*/\1/p' "$(dirname "$0")/../CMakeLists.txt")
for probe in probe-c probe-cxx; do
	for how in plain preloaded; do
		if [ $how = plain ]; then
			out=$(env -u LD_PRELOAD "$work/$probe" | cat)
			want_version="(null)"
		else
			out=$(LD_PRELOAD=$lib "$work/$probe" | cat)
			want_version=$version
		fi
		for line in "version=$want_version" "closed=-1,EBADF" "null=-1,EINVAL" "short=-1,EINVAL" \
			"stdout=0 managed=0 tx=0 rx=0 fallback=none"; do
			grep -qxF "$line" <<<"$out" || fail "$probe $how: no '$line' in: $out"
		done
	done
done
echo "PASS: sovia.h in C99 and C++, with and without libsovia"
