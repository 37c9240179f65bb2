#!/usr/bin/env bash
# bench/report.sh on a made-up results.csv (no test bed): sizes measured in
# rounds get each variant's median over its ok rounds, the ratios are of
# the medians, and the round-by-round table shows every round; a size
# measured once is shown as it was measured.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$D"' EXIT
{
	echo "variant,test,size,status,mibps,lat_med_us,lat_p99_us,conn_per_s,cpu_s_per_gb,rdma_tx_share,detail"
	# 64 B, measured once.
	echo "verbs-send,bw,64,ok,1.5,,,,,,ib_send_bw"
	echo "verbs-write,bw,64,ok,2.5,,,,,,ib_write_bw"
	echo "tcp,bw,64,ok,4,,,,100,,sovia-bench"
	echo "rsockets,bw,64,ok,0.5,,,,900,,sovia-bench"
	echo "libsovia,bw,64,ok,8,,,,50,0.990,sovia-bench"
	# 64 KiB in three rounds, as bed-run.sh writes them (every variant
	# once per round). Per variant: each round's MiB/s:CPU per GB:RDMA
	# share, "x" for a failed round.
	awk -v OFS=, '{ v[NR] = $1; for (r = 1; r <= 3; r++) c[NR, r] = $(r + 1) }
		END { for (r = 1; r <= 3; r++) for (i = 1; i <= NR; i++) {
			if (c[i, r] == "x") { print v[i], "bw", 65536, "failed", "", "", "", "", "", "", "client exit 1"; continue }
			split(c[i, r], f, ":")
			print v[i], "bw", 65536, "ok", f[1], "", "", "", f[2], f[3], "made up"
		} }' <<'ROUNDS'
verbs-send 10 30 20
verbs-write 5 5 5
tcp 80:20 90:22 70:18
rsockets 10:100 x 12:80
libsovia 18:60:0.900 9:90:0.950 40:30:0.980
ROUNDS
	# Latency, measured once (the plot needs some).
	awk -v OFS=, '{ print $1, "lat", $2, "ok", "", $3, $4, "", "", "", "made up" }' <<'LAT'
verbs-send 64 10 20
tcp 64 40 80
rsockets 64 20 40
libsovia 64 11 30
verbs-send 1024 12 22
tcp 1024 44 88
rsockets 1024 24 44
libsovia 1024 13 33
LAT
} >"$D/results.csv"
"$HERE/report.sh" "$D" >/dev/null 2>"$D/err" || { cat "$D/err"; echo "FAIL: report.sh exited non-zero"; exit 1; }
md=$D/results.md
fail=0
want() { # a line results.md must hold, and why
	grep -qxF -- "$1" "$md" || { echo "FAIL: $2; no line: $1"; fail=1; }
}
# Medians: send 20 (10 30 20), write 5, TCP 80, rsockets 11 (10 12, the
# failed round left out), libsovia 18 (18 9 40); share 0.95 (shown as a number).
want "| 64 KiB | 20.000 | 5.000 | 80.000 | 11.000 | 18.000 | 0.90 | 1.64 | 0.23 | 0.95 |" "bandwidth medians"
want "| 64 B | 1.5 | 2.5 | 4 | 0.5 | 8 | 3.20 | 16.00 | 2.00 | 0.99 |" "a size measured once"
# CPU per GB medians: TCP 20, rsockets 90 (100 80), libsovia 60 (60 90 30).
want "| 64 KiB | 20.0000 | 90.0000 | 60.0000 | 0.67 | 3.00 |" "CPU per GB medians"
want "| 64 KiB | 1 | 10 | 5 | 80 | 10 | 18 | 1.80 | 1.80 |" "round 1"
want "| 64 KiB | 2 | 30 | 5 | 90 | failed | 9 | 0.30 | n/a |" "round 2 with a failed variant"
want "| 64 KiB | 3 | 20 | 5 | 70 | 12 | 40 | 2.00 | 3.33 |" "round 3"
want "| bulk: libsovia >= 0.95 x verbs at >= 64 KiB | 0.90 (at 64 KiB) | **no** |" "the bulk target on the medians"
grep -q "^bw,65536,0.90,1.64,0.23$" "$D/ratios.csv" || { echo "FAIL: ratios.csv: $(grep '^bw,65536' "$D/ratios.csv")"; fail=1; }
[ "$fail" = 0 ] && echo "report_test: OK"
exit "$fail"
