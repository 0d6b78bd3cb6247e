#!/usr/bin/env bash
# `mfstream serve` through the binary: the --embedded-broker demo path (serve starts the mock
# cluster and prints its address; `mfstream produce` feeds it), SIGTERM -> exit 0 with the
# final snapshot, a restart from a `train` snapshot (bootstrap: no offsets, starts at the
# beginning), and the usage errors (exit 2).
set -euo pipefail
bin=${MFS_BIN:?}
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP # through the EXIT trap: the background serve never outlives the test
# a time limit of $1 seconds times MFS_TEST_TIMEOUT_SCALE (default 3, as testhelp.h), as a deadline on $SECONDS
deadline() { awk -v s="$1" -v f="${MFS_TEST_TIMEOUT_SCALE:-3}" -v now="$SECONDS" \
	'BEGIN { f += 0; if (f <= 0) f = 3; printf "%d", now + s * f }'; }
fail() { echo "FAIL: $*"; [ -f "$tmp/serve.err" ] && tail -20 "$tmp/serve.err"; exit 1; }

# usage errors
set +e
"$bin" serve --snapshot "$tmp/x" --brokers 127.0.0.1:1 2>/dev/null; [ $? -eq 2 ] || fail "no topic: want exit 2"
"$bin" serve --topic t --brokers 127.0.0.1:1 2>/dev/null; [ $? -eq 2 ] || fail "no snapshot: want exit 2"
"$bin" serve --topic t --snapshot "$tmp/x" 2>/dev/null; [ $? -eq 2 ] || fail "no brokers: want exit 2"
"$bin" serve --topic t --snapshot "$tmp/x" --brokers "" 2>/dev/null; [ $? -eq 2 ] || fail "empty --brokers: want exit 2"
"$bin" serve --topic t --snapshot "$tmp/x" --brokers b --config "$tmp" 2>/dev/null; [ $? -eq 2 ] || fail "--config DIR: want exit 2"
"$bin" serve --topic t --snapshot "$tmp/x" --serve.batch_size 0 --brokers b 2>/dev/null; [ $? -eq 2 ] || fail "bad key: want exit 2"
set -e

# bootstrap the model offline, then stream on top of it
"$bin" gen --gen.ratings 5000 --gen.users 300 --gen.items 200 --gen.seed 5 --output "$tmp/r.tsv" 2>/dev/null
"$bin" train --input "$tmp/r.tsv" --snapshot "$tmp/snap" --k 16 --epochs 2 --engine cpu 2>/dev/null >/dev/null
"$bin" serve --embedded-broker --partitions 2 --topic demo --snapshot "$tmp/snap" --k 16 --engine cpu \
	--serve.snapshot_ms 100 --metrics.listen 127.0.0.1:0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
pid=$!
end=$(deadline 10)
while [ "$SECONDS" -le "$end" ]; do grep -q "bootstrap=" "$tmp/serve.out" && break; sleep 0.1; done
addr=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$tmp/serve.out")
[ -n "$addr" ] || fail "serve printed no bootstrap address"
base=$("$bin" inspect --snapshot "$tmp/snap" | sed -n 's/^events_applied = //p')
"$bin" produce --brokers "$addr" --topic demo --synthetic --n 20000 --users 500 --items 300 2>/dev/null \
	>"$tmp/produce.out" || fail "produce into the embedded broker failed"
msgs=$(sed -n 's/.* messages=\([0-9]*\) .*/\1/p' "$tmp/produce.out")
want=$((base + 20000))
got=0
end=$(deadline 30)
while [ "$SECONDS" -le "$end" ]; do
	got=$("$bin" inspect --snapshot "$tmp/snap" | sed -n 's/^events_applied = //p')
	[ "$got" -ge "$want" ] && break
	sleep 0.1
done
[ "$got" -eq "$want" ] || fail "events_applied $got, want $want"
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=
[ "$rc" -eq 0 ] || fail "serve exit $rc after SIGTERM"
"$bin" inspect --snapshot "$tmp/snap" >"$tmp/meta"
off=$(sed -n 's/^offset\/demo\/[01] = //p' "$tmp/meta" | awk '{s += $1} END {print s}')
[ "$off" -eq "$msgs" ] || fail "offsets sum to $off, want the $msgs messages produced"
grep -q "^mu_count" "$tmp/meta" || fail "no mu_count"
echo "serve cli: ok (events_applied $got, offsets $off)"
