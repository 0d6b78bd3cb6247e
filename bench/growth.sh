#!/usr/bin/env bash
# Growth without stalls (issue 17, item 6): a stream of nearly all new users (ids drawn from
# 20 M) at RATE events/s through `serve --embedded-broker` (64 partitions) until the user table
# has grown past 8 M rows (from 1 M: three doublings). bench/growth_sample.py samples /metrics
# every 0.5 s: users, the table's capacity, events/s, the p99 of message create -> applied over
# each interval, the learner's seconds in its grow and rows phases. Summary: the p99 over the
# intervals in which the capacity changed (growth) against the median p99 of the others once
# the table holds 1 M users (steady), and the most grow-phase seconds in one interval.
#
#   bench/growth.sh BUILD_DIR OUT.csv      (EVENTS=12000000 RATE=1000000 ENGINE=cuda K=128
#                                           SERVE_ARGS="--serve.replay 0")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$1/mfstream
csv=$2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$tmp"' EXIT
"$bin" serve --embedded-broker --partitions 64 --topic g --snapshot "$tmp/snap" --engine "${ENGINE:-cuda}" \
	--k "${K:-128}" --metrics.listen 127.0.0.1:0 ${SERVE_ARGS:---serve.replay 0} >"$tmp/out" 2>"$tmp/err" &
spid=$!
until grep -q 'msg=assigned' "$tmp/err"; do
	kill -0 "$spid" 2>/dev/null || { cat "$tmp/err"; exit 1; }
	sleep 0.1
done
bs=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$tmp/out" | head -1)
port=$(grep -o 'msg="metrics listening".*port=[0-9]*' "$tmp/err" | grep -o 'port=[0-9]*' | head -1 | cut -d= -f2)
python3 "$here/bench/growth_sample.py" "http://127.0.0.1:$port/metrics" "$csv" &
smp=$!
events=${EVENTS:-12000000}
"$bin" produce --brokers "$bs" --topic g --synthetic --gen.ratings "$events" --gen.users 20000000 \
	--gen.items 100000 --gen.user_skew 0 --rate "${RATE:-1000000}" --batch 100 >/dev/null 2>&1
until [ "$(curl -s "http://127.0.0.1:$port/metrics" |
	awk '$1 == "mfstream_events_applied_total" { printf "%d", $2 }')" -ge "$events" ]; do sleep 0.2; done
sleep 1
kill -TERM "$spid"
wait "$spid" || true
wait "$smp" || true
# serve's slow-snapshot lines (which part held the learner) and progress lines beside the CSV
grep -E 'slow snapshot|msg=progress|whole tables' "$tmp/err" >"${csv%.csv}-serve.log" || true
python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["p99_applied_s"]]
grow, steady, prev, pgrow = [], [], None, False
for r in rows:
    changed = prev is not None and r["cap_users"] != prev
    if changed or pgrow:
        grow.append(float(r["p99_applied_s"]))
    elif int(r["users"]) >= 1000000:
        steady.append(float(r["p99_applied_s"]))
    pgrow, prev = changed, r["cap_users"]
g = max(grow) if grow else 0
m = statistics.median(steady) if steady else 0
print("users at the end %s; growth intervals %d: p99 event->applied max %.3f s; steady intervals %d: median p99 %.3f s;"
      " ratio %.2f; most grow-phase seconds in one interval %.3f; capacities %s" % (
          rows[-1]["users"] if rows else 0, len(grow), g, len(steady), m, g / m if m else 0,
          max(float(r["grow_s"]) for r in rows) if rows else 0,
          sorted({int(r["cap_users"]) for r in rows})))
PY
echo "wrote $csv (and ${csv%.csv}-serve.log)"
