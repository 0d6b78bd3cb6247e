#!/usr/bin/env bash
# The command line against the real Kafka broker of the kafka fixture (tests/kafka/fixture.sh):
# `mfstream produce` into a topic of its own, kcat's count of what landed there (the broker's
# own view, no mfstream code), then `mfstream serve --serve.exit_at_end true` reads it all and
# exits 0 with every event in its snapshot and the high watermarks as its offsets; the group's
# committed offsets (kafka-consumer-groups.sh) equal them. Exit 77 where the fixture found no
# broker, or kcat is missing.
set -euo pipefail
bin=${MFS_BIN:?}
state=$(cat "${MFS_KAFKA_FIXTURE:-/nonexistent}/state" 2>/dev/null || echo "absent: no fixture state")
case $state in
up\ *) bs=${state#up } ;;
*) echo "SKIP: real Kafka broker: $state"; exit 77 ;;
esac
command -v kcat >/dev/null || { echo "SKIP: no kcat (scripts/setup-deps.sh installs it)"; exit 77; }
kh=${MFS_KAFKA_HOME:-${MFS_SRC_DIR:-.}/../shared/kafka}/kafka_2.11-2.4.0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/serve.err" ] && tail -20 "$tmp/serve.err"; exit 1; }
topic=cli-$$-$RANDOM
group=mfs-test-cli-$$
"$kh/bin/kafka-topics.sh" --bootstrap-server "$bs" --create --topic "$topic" --partitions 3 \
	--replication-factor 1 >"$tmp/topics.out" 2>&1 || { cat "$tmp/topics.out"; fail "could not create $topic"; }
"$bin" produce --brokers "$bs" --topic "$topic" --synthetic --n 30000 --users 700 --items 400 --batch 100 \
	2>"$tmp/produce.err" >"$tmp/produce.out" || { cat "$tmp/produce.err"; fail "produce into the broker failed"; }
msgs=$(sed -n 's/.* messages=\([0-9]*\) .*/\1/p' "$tmp/produce.out")
[ "${msgs:-0}" -gt 0 ] || fail "produce reported no messages: $(cat "$tmp/produce.out")"
landed=$(kcat -C -b "$bs" -t "$topic" -e -q -f '%o\n' 2>/dev/null | wc -l)
[ "$landed" -eq "$msgs" ] || fail "kcat reads $landed messages, produce sent $msgs"
"$bin" serve --brokers "$bs" --topic "$topic" --snapshot "$tmp/snap" --k 16 --engine cpu --serve.exit_at_end true \
	--kafka.group.id "$group" --metrics.listen "" 2>"$tmp/serve.err" >/dev/null || fail "serve did not exit 0"
got=$("$bin" inspect --snapshot "$tmp/snap" | sed -n 's/^events_applied = //p')
[ "$got" = 30000 ] || fail "the snapshot holds $got events, not 30000"
# the snapshot's offsets and the group's committed offsets are the high watermarks
offs=$("$bin" inspect --snapshot "$tmp/snap" | sed -n "s/^offset\/$topic\/\([0-9]*\) = \([0-9]*\)/\1 \2/p" | sort)
hw=$(kcat -Q -b "$bs" -t "$topic:0:-1" -t "$topic:1:-1" -t "$topic:2:-1" 2>/dev/null |
	sed -n 's/.*\[\([0-9]*\)\] offset \([0-9]*\)/\1 \2/p' | sort)
[ -n "$hw" ] && [ "$offs" = "$hw" ] || fail "snapshot offsets [$offs], high watermarks [$hw]"
committed=$("$kh/bin/kafka-consumer-groups.sh" --bootstrap-server "$bs" --describe --group "$group" 2>/dev/null |
	awk -v t="$topic" '$2 == t { print $3, $4 }' | sort)
[ "$committed" = "$hw" ] || fail "committed offsets [$committed], high watermarks [$hw]"
echo "produce $msgs messages -> kcat $landed -> serve 30000 events, offsets = high watermarks = committed"
