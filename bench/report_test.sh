#!/usr/bin/env bash
# bench/report.sh on a made-up results.csv (no test bed): sizes measured in
# rounds get each variant's median over its ok rounds, the ratios are of
# the medians, and the round-by-round table shows every round; a size
# measured once is shown as it was measured.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$D"' EXIT
cat >"$D/results.csv" <<'CSV'
variant,test,size,status,mibps,lat_med_us,lat_p99_us,conn_per_s,cpu_s_per_gb,rdma_tx_share,detail
verbs-send,bw,64,ok,1.5,,,,,,ib_send_bw
verbs-write,bw,64,ok,2.5,,,,,,ib_write_bw
tcp,bw,64,ok,4,,,,100,,sovia-bench
rsockets,bw,64,ok,0.5,,,,900,,sovia-bench
libsovia,bw,64,ok,8,,,,50,0.990,sovia-bench
verbs-send,bw,65536,ok,10,,,,,,ib_send_bw
verbs-write,bw,65536,ok,5,,,,,,ib_write_bw
tcp,bw,65536,ok,80,,,,20,,sovia-bench
rsockets,bw,65536,ok,10,,,,100,,sovia-bench
libsovia,bw,65536,ok,18,,,,60,0.900,sovia-bench
verbs-send,bw,65536,ok,30,,,,,,ib_send_bw
verbs-write,bw,65536,ok,5,,,,,,ib_write_bw
tcp,bw,65536,ok,90,,,,22,,sovia-bench
rsockets,bw,65536,failed,,,,,,,client exit 1
libsovia,bw,65536,ok,9,,,,90,0.950,sovia-bench
verbs-send,bw,65536,ok,20,,,,,,ib_send_bw
verbs-write,bw,65536,ok,5,,,,,,ib_write_bw
tcp,bw,65536,ok,70,,,,18,,sovia-bench
rsockets,bw,65536,ok,12,,,,80,,sovia-bench
libsovia,bw,65536,ok,40,,,,30,0.980,sovia-bench
verbs-send,lat,64,ok,,10,20,,,,ib_send_lat
tcp,lat,64,ok,,40,80,,,,sovia-bench
rsockets,lat,64,ok,,20,40,,,,sovia-bench
libsovia,lat,64,ok,,11,30,,,0.990,sovia-bench
verbs-send,lat,1024,ok,,12,22,,,,ib_send_lat
tcp,lat,1024,ok,,44,88,,,,sovia-bench
rsockets,lat,1024,ok,,24,44,,,,sovia-bench
libsovia,lat,1024,ok,,13,33,,,0.990,sovia-bench
CSV
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
