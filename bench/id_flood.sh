#!/usr/bin/env bash
# An id flood against bounded and unbounded user tables (docs/OPERATIONS.md, "Bounds"): `serve
# --embedded-broker` (CPU engine, k=32, replay off) takes EVENTS synthetic ratings whose users
# are drawn from 20 M ids (nearly every event a new user) at RATE events/s, once per value of
# MAX (model.max_users; 0 = no bound; ENGINE=cuda for the GPU). Every second it samples serve's RSS and its metrics.
# Prints the samples; writes OUT_PREFIX-max<M>.csv
# (t_s,rss_mib,events_applied,events_dropped,users,users_evicted,rss_anon_mib,rss_file_mib: the
# process's own memory, and the LMDB pages it has mapped, page cache the kernel can reclaim). ON_FULL=evict (default) or
# drop is model.on_full.
# Note: the embedded broker keeps the topic in serve's own process (up to ~5 MiB per partition,
# so RSS grows with the topic, and a long flood loses messages): BROKERS=HOST:PORT runs it against
# a real broker instead (a topic of its own, made with KAFKA_HOME's kafka-topics.sh, default
# ../shared/kafka).
#
#   bench/id_flood.sh BUILD_DIR OUT_PREFIX          (MAX="200000 0" EVENTS=2000000 RATE=200000
#                                                    USERS=20000000 USER_SKEW=0.5 BROKERS= ENGINE=cpu ON_FULL=evict)
set -euo pipefail
bin=$1/mfstream
prefix=$2
events=${EVENTS:-2000000}
for max in ${MAX:-200000 0}; do
	d=$(mktemp -d)
	log=$d/serve.log
	if [ -n "${BROKERS:-}" ]; then # a real broker: a topic of its own
		topic=flood-$max-$$
		"${KAFKA_HOME:-../shared/kafka}/kafka_2.11-2.4.0/bin/kafka-topics.sh" --bootstrap-server "$BROKERS" \
			--create --topic "$topic" --partitions 16 --replication-factor 1 >/dev/null
		src=(--brokers "$BROKERS" --kafka.group.id "$topic")
	else
		topic=r
		src=(--embedded-broker --partitions 16)
	fi
	"$bin" serve "${src[@]}" --topic "$topic" --snapshot "$d/snap" --engine "${ENGINE:-cpu}" --k 32 \
		--model.max_users "$max" --model.on_full "${ON_FULL:-evict}" --serve.snapshot_ms 500 --metrics.listen 127.0.0.1:0 --serve.replay 0 \
		>"$d/out" 2>"$log" &
	pid=$!
	until grep -q 'msg=assigned' "$log"; do
		kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
		sleep 0.1
	done
	bs=${BROKERS:-$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' "$d/out" | head -1)}
	port=$(grep -o 'metrics listening.*port=[0-9]*' "$log" | grep -o '[0-9]*$')
	"$bin" produce --brokers "$bs" --topic "$topic" --synthetic --gen.ratings "$events" --gen.users "${USERS:-20000000}" --gen.user_skew "${USER_SKEW:-0.5}" \
		--gen.items 20000 --rate "${RATE:-200000}" >/dev/null 2>&1 &
	ppid=$!
	csv=$prefix-max$max.csv
	echo "t_s,rss_mib,events_applied,events_dropped,users,users_evicted,rss_anon_mib,rss_file_mib" >"$csv"
	t0=$(date +%s.%N)
	done_n=0
	while kill -0 "$ppid" 2>/dev/null || [ "$done_n" -lt "$events" ]; do
		m=$(curl -s "http://127.0.0.1:$port/metrics")
		a=$(echo "$m" | awk '$1 == "mfstream_events_applied_total" { printf "%d", $2 }')
		dr=$(echo "$m" | awk '$1 == "mfstream_events_dropped_total" { printf "%d", $2 }')
		u=$(echo "$m" | awk '$1 == "mfstream_model_rows{table=\"users\"}" { printf "%d", $2 }')
		ev=$(echo "$m" | awk '$1 == "mfstream_ids_evicted_total{table=\"users\"}" { printf "%d", $2 }')
		rss=$(awk '/VmRSS/ { printf "%d", $2 / 1024 }' "/proc/$pid/status")
		anon=$(awk '/RssAnon/ { printf "%d", $2 / 1024 }' "/proc/$pid/status")
		file=$(awk '/RssFile/ { printf "%d", $2 / 1024 }' "/proc/$pid/status")
		done_n=$((${a:-0} + ${dr:-0}))
		row="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'),$rss,${a:-0},${dr:-0},${u:-0},${ev:-0},${anon:-0},${file:-0}"
		echo "$row" >>"$csv"
		echo "max_users=$max $row"
		sleep 1
	done
	kill -TERM "$pid"
	wait "$pid"
	grep -E 'slow snapshot|msg=progress|msg=stopped|whole tables' "$log" >"${csv%.csv}-serve.log" || true
	rm -rf "$d"
	echo "wrote $csv (and ${csv%.csv}-serve.log: serve's progress lines)"
done
