#!/usr/bin/env bash
# The README's first command: install what is missing, build, then
#   1. train a model offline on a synthetic stream (or on the ratings file given as $1),
#      publish a snapshot and answer queries from it (C CLI and Python reader);
#   2. go live: `mfstream serve` on an embedded Kafka broker, learning from an empty model
#      while `mfstream produce` streams another synthetic world into it; the live snapshot's
#      event count and test-then-train RMSE (each event scored before it is learned) are
#      printed about every half second, against the wall-clock seconds since serve started; a final query reads the live snapshot, and SIGTERM stops the
#      service cleanly with a final snapshot.
# Runs on the GPU when one answers, else on the CPU (engine.kind=auto).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
bin=build/release/mfstream
mkdir -p .data
input=${1:-}
if [ -z "$input" ]; then
	input=.data/demo.tsv.zst
	[ -f "$input" ] || "$bin" gen --gen.ratings 2000000 --gen.users 20000 --gen.items 5000 --gen.zipf 0.8 \
		--gen.noise 0.5 --gen.seed 1 --output "$input"
fi
snap=.data/demo-snapshot
rm -rf "$snap"
echo "== 1. offline: train and publish"
"$bin" train --input "$input" --snapshot "$snap" --epochs "${EPOCHS:-10}" --engine auto
echo; "$bin" inspect --snapshot "$snap"
echo; echo "top 5 items for user 1:"; "$bin" query --snapshot "$snap" --user 1 --top 5
echo; echo "the same from the Python reader:"
/usr/bin/python3 snapshots/reader/python/mfsnap.py "$snap" --user 1 --top 5

echo; echo "== 2. live: serve on an embedded broker, stream new ratings into it"
log=.data/demo-serve.log
live=.data/demo-live-snapshot
rm -rf "$live"
"$bin" serve --embedded-broker --partitions 4 --topic ratings --snapshot "$live" --engine auto \
	--serve.snapshot_ms 250 --log-level warn >"$log" 2>&1 &
serve=$!
t0=$(date +%s.%N) # the table's clock: wall time since serve started, not a count of sleeps
trap 'kill -TERM $serve 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "bootstrap=" "$log" && break; sleep 0.1; done
addr=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$log" | head -1)
[ -n "$addr" ] || { echo "serve did not start:"; cat "$log"; exit 1; }
"$bin" produce --brokers "$addr" --topic ratings --synthetic --gen.ratings "${LIVE:-1000000}" \
	--gen.users 5000 --gen.items 2000 --gen.zipf 0.8 --gen.noise 0.5 --gen.seed 2 --rate 100000 \
	--batch 500 >.data/demo-produce.out 2>&1 &
prod=$!
# One row per half second or so (inspect itself takes time on a busy machine, so rows are not
# exactly 0.5 s apart): wall_s, the wall-clock seconds since serve started, and the live
# snapshot's events_applied and prequential RMSE; while produce runs, then until the service
# has applied every event (at most 30 s more).
printf '%8s %14s %18s\n' wall_s events_applied prequential_rmse
applied=0 produced_at=""
while :; do
	sleep 0.5
	if ! kill -0 $prod 2>/dev/null; then
		[ -n "$produced_at" ] || produced_at=$SECONDS
		if [ "$applied" -ge "${LIVE:-1000000}" ] || [ $((SECONDS - produced_at)) -ge 30 ]; then break; fi
	fi
	m=$("$bin" inspect --snapshot "$live" 2>/dev/null) || continue
	applied=$(echo "$m" | sed -n 's/^events_applied = //p')
	printf '%8s %14s %18s\n' "$(awk -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN { printf "%.1f", t - t0 }')" \
		"$applied" "$(echo "$m" | sed -n 's/^prequential_rmse = //p')"
done
wait $prod && tail -1 .data/demo-produce.out
sleep 0.5
echo; echo "top 5 items for user 1 from the live snapshot:"; "$bin" query --snapshot "$live" --user 1 --top 5
kill -TERM $serve; wait $serve && echo "serve stopped cleanly (final snapshot published)"
trap - EXIT
