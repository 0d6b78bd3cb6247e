#!/usr/bin/env bash
# The live model against offline training on the same events: a MovieLens file is split by a
# hash of the line into 90 % streamed and 10 % never streamed; `mfstream produce` replays the
# 90 % in timestamp order into the embedded broker (one partition: the order survives),
# `mfstream serve` learns it in one pass with replay at each budget of SHARES (serve.replay;
# 0 = off), and its final snapshot, taken once the replay owed is spent, is scored on the
# never-streamed 10 % (`mfstream predict`). Beside it, `mfstream train` on the same 90 % with
# 1 and 20 epochs, scored on the same 10 %. Prints a table, writes CSV, and for every live run a
# time series of its /metrics (scripts/scrape.py; `scripts/plot.py stream` charts it).
#
#   bench/live_vs_offline.sh BUILD_DIR OUT.csv [DATA_DIR]      (default ../shared/data/movielens)
#
# Knobs: FILES (default "ml-latest-small_ratings.csv ml-1m-prefix487650_ratings.dat"),
# SHARES (default "0 5 10 20"), RATE (events/s of the producer; default 0 = as fast as it can:
# a backlog, whose replay is spent after it), ENGINE (cpu), SERVE_ARGS (more serve options).
# Columns: seconds / events_per_s = until every event is applied; replayed_per_event = replayed
# updates / events; replay_tail_seconds = from the last event applied to the replay owed spent.
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/live-vs-offline.csv}
data=${3:-../shared/data/movielens}
bin=$build/mfstream
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill -9 "$spid" 2>/dev/null; rm -rf "$tmp"' EXIT
rmse_of() { # snapshot test.tsv -> RMSE of the snapshot's predictions on the test ratings
	cut -f1,2 "$2" >"$tmp/pairs"
	"$bin" predict --snapshot "$1" --pairs "$tmp/pairs" 2>/dev/null >"$tmp/pred"
	paste "$tmp/pred" <(cut -f3 "$2") | awk '{ d = $1 - $2; s += d * d; n++ } END { printf "%.4f", sqrt(s / n) }'
}
fetch() { # URL -> body (curl where it exists, else Python)
	if command -v curl >/dev/null; then curl -s "$1"; else
		python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"
	fi
}
metric() { fetch "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m { printf "%d", $2 }'; }
row() { printf '%-20s %-22s %8s %7s %9s %8s %9s %8s %8s\n' "$@"; }
echo "dataset,run,events,test_ratings,test_rmse,seconds,events_per_s,replayed_per_event,replay_tail_seconds" >"$csv"
row dataset run events test_n test_rmse seconds events/s replayed tail_s
for f in ${FILES:-ml-latest-small_ratings.csv ml-1m-prefix487650_ratings.dat}; do
	src=$data/$f
	[ -f "$src" ] || src=$src.zst
	[ -f "$src" ] || { echo "no $data/$f(.zst): skipped"; continue; }
	# tsv "user item rating ts", split 90/10 by a hash of the line number
	case $src in *.zst) unz="zstdcat" ;; *) unz="cat" ;; esac # the GPU machine has no zstd: carry plain files
	$unz "$src" | awk -F'::|,|\t' 'NR == 1 && $1 !~ /^[0-9]+$/ { next } { print $1 "\t" $2 "\t" $3 "\t" $4 }' \
		>"$tmp/all.tsv"
	awk -v out="$tmp/train.tsv" -v test="$tmp/test.tsv" \
		'{ h = (NR * 2654435761) % 4294967296; if (h % 100 < 10) print > test; else print > out }' "$tmp/all.tsv"
	n=$(wc -l <"$tmp/train.tsv")
	nt=$(wc -l <"$tmp/test.tsv")
	name=${f%%_*}
	for share in ${SHARES:-0 5 10 20}; do
		# live: one pass in timestamp order, test-then-train, replay at this budget
		rm -rf "$tmp/snap"
		: >"$tmp/serve.err"
		"$bin" serve --embedded-broker --partitions 1 --topic r --snapshot "$tmp/snap" --engine "${ENGINE:-cpu}" \
			--metrics.listen 127.0.0.1:0 --serve.snapshot_ms 200 --serve.replay "$share" ${SERVE_ARGS:-} \
			>"$tmp/serve.out" 2>"$tmp/serve.err" &
		spid=$!
		until grep -q 'msg=assigned' "$tmp/serve.err"; do
			kill -0 "$spid" 2>/dev/null || { cat "$tmp/serve.err"; exit 1; }
			sleep 0.05
		done
		bs=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$tmp/serve.out" | head -1)
		port=$(grep -o 'msg="metrics listening".*port=[0-9]*' "$tmp/serve.err" | grep -o 'port=[0-9]*' | head -1 | cut -d= -f2)
		ts=${csv%.csv}-$name-replay$share${RATE:+-rate$RATE}-timeseries.csv
		python3 "$here/scripts/scrape.py" "http://127.0.0.1:$port/metrics" "$ts" --interval 0.25 2>/dev/null &
		scpid=$!
		# the first sample before the first event: a burst can be applied before Python starts
		until [ "$(wc -l 2>/dev/null <"$ts" || echo 0)" -ge 2 ]; do
			kill -0 "$scpid" 2>/dev/null || { echo "scrape.py stopped before its first sample"; exit 1; }
			sleep 0.05
		done
		t0=$(date +%s.%N)
		"$bin" produce --brokers "$bs" --topic r --input "$tmp/train.tsv" --batch 100 --rate "${RATE:-0}" >/dev/null 2>&1
		until [ "$(metric mfstream_events_applied_total)" -ge "$n" ]; do sleep 0.05; done
		t1=$(date +%s.%N)
		# what a burst leaves owed to replay is spent once the stream is quiet
		while [ "$(metric mfstream_replay_owed_events)" -gt 0 ]; do sleep 0.05; done
		t2=$(date +%s.%N)
		kill -TERM "$spid" && wait "$spid"
		spid=
		wait "$scpid" || true
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
		tail_s=$(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.2f", b - a }')
		replayed=$("$bin" inspect --snapshot "$tmp/snap" 2>/dev/null | awk '$1 == "events_replayed" { print $3 }')
		per=$(awk -v r="${replayed:-0}" -v n="$n" 'BEGIN { printf "%.2f", r / n }')
		r=$(rmse_of "$tmp/snap" "$tmp/test.tsv")
		eps=$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')
		label="live replay=$share${RATE:+ rate=$RATE}"
		row "$name" "$label" "$n" "$nt" "$r" "$secs" "$eps" "$per" "$tail_s"
		echo "$name,$label,$n,$nt,$r,$secs,$eps,$per,$tail_s" >>"$csv"
	done
	# offline: the same 90 %, 1 and 20 epochs, the same 10 % as the test (read once, at the end)
	for ep in 1 20; do
		rm -rf "$tmp/snap-$ep"
		t0=$(date +%s.%N)
		out=$("$bin" train --input "$tmp/train.tsv" --test "$tmp/test.tsv" --snapshot "$tmp/snap-$ep" \
			--epochs "$ep" --engine "${ENGINE:-cpu}" --log-level warn 2>/dev/null)
		t1=$(date +%s.%N)
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
		r=$(echo "$out" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
		row "$name" "train $ep epochs" "$n" "$nt" "$r" "$secs" - - -
		echo "$name,train $ep epochs,$n,$nt,$r,$secs,,," >>"$csv"
	done
done
echo "wrote $csv"
