#!/usr/bin/env bash
# include/sovia.h builds in strict C (c99 -pedantic; after <dlfcn.h> with
# _GNU_SOURCE too) and in C++, and its calls keep their contract with and
# without the module: the version or NULL, EBADF for a closed fd, EINVAL
# for a missing or short struct, managed=0 with fallback "none" for an fd
# libsovia does not serve (media TCP for a TCP socket), and the size the
# answer filled. The module's own function checks its arguments too.
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

#ifdef __cplusplus
#define NOTHING nullptr
#else
#define NOTHING NULL
#endif

/* The calls' answers, one line each; one call a statement (printf's
 * arguments have no order). */
static void probe(const char *what, int fd, struct sovia_conn_info *info, uint32_t size)
{
	int rc;
	if (info) {
		memset(info, 0x55, sizeof(*info));
		info->size = size;
	}
	errno = 0;
	rc = sovia_conn_info(fd, info);
	if (rc < 0)
		printf("%s=-1,%s\n", what, errno == EBADF ? "EBADF" : errno == EINVAL ? "EINVAL" : "?");
	else
		printf("%s=0 size=%u managed=%u tx=%u rx=%u state='%s' fallback=%s\n", what,
		       info->size, info->managed, info->tx_medium, info->rx_medium, info->state,
		       info->fallback);
}

int main(void)
{
	struct sovia_conn_info info;
	const char *v = sovia_version();
	int tcp = socket(AF_INET, SOCK_STREAM, 0);
	printf("version=%s\n", v ? v : "(null)");
	probe("closed", 999, &info, sizeof(info));
	probe("null", 0, NOTHING, 0);
	probe("short", 0, &info, SOVIA_CONN_INFO_SIZE_1 - 1);
	probe("pipe", 1, &info, sizeof(info));
	probe("tcp", tcp, &info, sizeof(info));
	/* A program built against a later header passes a larger struct: it
	 * is told how much of it was filled. */
	probe("larger", tcp, &info, sizeof(info) + 64);
	return 0;
}
C
cat >"$work/module.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sovia.h>
#include <stdio.h>

/* The module's own checks, past the header's: its function called as a
 * program built against an older or broken header would. */
int main(void)
{
	sovia_conn_info_fn fn;
	struct sovia_conn_info info;
	int rc;
	sovia_lookup_("sovia_conn_info", &fn, sizeof(fn));
	if (!fn)
		return 2;
	errno = 0;
	rc = fn(0, NULL);
	printf("module-null=%d,%s\n", rc, errno == EINVAL ? "EINVAL" : "?");
	info.size = SOVIA_CONN_INFO_SIZE_1 - 1;
	errno = 0;
	rc = fn(0, &info);
	printf("module-short=%d,%s\n", rc, errno == EINVAL ? "EINVAL" : "?");
	info.size = sizeof(info);
	errno = 0;
	rc = fn(-1, &info);
	printf("module-closed=%d,%s\n", rc, errno == EBADF ? "EBADF" : "?");
	return 0;
}
C
strict="-Wall -Wextra -Werror -Wredundant-decls -Wdeclaration-after-statement"
# shellcheck disable=SC2086
gcc -std=c99 -pedantic $strict -I"$inc" -o "$work/probe-c" "$work/probe.c" ||
	fail "sovia.h does not build as c99 -pedantic"
# shellcheck disable=SC2086
gcc -std=gnu11 $strict -I"$inc" -o "$work/module" "$work/module.c" ||
	fail "sovia.h does not build after <dlfcn.h> with _GNU_SOURCE"
cp "$work/probe.c" "$work/probe.cc"
g++ -std=c++11 -pedantic -Wall -Wextra -Werror -Wold-style-cast -Wzero-as-null-pointer-constant \
	-Wredundant-decls -I"$inc" -o "$work/probe-cxx" "$work/probe.cc" ||
	fail "sovia.h does not build as C++"
# clang++ asks more of a null pointer than g++ does.
clang++ -std=c++11 -pedantic -Wall -Wextra -Werror -Wold-style-cast \
	-Wzero-as-null-pointer-constant -I"$inc" -fsyntax-only "$work/probe.cc" ||
	fail "sovia.h does not build with clang++"
# _GNU_SOURCE defined after a first system header (too late for it to count).
{ echo '#include <stdio.h>'; echo '#define _GNU_SOURCE'; cat "$work/probe.c"; } >"$work/late.c"
# shellcheck disable=SC2086
gcc -std=c99 $strict -O2 -Warray-bounds=2 -I"$inc" -o /dev/null "$work/late.c" ||
	fail "sovia.h does not build with a late _GNU_SOURCE"
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
		size=$(sed -n 's/^pipe=0 size=\([0-9]*\) .*/\1/p' <<<"$out")
		[ -n "$size" ] && [ "$size" -ge 100 ] || fail "$probe $how: no size: $out"
		for line in "version=$want_version" "closed=-1,EBADF" "null=-1,EINVAL" "short=-1,EINVAL" \
			"pipe=0 size=$size managed=0 tx=0 rx=0 state='' fallback=none" \
			"tcp=0 size=$size managed=0 tx=1 rx=1 state='' fallback=none" \
			"larger=0 size=$size managed=0 tx=1 rx=1 state='' fallback=none"; do
			grep -qxF "$line" <<<"$out" || fail "$probe $how: no '$line' in: $out"
		done
	done
done
out=$(LD_PRELOAD=$lib "$work/module" | cat)
for line in "module-null=-1,EINVAL" "module-short=-1,EINVAL" "module-closed=-1,EBADF"; do
	grep -qxF "$line" <<<"$out" || fail "the module: no '$line' in: $out"
done
env -u LD_PRELOAD "$work/module" && fail "the module's function found without the module"
echo "PASS: sovia.h in C99 and C++, with and without libsovia; the module's own checks"
