#!/usr/bin/env bash
# Forgetting on a stream whose tastes drift (issue 17, item 5): `mfstream gen` with
# gen.drift_period (each user's planted factors turn a full circle every DRIFT ratings), streamed
# once in order (8 partitions: nearly in order) through `serve --embedded-broker` (test, then
# train: the prequential RMSE is every event scored by the model as it stood just before
# learning it), for each value of the forgetting key HL_KEY (default serve.replay_half_life_s)
# in HALF_LIVES (0 = no forgetting) and each serve.replay in REPLAYS. Timestamps are 1 ms apart,
# so DRIFT ratings are DRIFT / 1000 s of event time. Prints a table, writes OUT.csv.
#
#   bench/drift.sh BUILD_DIR OUT.csv     (N=2000000 USERS=20000 ITEMS=5000 DRIFT=1000000
#                                         HALF_LIVES="0 100 300 1000" REPLAYS="0 20" ENGINE=cpu
#                                         REPEATS=1 HL_KEY=serve.replay_half_life_s SERVE_ARGS= RATE=0)
# With RATE=0 the stream is a backlog and replay gets whatever idle moments the learner has,
# which differ from run to run (0.64-0.67 for one setting); a RATE (200000 in BENCHMARKS.md) gives
# replay a steady share: repeated runs then agree within 0.0003. REPEATS repeats each setting.
set -euo pipefail
bin=$1/mfstream
csv=$2
n=${N:-2000000}
tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$bin" gen --n "$n" --users "${USERS:-20000}" --items "${ITEMS:-5000}" --gen.drift_period "${DRIFT:-1000000}" \
	--output "$tmp/drift.tsv" 2>/dev/null
echo "stream,drift_period,half_life_s,replay,events,prequential_rmse,seconds" >"$csv"
printf "%-10s %-12s %-8s %-10s %-16s %s\n" drift half_life replay events prequential_rmse seconds
for replay in ${REPLAYS:-0 20}; do
	for hl in ${HALF_LIVES:-0 100 300 1000}; do
	for rep in $(seq "${REPEATS:-1}"); do
		rm -rf "$tmp/snap"
		"$bin" serve --embedded-broker --partitions 8 --topic r --snapshot "$tmp/snap" --engine "${ENGINE:-cpu}" \
			--metrics.listen 127.0.0.1:0 --serve.snapshot_ms 500 --serve.replay "$replay" \
			--${HL_KEY:-serve.replay_half_life_s} "$hl" ${SERVE_ARGS:-} >"$tmp/serve.out" 2>"$tmp/serve.err" &
		spid=$!
		until grep -q 'msg=assigned' "$tmp/serve.err"; do
			kill -0 "$spid" 2>/dev/null || { cat "$tmp/serve.err"; exit 1; }
			sleep 0.05
		done
		bs=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$tmp/serve.out" | head -1)
		port=$(grep -o 'msg="metrics listening".*port=[0-9]*' "$tmp/serve.err" | grep -o 'port=[0-9]*' | head -1 | cut -d= -f2)
		t0=$(date +%s.%N)
		"$bin" produce --brokers "$bs" --topic r --input "$tmp/drift.tsv" --batch 100 --rate "${RATE:-0}" >/dev/null 2>&1
		until [ "$(curl -s "http://127.0.0.1:$port/metrics" |
			awk '$1 == "mfstream_events_applied_total" { printf "%d", $2 }')" -ge "$n" ]; do sleep 0.1; done
		t1=$(date +%s.%N)
		kill -TERM "$spid" && wait "$spid"
		spid=
		r=$("$bin" inspect --snapshot "$tmp/snap" 2>/dev/null | awk '$1 == "prequential_cumulative_rmse" { print $3 }')
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
		printf "%-10s %-12s %-8s %-10s %-16s %s\n" "${DRIFT:-1000000}" "$hl" "$replay" "$n" "$r" "$secs"
		echo "synthetic,${DRIFT:-1000000},$hl,$replay,$n,$r,$secs" >>"$csv"
	done
	done
done
echo "wrote $csv"
