#!/usr/bin/env bash
# Turns DIR/results.csv (written by bench/bed-run.sh) into
#   DIR/results.md     the tables, the ratios and the issue-5 targets
#   DIR/ratios.csv     libsovia / raw verbs, / rsockets, / TCP per size
#   DIR/bandwidth.png  bandwidth vs write size (log-log)
#   DIR/latency.png    median one-way latency vs message size (log-log)
# Plain awk and gnuplot (skipped with a note when gnuplot is missing).
# usage: report.sh DIR
set -euo pipefail
DIR=${1:?usage: $0 DIR}
CSV=$DIR/results.csv
[ -s "$CSV" ] || { echo "report.sh: no $CSV" >&2; exit 1; }

# One awk pass: the ratios CSV, the plot data and the markdown.
awk -F, -v dir="$DIR" -v cmd="${SOVIA_BENCH_CMD:-bench/run.sh}" -v when="$(date -u '+%Y-%m-%d %H:%M UTC')" '
function cell(v, t, s, f,   k) {
	k = v SUBSEP t SUBSEP s
	if (!(k in st)) return "-"
	if (st[k] != "ok") return "failed"
	return val[k, f]
}
function num(v, t, s, f,   k) {
	k = v SUBSEP t SUBSEP s
	if (!(k in st) || st[k] != "ok" || val[k, f] == "") return ""
	return val[k, f] + 0
}
function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "" : sprintf("%.2f", a / b) }
function show(r) { return r == "" ? "n/a" : r }
function hsize(s) {
	if (s >= 1048576 && s % 1048576 == 0) return (s / 1048576) " MiB"
	if (s >= 1024 && s % 1024 == 0) return (s / 1024) " KiB"
	return s " B"
}
function secs(v, s,   k, d) { # the seconds a "ftp" row carries in its detail
	k = v SUBSEP "ftp" SUBSEP s
	if (!(k in st)) return "-"
	if (st[k] != "ok") return "failed"
	d = val[k, "detail"]
	if (!match(d, /seconds=[0-9.]+/)) return "-"
	return substr(d, RSTART + 8, RLENGTH - 8)
}
function secnum(x) { return (x == "-" || x == "failed") ? "" : x + 0 }
function dat(x) { return x == "" ? "?" : x }
function maxv(a, b) { return a == "" ? b : (b == "" ? a : (a > b ? a : b)) }
function median(arr, n,   i, j, t) { # of arr[1..n] (sorts it)
	for (i = 2; i <= n; i++)
		for (j = i; j > 1 && arr[j - 1] + 0 > arr[j] + 0; j--) { t = arr[j]; arr[j] = arr[j - 1]; arr[j - 1] = t }
	return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
}
function med_of(k, f,   i, n, a) { # the median of field f over the ok rounds of key k
	n = 0
	for (i = 1; i <= ns[k]; i++) if (rst[k, i] == "ok" && rv[k, i, f] != "") a[++n] = rv[k, i, f]
	return n ? median(a, n) : ""
}
NR == 1 { next }
{
	k = $1 SUBSEP $2 SUBSEP $3
	# A key measured in rounds (bed-run.sh: the bulk sizes) has a row per
	# round; it is ok when a round is, with the medians of its ok rounds.
	i = ++ns[k]
	rst[k, i] = $4; rv[k, i, "bw"] = $5; rv[k, i, "cpu"] = $9; rv[k, i, "share"] = $10
	if (i > 1 && st[k] == "ok" && $4 != "ok") next
	st[k] = $4
	val[k, "bw"] = $5; val[k, "med"] = $6; val[k, "p99"] = $7
	val[k, "conn"] = $8; val[k, "cpu"] = $9; val[k, "share"] = $10
	val[k, "detail"] = $11
	if ($2 == "bw" && !(("bw", $3) in seen)) { seen["bw", $3] = 1; bws[++nbw] = $3 }
	if ($2 == "lat" && !(("lat", $3) in seen)) { seen["lat", $3] = 1; lats[++nlat] = $3 }
	if ($2 == "iperf3") niperf++
	if ($2 == "ftp" && !(("ftp", $3) in seen)) { seen["ftp", $3] = 1; ftps[++nftp] = $3 }
}
END {
	for (k in ns) {
		if (ns[k] < 2) continue
		rounds = 1
		if (st[k] != "ok") continue
		val[k, "bw"] = sprintf("%.3f", med_of(k, "bw"))
		m = med_of(k, "cpu"); val[k, "cpu"] = m == "" ? "" : sprintf("%.4f", m)
		m = med_of(k, "share"); val[k, "share"] = m == "" ? "" : sprintf("%.3f", m)
	}
	md = dir "/results.md"; rc = dir "/ratios.csv"
	bwd = dir "/bandwidth.dat"; latd = dir "/latency.dat"
	print "metric,size,libsovia_over_verbs,libsovia_over_rsockets,libsovia_over_tcp" > rc
	print "# size verbs-send verbs-write tcp rsockets libsovia (MiB/s)" > bwd
	print "# size verbs-send tcp rsockets libsovia (median one-way us)" > latd

	print "# libsovia benchmark results\n" > md
	print "Made by `" cmd "` on " when ", in one run of the soft-RoCE test bed" > md
	print "(one guest, one rxe device, server and client on its address). Under" > md
	print "emulation absolute numbers mean little: compare the ratios. Raw logs:" > md
	print "`raw/` beside this file (not kept in git).\n" > md

	# Bandwidth
	print "## Streaming bandwidth (MiB/s, higher is better)\n" > md
	print "| write size | verbs send | verbs write | TCP | rsockets | libsovia | libsovia/verbs | libsovia/rsockets | libsovia/TCP | libsovia RDMA share |" > md
	print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" > md
	for (i = 1; i <= nbw; i++) {
		s = bws[i]
		vb = maxv(num("verbs-send", "bw", s, "bw"), num("verbs-write", "bw", s, "bw"))
		sv = num("libsovia", "bw", s, "bw")
		r1 = ratio(sv, vb); r2 = ratio(sv, num("rsockets", "bw", s, "bw")); r3 = ratio(sv, num("tcp", "bw", s, "bw"))
		bwr[s, 1] = r1; bwr[s, 2] = r2
		printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", hsize(s),
			cell("verbs-send", "bw", s, "bw"), cell("verbs-write", "bw", s, "bw"),
			cell("tcp", "bw", s, "bw"), cell("rsockets", "bw", s, "bw"), cell("libsovia", "bw", s, "bw"),
			show(r1), show(r2), show(r3), show(num("libsovia", "bw", s, "share")) > md
		print "bw," s "," r1 "," r2 "," r3 > rc
		print s, dat(num("verbs-send", "bw", s, "bw")), dat(num("verbs-write", "bw", s, "bw")),
			dat(num("tcp", "bw", s, "bw")), dat(num("rsockets", "bw", s, "bw")), dat(sv) > bwd
	}
	print "\nlibsovia/verbs divides by the higher of ib_send_bw and ib_write_bw." > md
	print "RDMA share: the part of the libsovia client connection'"'"'s bytes (warm-up" > md
	print "included) that its statistics (`SOVIA_STATS=1`) show on the QP." > md
	if (rounds) {
		print "Sizes measured in rounds (below): each variant'"'"'s median over its rounds" > md
		print "(bandwidth, CPU per GB and RDMA share alike); the ratios are of the medians." > md
	}
	print "" > md
	if (rounds) {
		print "### Bulk bandwidth, round by round (MiB/s)\n" > md
		print "Every variant once per round, the rounds one after another, so each" > md
		print "round'"'"'s ratio compares runs seconds apart.\n" > md
		print "| write size | round | verbs send | verbs write | TCP | rsockets | libsovia | libsovia/verbs | libsovia/rsockets |" > md
		print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" > md
		nv = split("verbs-send verbs-write tcp rsockets libsovia", vs, " ")
		for (i = 1; i <= nbw; i++) {
			s = bws[i]
			n = 0
			for (j = 1; j <= nv; j++) if (ns[vs[j], "bw", s] > n) n = ns[vs[j], "bw", s]
			if (n < 2) continue
			for (r = 1; r <= n; r++) {
				line = "| " hsize(s) " | " r
				for (j = 1; j <= nv; j++) { k = vs[j] SUBSEP "bw" SUBSEP s; rb[j] = ""
					if (r > ns[k]) c = "-"; else if (rst[k, r] != "ok") c = "failed"; else { c = rv[k, r, "bw"]; rb[j] = c + 0 }
					line = line " | " c }
				print line " | " show(ratio(rb[5], maxv(rb[1], rb[2]))) " | " show(ratio(rb[5], rb[4])) " |" > md
			}
		}
		print "" > md
	}

	# Latency
	print "## Ping-pong latency (one way = round trip / 2, microseconds, lower is better)\n" > md
	print "| message size | verbs send median / p99 | TCP median / p99 | rsockets median / p99 | libsovia median / p99 | libsovia/verbs | libsovia/rsockets | libsovia/TCP |" > md
	print "|---:|---:|---:|---:|---:|---:|---:|---:|" > md
	for (i = 1; i <= nlat; i++) {
		s = lats[i]
		sv = num("libsovia", "lat", s, "med")
		r1 = ratio(sv, num("verbs-send", "lat", s, "med")); r2 = ratio(sv, num("rsockets", "lat", s, "med"))
		r3 = ratio(sv, num("tcp", "lat", s, "med"))
		latr[s, 1] = r1; latr[s, 2] = r2
		line = "| " hsize(s)
		n = split("verbs-send tcp rsockets libsovia", vs, " ")
		for (j = 1; j <= n; j++) {
			m = cell(vs[j], "lat", s, "med")
			line = line " | " (m == "failed" || m == "-" ? m : m " / " cell(vs[j], "lat", s, "p99"))
		}
		print line " | " show(r1) " | " show(r2) " | " show(r3) " |" > md
		print "lat_median," s "," r1 "," r2 "," r3 > rc
		print s, dat(num("verbs-send", "lat", s, "med")), dat(num("tcp", "lat", s, "med")),
			dat(num("rsockets", "lat", s, "med")), dat(sv) > latd
	}
	print "\nRatios are of medians; for latency below 1 is better.\n" > md

	# Set-up rate
	print "## Connection set-up rate (connect + accept + 1 byte + close, per second)\n" > md
	print "| TCP | rsockets | libsovia | libsovia/rsockets | libsovia/TCP |" > md
	print "|---:|---:|---:|---:|---:|" > md
	sv = num("libsovia", "conn", 0, "conn")
	connr = ratio(sv, num("rsockets", "conn", 0, "conn"))
	printf "| %s | %s | %s | %s | %s |\n", cell("tcp", "conn", 0, "conn"), cell("rsockets", "conn", 0, "conn"),
		cell("libsovia", "conn", 0, "conn"), show(connr), show(ratio(sv, num("tcp", "conn", 0, "conn"))) > md
	print "conn,0,," connr "," ratio(sv, num("tcp", "conn", 0, "conn")) > rc
	print "\nlibsovia connections start on kernel TCP and move to RDMA out of band;" > md
	print "one this short is closed before or while it moves.\n" > md

	# CPU
	print "## CPU time per GB moved (user + system seconds of both ends, streaming, lower is better)\n" > md
	print "| write size | TCP | rsockets | libsovia | libsovia/rsockets | libsovia/TCP |" > md
	print "|---:|---:|---:|---:|---:|---:|" > md
	for (i = 1; i <= nbw; i++) {
		s = bws[i]
		sv = num("libsovia", "bw", s, "cpu")
		r2 = ratio(sv, num("rsockets", "bw", s, "cpu")); r3 = ratio(sv, num("tcp", "bw", s, "cpu"))
		cpur[s] = r2
		printf "| %s | %s | %s | %s | %s | %s |\n", hsize(s), cell("tcp", "bw", s, "cpu"),
			cell("rsockets", "bw", s, "cpu"), cell("libsovia", "bw", s, "cpu"), show(r2), show(r3) > md
		print "cpu_per_gb," s ",," r2 "," r3 > rc
	}
	print "" > md

	if (niperf > 0) {
		print "## iperf3 (one stream, 128 KiB writes, MiB/s)\n" > md
		print "| TCP | rsockets | libsovia |" > md
		print "|---:|---:|---:|" > md
		printf "| %s | %s | %s |\n\n", cell("tcp", "iperf3", 131072, "bw"), cell("rsockets", "iperf3", 131072, "bw"),
			cell("libsovia", "iperf3", 131072, "bw") > md
	}

	if (nftp > 0) {
		print "## Real application (the SOVIA paper\047s table): ftp get (seconds, lower is better)\n" > md
		print "| file bytes | local copy | TCP | rsockets | libsovia | libsovia/TCP | libsovia/rsockets |" > md
		print "|---:|---:|---:|---:|---:|---:|---:|" > md
		for (i = 1; i <= nftp; i++) {
			s = ftps[i]
			sv = secnum(secs("libsovia", s))
			printf "| %s | %s | %s | %s | %s | %s | %s |\n", s, secs("local", s), secs("tcp", s),
				secs("rsockets", s), secs("libsovia", s), show(ratio(sv, secnum(secs("tcp", s)))),
				show(ratio(sv, secnum(secs("rsockets", s)))) > md
		}
		print "\nOne ftp session each (login, passive mode, `get`, quit), both ends" > md
		print "preloaded; the file is checked after the transfer. Local copy: `cp`" > md
		print "within /dev/shm. For time below 1 is better.\n" > md
	}

	# Targets of issue 5
	print "## Targets (issue 5)\n" > md
	print "| target | measured | met |" > md
	print "|---|---|---|" > md
	w = ""; ws = ""; have = 0
	for (i = 1; i <= nbw; i++) if (bws[i] >= 65536) { have = 1; r = bwr[bws[i], 1]; if (r == "") { w = "n/a"; break } if (w == "" || r + 0 < w + 0) { w = r; ws = bws[i] } }
	target("bulk: libsovia >= 0.95 x verbs at >= 64 KiB", have ? w : "n/a", ws, ">=", 0.95)
	w = ""; ws = ""
	for (i = 1; i <= nbw; i++) { r = bwr[bws[i], 2]; if (r == "") { w = "n/a"; break } if (w == "" || r + 0 < w + 0) { w = r; ws = bws[i] } }
	target("bandwidth >= rsockets at every size", w, ws, ">=", 1)
	w = ""; ws = ""
	for (i = 1; i <= nlat; i++) { r = latr[lats[i], 2]; if (r == "") { w = "n/a"; break } if (w == "" || r + 0 > w + 0) { w = r; ws = lats[i] } }
	target("latency <= rsockets at every size", w, ws, "<=", 1)
	target("64 B streaming >= 10 x rsockets", ((64, 2) in bwr) && bwr[64, 2] != "" ? bwr[64, 2] : "n/a", 64, ">=", 10)
	target("64 B latency median <= 1.15 x ib_send_lat", ((64, 1) in latr) && latr[64, 1] != "" ? latr[64, 1] : "n/a", 64, "<=", 1.15)
	target("set-up rate >= rsockets", connr == "" ? "n/a" : connr, "", ">=", 1)
	w = ""; ws = ""
	for (i = 1; i <= nbw; i++) { r = cpur[bws[i]]; if (r == "") { w = "n/a"; break } if (w == "" || r + 0 > w + 0) { w = r; ws = bws[i] } }
	target("CPU per GB <= rsockets", w, ws, "<=", 1)
	print "\n\"measured\" is the worst ratio over the sizes (at that size); n/a: a" > md
	print "variant failed or was not run.\n" > md
	print "Plots: [bandwidth](bandwidth.png), [latency](latency.png).\n" > md
}
function target(name, r, s, op, lim,   ok, at) {
	at = (s == "" ? "" : " (at " hsize(s) ")")
	if (r == "n/a" || r == "") { printf "| %s | n/a | unknown |\n", name > md; return }
	ok = (op == ">=") ? (r + 0 >= lim) : (r + 0 <= lim)
	printf "| %s | %s%s | %s |\n", name, r, at, ok ? "yes" : "**no**" > md
}
' "$CSV"

if [ -s "$DIR/copycost.md" ]; then
	{
		echo "## What a payload copy costs in this guest"
		echo
		echo "\`bench/sovia_copycost.c\`, 16 MiB per size: glibc's \`memcpy\` in one call"
		echo "against libsovia's copy in 2 KiB pieces (src/base/copy.h; why:"
		echo "docs/benchmarks.md, \"Copies in the test bed\")."
		echo
		cat "$DIR/copycost.md"
		echo
	} >>"$DIR/results.md"
fi

if [ -s "$DIR/pingsplit.md" ]; then
	{
		echo "## Where a 64 B round trip goes"
		echo
		echo "\`bench/sovia_pingsplit.c\`: a ping-pong that times each \`write()\` and"
		echo "each \`read()\` apart (medians, microseconds, TSC). On soft-RoCE the"
		echo "doorbell of \`ibv_post_send\` runs the whole send path in the sender's"
		echo "system call, so an RDMA write costs more than a one-way trip; the wait"
		echo "is what is left of the round trip (docs/benchmarks.md, \"What limits 64 B"
		echo "latency\")."
		echo
		cat "$DIR/pingsplit.md"
		echo
	} >>"$DIR/results.md"
fi

if command -v gnuplot >/dev/null; then
	gnuplot <<EOF
set terminal png size 960,600 noenhanced
set datafile missing "?"
set logscale xy
set grid
set key top left box opaque
set xlabel "write size (bytes)"
set ylabel "MiB/s"
set title "Streaming bandwidth (soft-RoCE under emulation, one run)"
set output "$DIR/bandwidth.png"
plot "$DIR/bandwidth.dat" using 1:2 with linespoints lc rgb "#7b3294" title "verbs send (ib_send_bw)", \
     "" using 1:3 with linespoints lc rgb "#008837" title "verbs write (ib_write_bw)", \
     "" using 1:4 with linespoints lc rgb "#2c7bb6" title "kernel TCP", \
     "" using 1:5 with linespoints lc rgb "#d7191c" title "rsockets", \
     "" using 1:6 with linespoints lw 2 lc rgb "#000000" title "libsovia"
set ylabel "microseconds (one way)"
set xlabel "message size (bytes)"
set title "Ping-pong latency, median (soft-RoCE under emulation, one run)"
set output "$DIR/latency.png"
plot "$DIR/latency.dat" using 1:2 with linespoints lc rgb "#7b3294" title "verbs send (ib_send_lat)", \
     "" using 1:3 with linespoints lc rgb "#2c7bb6" title "kernel TCP", \
     "" using 1:4 with linespoints lc rgb "#d7191c" title "rsockets", \
     "" using 1:5 with linespoints lw 2 lc rgb "#000000" title "libsovia"
EOF
else
	echo "report.sh: gnuplot not installed (bench/setup-deps.sh): no plots" >&2
fi
echo "report: $DIR/results.md, $DIR/ratios.csv$(command -v gnuplot >/dev/null && echo ", $DIR/bandwidth.png, $DIR/latency.png")"
