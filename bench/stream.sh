#!/usr/bin/env bash
# The streaming benchmark (this VM): events/s through the embedded broker (or a real one) into the CPU engine
# with 100 and 1000 events per message; message create -> snapshot-visible and -> applied
# latency p50/p99 at a steady rate with snapshots every 250 ms, for snapshot.sync=full and none; a /metrics time series
# of a 30 s run with a holdout (scripts/scrape.py -> OUT-timeseries.csv, charted by
# scripts/plot.py stream); snapshot publish time for 10K / 100K / 1M touched rows at k=128 in
# every sync mode. Prints tables; writes CSV.        bench/stream.sh BUILD_DIR OUT_PREFIX [EVENTS]
#
# Throughput: `serve --embedded-broker` consumes while `produce` fills the topic as fast as it can
# (on the same 2 cores); events/s = events / (first message produced -> last event applied, as
# seen in the snapshot; with SERVICES, in the sum over the services' snapshots). Latency: the
# service's own histogram of (snapshot commit wall time - Kafka message create time), logged at
# shutdown. Each throughput run also writes a per-thread CPU profile (OUT-threads.csv: CPU
# seconds and busy fraction per thread name of serve, and the producer's whole process): the
# thread near 100 % is the bottleneck.
# Knobs (environment): ENGINE=cuda runs the service on the GPU; SECTIONS (default
# throughput,latency,timeseries,snapshot) picks the parts; PARTITIONS (default 4) the topic's
# partitions; EPM (default "100 1000") the events per message of the throughput runs; PRODUCERS
# (default 1) the producer processes of a throughput or time-series run (n/PRODUCERS events
# each, own seeds); TS_EVENTS and TS_RATE (default 3000000 at 100000/s) the time series run,
# TS_EPM (default 100) its events per message, TS_HOLDOUT (0.02) and TS_FULLPASS_MS (1000) its
# holdout and full-pass period, TS_ARGS more serve options, TS_PRODUCE_ARGS more options of its
# producers (the run stops when the disk under the snapshot has less than DISK_MIN_MB, default
# 2048, MiB free), TS_WARM events sent first (at TS_WARM_RATE; the producers' own users, none
# arriving) and applied before the measured run starts (the run's CPU profile: OUT-ts-threads.csv;
# where the learner's time went, from mfstream_learner_seconds: OUT-ts-learner.csv);
# PRODUCER_CPUS and SERVE_CPUS pin the producers and serve to core lists (taskset);
# SERVE_ARGS more serve options, PRODUCE_ARGS more options of a throughput run's producers
# (e.g. --gen.users 1000000); USER_OFFSET_STEP gives the time series' producer j the users from
# j x this on (gen.user_offset), so producers with arriving users (gen.user_arrival) draw disjoint ones.
# SERVICES (default 1) the serve processes of a throughput run: one consumer group on the topic
# sharing item factors through exchange.topic (a deployment's one service a GPU; service 0 hosts
# the embedded broker, the others join it), each with a snapshot of its own; with ENGINE=cuda
# service j runs on the j-th device of DEVICES (default 0,1,...,SERVICES-1); the run starts
# producing once the group has settled (within SETTLE_S, default 120, s; the embedded broker holds
# a rebalance for the session timeout less 1 s, 44 s by default, 5 s with SERVE_ARGS="--kafka.
# session.timeout.ms 6000") and prints, per service, its partitions, events and "exchange done" counts.
#
# Against a real Kafka broker: `bench/stream.sh --brokers HOST:PORT BUILD_DIR OUT_PREFIX [EVENTS]`
# (or BROKERS=HOST:PORT): every run gets a topic of its own on it (created with the
# kafka-topics.sh of KAFKA_HOME, default ../shared/kafka), and the section backlog (on by default
# there) compares serve with kcat on the same backlog: the topic is produced first, then kcat
# reads it all (`kcat -C -e`: the consumption ceiling of one librdkafka client) and serve applies
# it all (from its first assignment to the snapshot that holds every event), REPS (3) times each,
# alternating; OUT-backlog.csv. The embedded broker keeps ~5 MiB per
# partition: the throughput run produces everything at once, so keep EVENTS x ~21 bytes /
# PARTITIONS under that (e.g. 12 M events on 64 partitions); a rate-limited run only needs the
# consumer to keep up (it fails with a message when it falls behind).
set -euo pipefail
if [ "${1:-}" = --brokers ]; then
	BROKERS=$2
	shift 2
fi
brokers=${BROKERS:-}
sections=${SECTIONS:-throughput,latency,timeseries,snapshot${brokers:+,backlog}}
want() { case ",$sections," in *",$1,"*) return 0 ;; esac; return 1; }
build=${1:-build}
out=${2:-bench/results/stream-vm}
n=${3:-2000000}
bin=$build/mfstream
tmp=$(mktemp -d)
# on the way out (a run that fell behind exits early) stop serve and the producers and wait
# for them: a GPU job run next must not share the device with serve's shutdown. A throughput
# run's services 1.. (svc_pids) go first: their shutdown (final snapshot, commit) needs the
# embedded broker in service 0.
# KEEP_LOGS=DIR keeps serve's and the producers' logs there
svc_pids=()
trap '{ kill ${svc_pids[*]:-} && wait ${svc_pids[*]:-}; } 2>/dev/null || true; kill $(jobs -p) 2>/dev/null || true; wait; [ -n "${KEEP_LOGS:-}" ] && cp "$tmp"/*.log "$KEEP_LOGS"/ 2>/dev/null; rm -rf "$tmp"' EXIT
py=/usr/bin/python3
# PRODUCER_CPUS / SERVE_CPUS (taskset lists, e.g. 10-15 and 0-9): the producers and serve each on
# cores of their own, so that a run measures serve without the producers on its cores
prod_pin=()
serve_pin=()
[ -n "${PRODUCER_CPUS:-}" ] && prod_pin=(taskset -c "$PRODUCER_CPUS")
[ -n "${SERVE_CPUS:-}" ] && serve_pin=(taskset -c "$SERVE_CPUS")
events_applied() { # events applied + held out in the snapshot at $1 (0 when none); the C
	# reader, so the GPU machine (no python3-lmdb) can run this too
	"$bin" inspect --snapshot "$1" 2>/dev/null |
		awk '$1 == "events_applied" { a = $3 } $1 == "events_held_out" { h = $3 } END { print a + h + 0 }'
}
applied_sum() { # dir... -> events applied + held out, summed over the snapshots at dir...
	local d s=0
	for d in "$@"; do
		s=$((s + $(events_applied "$d")))
	done
	echo "$s"
}
learner_applied() { # port -> events applied + held out by the learner (learner_phases' scrape);
	# nothing when the scrape fails (a loaded host can keep serve's metrics thread waiting)
	learner_phases "$1" 2>/dev/null | awk '/^mfstream_events_/ { s += $2; n++ } END { if (n) printf "%d\n", s }'
}
wait_applied() { # dir n [port [dir...]]: until the snapshot in dir counts n events (with more
	# dirs after the port, "" for none: the services of one group, their snapshots summed).
	# Without a port it fails after 20 s without progress. With serve's metrics port it tells the
	# learner from the writer: it fails when the learner stops short of n for 20 s (the embedded broker dropped
	# what it was given), and once the learner has all n it gives the snapshot writer
	# SNAP_WAIT_S (120) s without a new snapshot (one publish can take that long under load)
	local last=-1 same=0 now lnow llast=-1 t_all="" dirs=("$1") sum=""
	if [ $# -gt 3 ]; then
		dirs+=("${@:4}")
		sum=" (summed over ${#dirs[@]} snapshots)"
	fi
	while now=$(applied_sum "${dirs[@]}"); [ "$now" -lt "$2" ]; do
		if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; last=$now; fi
		if [ -n "${3:-}" ]; then
			lnow=$(learner_applied "$3")
			[ -n "$lnow" ] || lnow=$llast # no answer: as last time
			[ "$lnow" != "$llast" ] && [ "$lnow" -lt "$2" ] && same=0
			llast=$lnow
			if [ "$lnow" -ge "$2" ] && [ -z "$t_all" ]; then t_all=$(date +%s.%N); same=0; fi
			# the learner has it all, or its count is unknown (no scrape has answered yet)
			if { [ -n "$t_all" ] || [ "$llast" -lt 0 ]; } && [ $same -ge $((${SNAP_WAIT_S:-120} * 2)) ]; then
				echo "snapshot writer behind: the snapshot is at $now of $2 events$sum after ${SNAP_WAIT_S:-120} s" \
					"without a new one (the learner's count: $llast)" >&2
				return 1
			fi
			if [ -z "$t_all" ] && [ "$llast" -ge 0 ] && [ $same -ge 40 ]; then
				echo "learner stuck at $lnow of $2 events for 20 s (snapshot at $now$sum): the embedded broker keeps" \
					"~5 MiB per partition and drops older data silently when the consumer falls that far behind" >&2
				return 1
			fi
			sleep 0.5
			continue
		fi
		if [ $same -ge 200 ]; then
			echo "stuck at $now of $2 events$sum for 20 s: the embedded broker keeps ~5 MiB per partition and" \
				"drops older data silently when the consumer falls that far behind (fewer events, more" \
				"partitions, or a --rate)" >&2
			return 1
		fi
		sleep 0.1
	done
	if [ -n "$t_all" ]; then
		echo "  the last snapshot came $("$py" -c "print(f'{$(date +%s.%N) - $t_all:.1f}')") s after the learner had every event"
	fi
}
stopped() { # log key: key's value in serve's last "msg=stopped" line
	grep -o 'msg=stopped.*' "$1" | tail -1 | grep -o "$2=[^ ]*" | cut -d= -f2
}
thread_ticks() { # pid -> "comm ticks" per thread (utime + stime), for the per-thread CPU profile
	local t
	for t in /proc/"$1"/task/*; do
		printf '%s %s\n' "$(cat "$t/comm" 2>/dev/null)" "$(awk '{print $14 + $15}' "$t/stat" 2>/dev/null)"
	done 2>/dev/null
}
thread_profile() { # before after wall_s label csv: CPU seconds per thread name over the run
	"$py" - "$@" <<'PY'
import collections, os, sys
before, after, wall, label, csv = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
hz = os.sysconf("SC_CLK_TCK")
def load(p):
    d = collections.Counter(); n = collections.Counter()
    for line in open(p):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            d[parts[0]] += int(parts[1]); n[parts[0]] += 1
    return d, n
b, _ = load(before); a, n = load(after)
rows = sorted(((a[k] - b.get(k, 0)) / hz, k) for k in a)[::-1]
new = not os.path.exists(csv)
with open(csv, "a") as f:
    if new:
        f.write("run,thread,threads,cpu_s,busy_fraction\n")
    for cpu, k in rows:
        f.write(f"{label},{k},{n[k]},{cpu:.2f},{cpu / wall:.3f}\n")
print(f"  busiest threads ({label}, {wall:.1f} s): " +
      ", ".join(f"{k} x{n[k]} {cpu / wall:.0%}" for cpu, k in rows[:6]))
PY
}
host_ticks() { # the host's CPU ticks: busy (user nice system irq softirq steal) and idle (idle iowait)
	awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat
}
host_profile() { # host0 host1 ticks0 ticks1 wall_s: the whole host's cores in use, serve's and the producers'
	"$py" - "$@" <<'PY'
import os, sys
h0, h1, t0, t1, wall = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
hz = os.sysconf("SC_CLK_TCK")
(b0, i0), (b1, i1) = (map(int, open(p).read().split()) for p in (h0, h1))
def total(p, want):
    return sum(int(l.split()[1]) for l in open(p) if len(l.split()) == 2 and l.split()[1].isdigit()
               and (l.split()[0] == "produce") == want)
serve = (total(t1, False) - total(t0, False)) / hz
prod = total(t1, True) / hz
cores = (b1 - b0 + i1 - i0) / hz / wall
print(f"  host ({wall:.1f} s, {cores:.0f} cores): {(b1 - b0) / hz / wall:.1f} cores busy; serve {serve / wall:.1f}, "
      f"producers {prod / wall:.1f}, the rest {((b1 - b0) / hz - serve - prod) / wall:.1f}")
PY
}
learner_phases() { # port -> "phase seconds" per mfstream_learner_seconds series, and events
	"$py" - "$1" <<'PY'
import re, sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for m in re.finditer(r'^mfstream_learner_seconds\{phase="(\w+)"\} (\S+)$', t, re.M):
    print(m.group(1), m.group(2))
for m in re.finditer(r'^mfstream_snapshot_seconds\{phase="(\w+)"\} (\S+)$', t, re.M):
    print("snapshot:" + m.group(1), m.group(2))
for m in re.finditer(r'^mfstream_learner_rows_seconds\{step="(\w+)"\} (\S+)$', t, re.M):
    print("rows:" + m.group(1), m.group(2))
for name in ("mfstream_events_applied_total", "mfstream_events_held_out_total"):
    m = re.search(rf"^{name} (\S+)$", t, re.M)
    print(name, m.group(1) if m else 0)
m = re.search(r"^mfstream_learner_rows_ahead_batches_total (\S+)$", t, re.M)
print("ahead:batches", m.group(1) if m else 0)
PY
}
phase_profile() { # before after wall_s label csv: the learner's seconds per phase over the run
	"$py" - "$@" <<'PY'
import os, sys
before, after, wall, label, csv = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
load = lambda p: {k: float(v) for k, v in (l.split() for l in open(p) if l.strip())}
b, a = load(before), load(after)
ev = sum(a[k] - b.get(k, 0) for k in a if k.startswith("mfstream_events"))
rows = [(k, a[k] - b.get(k, 0)) for k in a if not k.startswith(("mfstream_events", "snapshot:", "rows:", "ahead:"))]
ahead = a.get("ahead:batches", 0) - b.get("ahead:batches", 0)
split = [(k.split(":", 1)[1], a[k] - b.get(k, 0)) for k in a if k.startswith("rows:")]
snap = [(k.split(":", 1)[1], a[k] - b.get(k, 0)) for k in a if k.startswith("snapshot:")]
new = not os.path.exists(csv)
with open(csv, "a") as f:
    if new:
        f.write("run,phase,seconds,share,ns_per_event\n")
    for k, s in rows:
        f.write(f"{label},{k},{s:.3f},{s / wall:.3f},{s * 1e9 / ev if ev else 0:.1f}\n")
busy = sum(s for k, s in rows if k != "wait")
print(f"  learner ({label}, {wall:.1f} s, {ev:.0f} events): busy {busy / wall:.0%}, "
      f"{busy * 1e9 / ev if ev else 0:.0f} ns/event: " +
      ", ".join(f"{k} {s / wall:.0%}" for k, s in sorted(rows, key=lambda r: -r[1]) if k != "wait" and s / wall >= 0.005))
if split and ev:
    with open(csv, "a") as f:
        for k, s in split:
            f.write(f"{label},rows_{k},{s:.3f},{s / wall:.3f},{s * 1e9 / ev:.1f}\n")
    rest = dict(rows).get("rows", 0) - sum(s for _, s in split)
    print("  learner rows phase, ns/event: " + ", ".join(f"{k} {s * 1e9 / ev:.1f}" for k, s in split) +
          f", learner alone {rest * 1e9 / ev:.1f}; batches looked up ahead {ahead:.0f}")
if snap:
    with open(csv, "a") as f:
        for k, s in snap:
            f.write(f"{label},snapshot_{k},{s:.3f},{s / wall:.3f},{s * 1e9 / ev if ev else 0:.1f}\n")
    print(f"  snapshot writer ({label}): busy {sum(s for _, s in snap) / wall:.0%}: " +
          ", ".join(f"{k} {s / wall:.0%}" for k, s in sorted(snap, key=lambda r: -r[1]) if s / wall >= 0.005))
PY
}
kafka_home=${KAFKA_HOME:-../shared/kafka}
new_topic() { # a topic of its own on the real broker (PARTITIONS) -> sets topic
	topic=bench-$$-$RANDOM
	"$kafka_home/kafka_2.11-2.4.0/bin/kafka-topics.sh" --bootstrap-server "$brokers" --create --topic "$topic" \
		--partitions "${PARTITIONS:-4}" --replication-factor 1 >/dev/null
}
assignment() { # log... -> a line per log: the partitions its service holds. The eager protocol
	# (librdkafka's default) revokes every partition and assigns anew at each rebalance, so
	# what a log assigned after its last "revoked" line is what the service holds
	local log
	for log in "$@"; do
		awk '/msg=revoked/ { s = "" }
			/msg=assigned/ { for (i = 1; i <= NF; i++) if ($i ~ /^partition=/) s = s " " substr($i, 11) }
			END { print s }' "$log"
	done
}
wait_settled() { # partitions "pid..." log...: until the group of a throughput run's services has
	# settled: every service holds partitions of the group's last assignment and together they
	# hold each of the P partitions once. Before that, producing would time a rebalance (the mock
	# cluster holds one for the members' session timeout less 1 s once a member joins a group
	# that has some). Fails when a service exits, or after SETTLE_S (120) s, saying what each holds
	local p=$1 pids=$2 t pid log held
	shift 2
	for ((t = 0; t < ${SETTLE_S:-120} * 10; t++)); do
		assignment "$@" | awk -v p="$p" '{ if (NF == 0) bad = 1; for (i = 1; i <= NF; i++) { c[$i]++; k++ } }
			END { for (q = 0; q < p; q++) if (c[q] != 1) bad = 1; exit bad || k != p }' && return 0
		for pid in $pids; do
			kill -0 "$pid" 2>/dev/null || { echo "a service exited before the group settled:"; tail -n 5 "$@"; exit 1; }
		done
		sleep 0.1
	done
	echo "the consumer group did not settle in ${SETTLE_S:-120} s (each of $p partitions held once, by" \
		"services that all hold some); each service holds (its log; KEEP_LOGS=DIR keeps it):"
	for log in "$@"; do
		held=$(assignment "$log")
		echo "  ${held:- none} ($log)"
	done
	exit 1
}
topic=ratings
start_serve() { # dir log extra... -> sets bs (bootstrap), topic and spid
	local dir=$1 log=$2; shift 2
	if [ -n "$brokers" ]; then
		# a fresh topic, produced after serve has joined its group (as with the embedded broker)
		new_topic
		bs=$brokers
		"${serve_pin[@]}" "$bin" serve --brokers "$bs" --topic "$topic" --snapshot "$dir" --kafka.group.id "$topic" \
			--engine "${ENGINE:-cpu}" --k 128 --metrics.listen "" \
			--serve.snapshot_ms 250 ${SERVE_ARGS:-} "$@" 2>"$log" &
		spid=$!
		for _ in $(seq 400); do
			grep -q 'msg=assigned' "$log" && return 0
			sleep 0.05
		done
		echo "serve got no partitions: $(cat "$log")"
		exit 1
	fi
	topic=ratings
	"${serve_pin[@]}" "$bin" serve --embedded-broker --partitions "${PARTITIONS:-4}" --topic ratings --snapshot "$dir" \
		--engine "${ENGINE:-cpu}" --k 128 --metrics.listen "" \
		--serve.snapshot_ms 250 ${SERVE_ARGS:-} "$@" 2>"$log" &
	spid=$!
	bs=""
	for _ in $(seq 200); do
		bs=$(grep -o 'bootstrap=[^ ]*' "$log" | head -1 | cut -d= -f2 || true)
		[ -n "$bs" ] && break
		sleep 0.05
	done
	[ -n "$bs" ] || { echo "serve did not start: $(cat "$log")"; exit 1; }
	for _ in $(seq 400); do # the consumer group has formed (~3 s on the mock cluster)
		grep -q 'msg=assigned' "$log" && return 0
		sleep 0.05
	done
	echo "serve got no partitions: $(cat "$log")"
	exit 1
}
if want throughput; then
csv=$out-throughput.csv
rm -f "$out-threads.csv"
# SERVICES: serve processes in one group, one per GPU in a deployment; each must get a partition
ns=${SERVICES:-1}
case $ns in '' | *[!0-9]* | 0) echo "SERVICES=$ns: want a whole number from 1"; exit 2 ;; esac
if [ "$ns" -gt "${PARTITIONS:-4}" ]; then
	echo "SERVICES=$ns over PARTITIONS=${PARTITIONS:-4}: a service would hold none"
	exit 2
fi
devs=()
if [ "$ns" -gt 1 ] && [ "${ENGINE:-cpu}" = cuda ]; then
	IFS=, read -ra devs <<<"${DEVICES:-$(seq -s, 0 $((ns - 1)))}"
	[ ${#devs[@]} -ge "$ns" ] || { echo "DEVICES=$DEVICES names ${#devs[@]} devices for SERVICES=$ns"; exit 2; }
fi
# services last: older readers of the CSV keep their columns
echo "events_per_message,events,seconds,events_per_s,produce_s,latency_p50_ms,latency_p99_ms,pauses,services" >"$csv"
if [ "$ns" -gt 1 ]; then
	echo "$ns serve processes, one consumer group sharing items through exchange.topic; p50/p99: the slowest" \
		"service's, pauses: all services'"
fi
printf '%-18s %10s %9s %12s %10s %12s %12s %7s\n' events/message events seconds events/s produce_s p50_ms p99_ms pauses
for epm in ${EPM:-100 1000}; do
	d=$tmp/snap-$epm
	dirs=("$d")
	logs=("$tmp/serve-$epm.log")
	xs=() # service 0's exchange options; none for one service (it starts as it always has)
	if [ "$ns" -gt 1 ]; then
		if [ -n "$brokers" ]; then
			# compacted, as the exchange wants it (docs/SCALE_OUT.md; bench/multihost.py makes it so)
			xtopic=bench-$$-$RANDOM-items
			"$kafka_home/kafka_2.11-2.4.0/bin/kafka-topics.sh" --bootstrap-server "$brokers" --create --topic "$xtopic" \
				--partitions 4 --replication-factor 1 --config cleanup.policy=compact >/dev/null
		else
			# nothing to create: the embedded broker (librdkafka's mock cluster, in service 0) makes
			# the topic when service 0's exchange first asks for it, with the mock's 4 partitions
			# (the mock has no compaction); no one outside service 0's process can reach it to
			# create it sooner. The group: the consumer's default (mfstream), named for all
			xtopic=ratings-items
			xs=(--kafka.group.id mfstream)
		fi
		xs+=(--exchange.topic "$xtopic" --exchange.host s0)
		[ ${#devs[@]} -eq 0 ] || xs+=(--engine.devices "${devs[0]}")
	fi
	start_serve "$d" "$tmp/serve-$epm.log" "${xs[@]}"
	spids=("$spid")
	if [ "$ns" -gt 1 ]; then
		# services 1..: the same topic and group on service 0's broker, a snapshot and log each
		group=${brokers:+$topic}
		for ((j = 1; j < ns; j++)); do
			dirs+=("$tmp/snap-$epm-s$j")
			logs+=("$tmp/serve-$epm-s$j.log")
			xs=(--exchange.topic "$xtopic" --exchange.host "s$j")
			[ ${#devs[@]} -eq 0 ] || xs+=(--engine.devices "${devs[j]}")
			"${serve_pin[@]}" "$bin" serve --brokers "$bs" --topic "$topic" --snapshot "${dirs[j]}" \
				--kafka.group.id "${group:-mfstream}" --engine "${ENGINE:-cpu}" --k 128 --metrics.listen "" \
				--serve.snapshot_ms 250 ${SERVE_ARGS:-} "${xs[@]}" 2>"${logs[j]}" &
			spids+=($!)
			svc_pids+=($!)
		done
		wait_settled "${PARTITIONS:-4}" "${spids[*]}" "${logs[@]}"
		mapfile -t held < <(assignment "${logs[@]}")
	fi
	for p in "${spids[@]}"; do thread_ticks "$p"; done >"$tmp/ticks0"
	t0=$(date +%s.%N)
	# PRODUCERS processes, each n/PRODUCERS events of its own seed; a producer's own CPU is its
	# shell's cutime + cstime once it has been waited for
	np=${PRODUCERS:-1}
	for ((j = 0; j < np; j++)); do
		sh -c '"$@"; s=$?; awk "{print \$16 + \$17}" /proc/$$/stat >&3; exit $s' produce \
			"${prod_pin[@]}" "$bin" produce --brokers "$bs" --topic "$topic" --synthetic --gen.ratings $((n / np)) --gen.seed $((7 + j)) \
			--batch "$epm" --compact ${PRODUCE_ARGS:-} 2>"$tmp/produce-$epm-$j.log" 3>"$tmp/produce-ticks-$j" &
		pp[j]=$!
	done
	wait "${pp[@]}"
	n=$((n / np * np))
	tp=$(date +%s.%N)
	if [ "$ns" -gt 1 ]; then wait_applied "$d" "$n" "" "${dirs[@]:1}"; else wait_applied "$d" "$n"; fi
	t1=$(date +%s.%N)
	for p in "${spids[@]}"; do thread_ticks "$p"; done >"$tmp/ticks1"
	cat "$tmp"/produce-ticks-* | sed 's/^/produce /' >>"$tmp/ticks1"
	# each service's share at t1 (a rebalance as the others stop could move partitions later)
	share=()
	for dj in "${dirs[@]}"; do share+=("$(events_applied "$dj")"); done
	# services 1.. first, then service 0, whose embedded broker the others stop through
	for ((j = ns - 1; j >= 0; j--)); do
		kill -TERM "${spids[j]}" && wait "${spids[j]}"
	done
	svc_pids=()
	p50=$(stopped "$tmp/serve-$epm.log" latency_p50_ms)
	p99=$(stopped "$tmp/serve-$epm.log" latency_p99_ms)
	pz=$(stopped "$tmp/serve-$epm.log" pauses)
	label=$epm/msg
	if [ "$ns" -gt 1 ]; then
		p50=$(for l in "${logs[@]}"; do stopped "$l" latency_p50_ms; done | sort -g | tail -1)
		p99=$(for l in "${logs[@]}"; do stopped "$l" latency_p99_ms; done | sort -g | tail -1)
		pz=$(for l in "${logs[@]}"; do stopped "$l" pauses; done | awk '{ s += $1 } END { print s + 0 }')
		label="$epm/msg over $ns serve processes"
	fi
	secs=$("$py" -c "print(f'{$t1-$t0:.2f}')")
	ps=$("$py" -c "print(f'{$tp-$t0:.2f}')")
	rate=$("$py" -c "print(f'{$n/($t1-$t0):.0f}')")
	printf '%-18s %10s %9s %12s %10s %12s %12s %7s\n' "$epm" "$n" "$secs" "$rate" "$ps" "$p50" "$p99" "$pz"
	echo "$epm,$n,$secs,$rate,$ps,$p50,$p99,$pz,$ns" >>"$csv"
	if [ "$ns" -gt 1 ]; then
		# per service: an imbalance between them shows here, and what the exchange did
		for ((j = 0; j < ns; j++)); do
			xd=$(grep -o 'msg="exchange done" .*' "${logs[j]}" | tail -1 | cut -d' ' -f3- || true)
			printf '  s%d: partitions%s; %s events (%s); p50/p99 %s/%s ms; exchange done: %s\n' "$j" "${held[j]}" \
				"${share[j]}" "$(awk -v a="${share[j]}" -v n="$n" 'BEGIN { printf "%.1f %%", 100 * a / n }')" \
				"$(stopped "${logs[j]}" latency_p50_ms)" "$(stopped "${logs[j]}" latency_p99_ms)" "${xd:-(no line)}"
		done
	fi
	thread_profile "$tmp/ticks0" "$tmp/ticks1" "$secs" "$label" "$out-threads.csv"
done
echo "wrote $csv"
fi
# latency at a steady rate (the service keeps up): 100 events per message
if want latency; then
csv=$out-latency.csv
echo "sync,rate_events_per_s,events_per_message,snapshot_ms,events,latency_p50_ms,latency_p99_ms,applied_p50_ms,applied_p99_ms" >"$csv"
printf '\n%-6s %-14s %10s %12s %10s %12s %12s %14s %14s\n' sync rate events/msg snapshot_ms events p50_ms p99_ms \
	applied_p50_ms applied_p99_ms
for sync in full none; do
for rate in 50000 200000; do
	d=$tmp/snap-lat-$sync-$rate
	start_serve "$d" "$tmp/serve-lat-$rate.log" --snapshot.sync "$sync"
	m=$((rate * 10))
	# steady state: the consumer's first fetches after the assignment (offset lookups) hold the
	# first ~0.5 s of a stream produced at once, which alone sets the p99 of a 10 s run
	sleep 2
	"${prod_pin[@]}" "$bin" produce --brokers "$bs" --topic "$topic" --synthetic --gen.ratings "$m" --batch 100 --compact \
		--rate "$rate" 2>"$tmp/produce-lat-$rate.log"
	wait_applied "$d" "$m"
	kill -TERM $spid && wait $spid
	p50=$(stopped "$tmp/serve-lat-$rate.log" latency_p50_ms)
	p99=$(stopped "$tmp/serve-lat-$rate.log" latency_p99_ms)
	a50=$(stopped "$tmp/serve-lat-$rate.log" applied_p50_ms)
	a99=$(stopped "$tmp/serve-lat-$rate.log" applied_p99_ms)
	printf '%-6s %-14s %10s %12s %10s %12s %12s %14s %14s\n' "$sync" "$rate" 100 250 "$m" "$p50" "$p99" "$a50" "$a99"
	echo "$sync,$rate,100,250,$m,$p50,$p99,$a50,$a99" >>"$csv"
done
done
echo "wrote $csv"
fi
# a time series from /metrics: TS_EVENTS at TS_RATE with a 2 % holdout and a full pass a second
if want timeseries; then
csv=$out-timeseries.csv
d=$tmp/snap-ts
start_serve "$d" "$tmp/serve-ts.log" --metrics.listen 127.0.0.1:0 --serve.holdout_fraction "${TS_HOLDOUT:-0.02}" \
	--serve.fullpass_ms "${TS_FULLPASS_MS:-1000}" --snapshot.sync none ${TS_ARGS:-}
port=$(grep -o 'msg="metrics listening".*port=[0-9]*' "$tmp/serve-ts.log" | grep -o 'port=[0-9]*' | cut -d= -f2)
"$py" scripts/scrape.py "http://127.0.0.1:$port/metrics" "$csv" --interval 0.5 &
scr=$!
# a disk guard: a snapshot directory that fills its disk can take a whole machine down with it
# (a long run of new users writes tens of GB); below DISK_MIN_MB (2048) MiB free serve and the
# producers are stopped and the run fails, saying so
(
	while kill -0 $spid 2>/dev/null; do
		free_mb=$(df -Pm "$tmp" | awk 'NR == 2 { print $4 }')
		if [ -n "$free_mb" ] && [ "$free_mb" -lt "${DISK_MIN_MB:-2048}" ]; then
			echo "disk guard: $free_mb MiB free at $tmp, under DISK_MIN_MB=${DISK_MIN_MB:-2048}: stopping serve" \
				"and the producers" >&2
			kill -9 $spid
			pkill -9 -P $$ -f "$bin produce" || true
			exit 0
		fi
		sleep 1
	done
) &
ts_n=${TS_EVENTS:-3000000}
np=${PRODUCERS:-1}
# TS_WARM events first (the producers' own users, none arriving), all applied before the
# measured run: a stream of arriving users then meets a model that knows the rest
warm=0
if [ "${TS_WARM:-0}" -gt 0 ]; then
	warm=$((TS_WARM / np * np))
	for ((j = 0; j < np; j++)); do
		"${prod_pin[@]}" "$bin" produce --brokers "$bs" --topic "$topic" --synthetic --gen.ratings $((TS_WARM / np)) --gen.seed $((7 + j)) \
			--batch "${TS_EPM:-100}" --compact --rate $((${TS_WARM_RATE:-${TS_RATE:-100000}} / np)) ${TS_PRODUCE_ARGS:-} \
			--gen.user_arrival 0 ${USER_OFFSET_STEP:+--gen.user_offset $((j * USER_OFFSET_STEP))} \
			2>"$tmp/produce-warm-$j.log" &
		pp[j]=$!
	done
	wait "${pp[@]}"
	for _ in $(seq 1200); do
		a=$(learner_applied "$port")
		[ -n "$a" ] && [ "$a" -ge "$warm" ] && break
		sleep 0.1
	done
	[ -n "$a" ] && [ "$a" -ge "$warm" ] || { echo "warm-up: the learner has ${a:-?} of $warm events after 120 s"; exit 1; }
	echo "  warm-up: $warm events applied"
fi
thread_ticks $spid >"$tmp/ticks-ts0"
learner_phases "$port" >"$tmp/phases-ts0"
host_ticks >"$tmp/host-ts0"
ts_t0=$(date +%s.%N)
for ((j = 0; j < np; j++)); do
	# a producer's own CPU: its shell's cutime + cstime once it has been waited for
	sh -c '"$@"; s=$?; awk "{print \$16 + \$17}" /proc/$$/stat >&3; exit $s' produce \
		"${prod_pin[@]}" "$bin" produce --brokers "$bs" --topic "$topic" --synthetic --gen.ratings $((ts_n / np)) --gen.seed $((7 + j)) \
		--batch "${TS_EPM:-100}" --compact --rate $((${TS_RATE:-100000} / np)) ${TS_PRODUCE_ARGS:-} \
		${USER_OFFSET_STEP:+--gen.user_offset $((j * USER_OFFSET_STEP))} \
		2>"$tmp/produce-ts-$j.log" 3>"$tmp/produce-ts-ticks-$j" &
	pp[j]=$!
done
wait "${pp[@]}"
# serve's CPU per thread while the producers ran (taken before the wait, which gives up when
# serve falls behind: the profile then names the thread that could not keep up)
thread_ticks $spid >"$tmp/ticks-ts1"
learner_phases "$port" >"$tmp/phases-ts1"
host_ticks >"$tmp/host-ts1"
ts_t1=$(date +%s.%N)
cat "$tmp"/produce-ts-ticks-* | sed 's/^/produce /' >>"$tmp/ticks-ts1"
rm -f "$out-ts-threads.csv" "$out-ts-learner.csv"
ts_wall=$("$py" -c "print(f'{$ts_t1-$ts_t0:.2f}')")
thread_profile "$tmp/ticks-ts0" "$tmp/ticks-ts1" "$ts_wall" "${TS_RATE:-100000}/s" "$out-ts-threads.csv"
phase_profile "$tmp/phases-ts0" "$tmp/phases-ts1" "$ts_wall" "${TS_RATE:-100000}/s" "$out-ts-learner.csv"
host_profile "$tmp/host-ts0" "$tmp/host-ts1" "$tmp/ticks-ts0" "$tmp/ticks-ts1" "$ts_wall"
tail -qn1 "$tmp"/produce-ts-*.log
ts_n=$((ts_n / np * np))
wait_applied "$d" "$((warm + ts_n))" "$port"
sleep 2
kill -TERM $spid && wait $spid
wait $scr
for key in latency_p50_ms latency_p99_ms applied_p50_ms applied_p99_ms; do
	printf '%s=%s ' "$key" "$(stopped "$tmp/serve-ts.log" "$key")"
done
echo "(time series: $ts_n events at ${TS_RATE:-100000}/s; latency_* is message create -> snapshot-visible)"
echo "wrote $csv ($(($(wc -l <"$csv") - 1)) samples)"
fi
# snapshot cost by rows touched
if want snapshot; then
csv=$out-snapshot.csv
rm -f "$csv"
echo
"$build/bench/bench_snapshot" --dir "$tmp/bsnap" --table 1000000 --rows 10000,100000,1000000 --k 128 --reps 5 \
	--sync full,meta,none --csv "$csv"
echo "wrote $csv"
fi
# a backlog on the real broker, consumed by kcat (the ceiling) and by serve, alternating
if want backlog; then
[ -n "$brokers" ] || { echo "SECTIONS=backlog needs --brokers (a real broker)"; exit 2; }
command -v kcat >/dev/null || { echo "backlog: no kcat (scripts/setup-deps.sh installs it)"; exit 2; }
csv=$out-backlog.csv
rm -f "$out-backlog-threads.csv"
echo "run,rep,events,events_per_message,partitions,seconds,events_per_s" >"$csv"
epm=${EPM:-1000}
epm=${epm%% *}
new_topic
np=${PRODUCERS:-1}
for ((j = 0; j < np; j++)); do
	"${prod_pin[@]}" "$bin" produce --brokers "$brokers" --topic "$topic" --synthetic --gen.ratings $((n / np)) --gen.seed $((7 + j)) \
		--batch "$epm" --compact ${PRODUCE_ARGS:-} >"$tmp/produce-backlog-$j.log" 2>&1 &
done
wait
n=$((n / np * np))
msgs=$(cat "$tmp"/produce-backlog-*.log | sed -n 's/.* messages=\([0-9]*\) .*/\1/p' | awk '{ s += $1 } END { print s }')
printf '\n%-7s %4s %10s %9s %12s  (%s events in %s messages of %s, %s partitions, topic %s)\n' run rep events \
	seconds events/s "$n" "$msgs" "$epm" "${PARTITIONS:-4}" "$topic"
for ((rep = 1; rep <= ${REPS:-3}; rep++)); do
	# kcat: every message of the topic, read and written to /dev/null
	t0=$(date +%s.%N)
	got=$(kcat -C -b "$brokers" -t "$topic" -o beginning -e -q -f '%o\n' | wc -l)
	t1=$(date +%s.%N)
	[ "$got" -eq "$msgs" ] || { echo "kcat read $got of $msgs messages"; exit 1; }
	secs=$("$py" -c "print(f'{$t1-$t0:.2f}')")
	rate=$("$py" -c "print(f'{$n/($t1-$t0):.0f}')")
	printf '%-7s %4s %10s %9s %12s\n' kcat "$rep" "$n" "$secs" "$rate"
	echo "kcat,$rep,$n,$epm,${PARTITIONS:-4},$secs,$rate" >>"$csv"
	# serve: from its first assignment to the snapshot that holds every event
	d=$tmp/snap-backlog-$rep
	"${serve_pin[@]}" "$bin" serve --brokers "$brokers" --topic "$topic" --snapshot "$d" --kafka.group.id "$topic-$rep" \
		--engine "${ENGINE:-cpu}" --k 128 --metrics.listen "" --serve.snapshot_ms 250 ${SERVE_ARGS:-} \
		2>"$tmp/serve-backlog-$rep.log" &
	spid=$!
	for _ in $(seq 400); do
		grep -q 'msg=assigned' "$tmp/serve-backlog-$rep.log" && break
		sleep 0.02
	done
	t0=$(date +%s.%N)
	thread_ticks $spid >"$tmp/ticks-b0"
	wait_applied "$d" "$n"
	t1=$(date +%s.%N)
	thread_ticks $spid >"$tmp/ticks-b1"
	kill -TERM $spid && wait $spid
	secs=$("$py" -c "print(f'{$t1-$t0:.2f}')")
	rate=$("$py" -c "print(f'{$n/($t1-$t0):.0f}')")
	printf '%-7s %4s %10s %9s %12s\n' serve "$rep" "$n" "$secs" "$rate"
	echo "serve,$rep,$n,$epm,${PARTITIONS:-4},$secs,$rate" >>"$csv"
	thread_profile "$tmp/ticks-b0" "$tmp/ticks-b1" "$secs" "backlog-$rep" "$out-backlog-threads.csv"
done
echo "wrote $csv"
fi
