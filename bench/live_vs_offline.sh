#!/usr/bin/env bash
# The live model against offline training on the same events (issue "the live model as good as
# offline training"): a MovieLens file is split by a hash of the line into 90 % streamed and 10 %
# never streamed; `mfstream produce` replays the 90 % in timestamp order into the embedded
# broker (one partition: the order survives), `mfstream serve` learns it once, and its final
# snapshot is scored on the never-streamed 10 % (`mfstream predict`). Beside it, `mfstream
# train` on the same 90 % with 1 and with 20 epochs, scored on the same 10 %. Prints a table,
# writes CSV.
#
#   bench/live_vs_offline.sh BUILD_DIR OUT.csv [DATA_DIR]      (default ../shared/data/movielens)
#
# Knobs: FILES (default "ml-latest-small_ratings.csv ml-1m-prefix487650_ratings.dat"),
# ENGINE (cpu), SERVE_ARGS (more serve options, e.g. a replay budget), RUNS ("live" label
# suffixes run with SERVE_ARGS; add rows by calling the script again with another CSV).
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/live-vs-offline.csv}
data=${3:-../shared/data/movielens}
bin=$build/mfstream
tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill -9 "$spid" 2>/dev/null; rm -rf "$tmp"' EXIT
rmse_of() { # snapshot test.tsv -> RMSE of the snapshot's predictions on the test ratings
	cut -f1,2 "$2" >"$tmp/pairs"
	"$bin" predict --snapshot "$1" --pairs "$tmp/pairs" 2>/dev/null >"$tmp/pred"
	paste "$tmp/pred" <(cut -f3 "$2") | awk '{ d = $1 - $2; s += d * d; n++ } END { printf "%.4f", sqrt(s / n) }'
}
applied() { "$bin" inspect --snapshot "$1" 2>/dev/null | awk '$1 == "events_applied" { a = $3 } $1 == "events_held_out" { h = $3 } END { print a + h + 0 }'; }
echo "dataset,run,events,test_ratings,test_rmse,seconds,events_per_s" >"$csv"
printf '%-22s %-22s %9s %8s %10s %9s %11s\n' dataset run events test n test_rmse seconds events/s
for f in ${FILES:-ml-latest-small_ratings.csv ml-1m-prefix487650_ratings.dat}; do
	src=$data/$f
	[ -f "$src" ] || src=$src.zst
	[ -f "$src" ] || { echo "no $data/$f(.zst): skipped"; continue; }
	# tsv "user item rating ts", split 90/10 by a hash of the line number
	zstdcat -f "$src" | awk -F'::|,|\t' 'NR == 1 && $1 !~ /^[0-9]+$/ { next } { print $1 "\t" $2 "\t" $3 "\t" $4 }' \
		>"$tmp/all.tsv"
	awk -v out="$tmp/train.tsv" -v test="$tmp/test.tsv" \
		'{ h = (NR * 2654435761) % 4294967296; if (h % 100 < 10) print > test; else print > out }' "$tmp/all.tsv"
	n=$(wc -l <"$tmp/train.tsv")
	nt=$(wc -l <"$tmp/test.tsv")
	name=${f%%_*}
	# live: one pass, timestamp order, test-then-train
	rm -rf "$tmp/snap"
	"$bin" serve --embedded-broker --partitions 1 --topic r --snapshot "$tmp/snap" --engine "${ENGINE:-cpu}" \
		--metrics.listen "" --serve.snapshot_ms 200 ${SERVE_ARGS:-} >"$tmp/serve.out" 2>"$tmp/serve.err" &
	spid=$!
	for _ in $(seq 300); do grep -q 'bootstrap=' "$tmp/serve.out" && break; sleep 0.1; done
	bs=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$tmp/serve.out" | head -1)
	for _ in $(seq 400); do grep -q 'msg=assigned' "$tmp/serve.err" && break; sleep 0.05; done
	t0=$(date +%s.%N)
	"$bin" produce --brokers "$bs" --topic r --input "$tmp/train.tsv" --batch 100 >/dev/null 2>&1
	while [ "$(applied "$tmp/snap")" -lt "$n" ]; do sleep 0.1; done
	t1=$(date +%s.%N)
	kill -TERM "$spid" && wait "$spid"
	spid=
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
	r=$(rmse_of "$tmp/snap" "$tmp/test.tsv")
	eps=$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')
	label="live${SERVE_ARGS:+ ($SERVE_ARGS)}"
	printf '%-22s %-22s %9s %8s %10s %9s %11s\n' "$name" "$label" "$n" "$nt" "$r" "$secs" "$eps"
	echo "$name,$label,$n,$nt,$r,$secs,$eps" >>"$csv"
	# offline: the same 90 %, 1 and 20 epochs, no early stopping, the same 10 % as the test
	for ep in 1 20; do
		rm -rf "$tmp/snap-$ep"
		t0=$(date +%s.%N)
		out=$("$bin" train --input "$tmp/train.tsv" --test "$tmp/test.tsv" --snapshot "$tmp/snap-$ep" \
			--epochs "$ep" --engine "${ENGINE:-cpu}" --log-level warn 2>/dev/null)
		t1=$(date +%s.%N)
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
		r=$(echo "$out" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
		printf '%-22s %-22s %9s %8s %10s %9s %11s\n' "$name" "train $ep epochs" "$n" "$nt" "$r" "$secs" -
		echo "$name,train $ep epochs,$n,$nt,$r,$secs," >>"$csv"
	done
done
echo "wrote $csv"
