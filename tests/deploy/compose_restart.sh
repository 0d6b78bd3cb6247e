#!/usr/bin/env bash
# compose_restart.sh - TEST ONLY, by hand (needs podman and podman-compose; not a ctest): run
# deploy/compose.yaml with podman-compose on the Kafka 2.4 stand-in, then restart the writer
# ROUNDS times and check after each that the reader container kept running (same start time,
# no restart) in one PID namespace with mfstream, and read a snapshot of the new writer run.
#
#   tests/deploy/compose_restart.sh [pod|container] [ROUNDS]    # from the repository root
#
#   pod        (default) what deploy/README.md tells podman-compose users: the stack in a pod
#              that shares only the PID namespace; the pod's infra container is PID 1 there
#   container  what Docker Compose makes of `pid: "service:pidns"`: mfstream and reader are
#              recreated with `--pid container:<pidns>` (podman-compose 1.0.3 drops `pid:`;
#              their run lines come from its --dry-run, so no argument may hold a space)
#
# Restarts alternate between `restart` and `stop` + `start`. "A snapshot of the new run" is one
# with more events applied than the stopped run's final snapshot (its msg=stopped line). Needs
# the images mfstream:cpu and mfstream:reader (deploy/README.md, "Images", --format docker) and
# localhost/mfs-test-kafka:2.4.0 (tests/deploy/kafka24.Containerfile). Leaves nothing running
# (down, then the pod and the volumes are removed), also on failure.
set -euo pipefail
mode=${1:-pod} rounds=${2:-2}
proj=mfstream pod=mfstream-pid
files=(-f deploy/compose.yaml -f tests/deploy/compose.kafka24.yaml)
case $mode in
pod) pc=(podman-compose -p "$proj" --podman-run-args "--pod $pod" "${files[@]}") ;;
container) pc=(podman-compose -p "$proj" "${files[@]}") ;;
*) sed -n '2,19p' "$0"; exit 2 ;;
esac
say() { printf '%s compose_restart(%s): %s\n' "$(date -u +%H:%M:%S)" "$mode" "$*"; }
fail() {
	say "FAIL: $*"
	podman ps -a --format '{{.Names}} {{.Status}}' || true
	for s in kafka kafka-init producer mfstream reader; do
		echo "--- $s"; podman logs --tail 5 "${proj}_${s}_1" 2>&1 | cut -c1-300 || true
	done
	exit 1
}
cleanup() {
	"${pc[@]}" down >/dev/null 2>&1 || true
	podman pod rm -f "$pod" >/dev/null 2>&1 || true
	podman volume rm -f "${proj}_snapshots" "${proj}_kafka-data" >/dev/null 2>&1 || true
}
trap cleanup EXIT
ctr() { echo "${proj}_$1_1"; }
state() { podman inspect -f "{{.State.$2}}" "$(ctr "$1")"; }
restarts() { podman inspect -f '{{.RestartCount}}' "$(ctr "$1")"; }
pidns() { readlink "/proc/$(state "$1" Pid)/ns/pid"; }
# the reader's newest line: "seq events_applied", empty before its first snapshot
reader_last() {
	podman logs "$(ctr reader)" 2>/dev/null | grep 'mod=reader seq=' | tail -n 1 |
		sed -E 's/.* seq=([0-9]+) events_applied=([0-9]+).*/\1 \2/'
}
reader_events_past() { local l; l=$(reader_last); [ -n "$l" ] && [ "${l#* }" -gt "$1" ]; }
wait_until() { # seconds description command...
	local t=$1 what=$2 i; shift 2
	for ((i = 0; i < t; i++)); do "$@" && return 0; sleep 1; done
	fail "$what: not within ${t}s"
}
lmdb_readers() { podman exec "$(ctr reader)" mdb_stat -r /var/lib/mfstream/snap | tail -n +3 | tr -s ' \n' ' '; }

cleanup
if [ "$mode" = pod ]; then
	podman pod create --name "$pod" --share pid >/dev/null
	say "pod $pod (shares pid only), infra $(podman pod inspect -f '{{.InfraContainerID}}' "$pod" | cut -c1-12)"
fi
"${pc[@]}" up -d >/dev/null 2>&1
wait_until 300 "kafka-init created the topics" \
	sh -c "[ \"\$(podman inspect -f '{{.State.Status}} {{.State.ExitCode}}' $(ctr kafka-init))\" = 'exited 0' ]"
# podman-compose 1.0.3 starts the producer without waiting for kafka-init; it gives up after
# 10 s without the topic's metadata (more while the broker's name does not resolve yet), before
# it produced anything: start it again. Still running a minute after the topics: it produces.
for ((i = 0; i < 60; i++)); do
	if [ "$(state producer Status)" = exited ]; then
		[ "$(state producer ExitCode)" = 0 ] && break
		say "producer exited $(state producer ExitCode) before the topic existed; starting it again"
		podman start "$(ctr producer)" >/dev/null
		break
	fi
	sleep 1
done
if [ "$mode" = container ]; then
	runs=$("${pc[@]}" --dry-run up -d 2>/dev/null | grep -E "^podman run --name=$(ctr '(mfstream|reader)') ")
	for s in mfstream reader; do
		line=$(grep "^podman run --name=$(ctr "$s") " <<<"$runs")
		podman rm -f "$(ctr "$s")" >/dev/null
		# shellcheck disable=SC2086 # the dry-run line, split as podman-compose joined it
		set -- ${line#podman run }
		podman run --pid "container:$(ctr pidns)" "$@" >/dev/null 2>&1
	done
	say "mfstream and reader recreated with --pid container:$(ctr pidns)"
fi
wait_until 300 "the reader printed a snapshot" reader_events_past 0
for s in pidns mfstream reader; do
	[ "$(state "$s" Status)" = running ] || fail "$s is $(state "$s" Status)"
done
if [ "$(pidns mfstream)" != "$(pidns reader)" ] || [ "$(pidns mfstream)" != "$(pidns pidns)" ]; then
	fail "PID namespaces differ: mfstream $(pidns mfstream) reader $(pidns reader) pidns $(pidns pidns)"
fi
say "one PID namespace $(pidns reader), PID 1: $(podman exec "$(ctr reader)" cat /proc/1/cmdline | tr '\0' ' ')"
say "LMDB reader table (pid thread txnid): $(lmdb_readers)"
r_started=$(state reader StartedAt) r_restarts=$(restarts reader)
say "reader started $r_started, restarts=$r_restarts, host pid $(state reader Pid); read seq/events $(reader_last)"

for ((round = 1; round <= rounds; round++)); do
	before=$(reader_last) w_before=$(state mfstream StartedAt)
	if ((round % 2)); then
		how=restart
		"${pc[@]}" restart mfstream >/dev/null 2>&1
	else
		how="stop + start"
		"${pc[@]}" stop mfstream >/dev/null 2>&1
		say "round $round: mfstream stopped, exit $(state mfstream ExitCode); reader $(state reader Status)"
		"${pc[@]}" start mfstream >/dev/null 2>&1
	fi
	[ "$(state mfstream StartedAt)" != "$w_before" ] || fail "mfstream did not restart"
	final=$(podman logs "$(ctr mfstream)" 2>&1 | grep 'msg=stopped' | tail -n 1 | sed -E 's/.*events_applied=([0-9]+).*/\1/')
	[ -n "$final" ] || fail "the stopped run logged no msg=stopped"
	wait_until 180 "the reader read a snapshot of the new run (events_applied > $final)" reader_events_past "$final"
	[ "$(state reader Status)" = running ] || fail "reader is $(state reader Status)"
	[ "$(state reader StartedAt)" = "$r_started" ] || fail "reader start time changed: $(state reader StartedAt)"
	[ "$(restarts reader)" = "$r_restarts" ] || fail "reader restarted: $(restarts reader)"
	[ "$(pidns mfstream)" = "$(pidns reader)" ] || fail "mfstream is in another PID namespace after the restart"
	say "round $round ($how): read seq/events $before before; the stopped run's final snapshot had" \
		"$final events; now reads $(reader_last); reader still started $(state reader StartedAt)," \
		"restarts=$(restarts reader); LMDB readers: $(lmdb_readers)"
done
# the image HEALTHCHECK, run by hand (podman schedules it with systemd timers, absent on some hosts)
podman healthcheck run "$(ctr mfstream)" >/dev/null || fail "mfstream's healthcheck fails"
say "mfstream healthcheck: healthy; metrics from the host: $(curl -s 127.0.0.1:9464/metrics | grep -c '^mfstream_') mfstream_* samples"
say "mfstream's runs (started / stopping / stopped):"
podman logs "$(ctr mfstream)" 2>&1 | grep -E 'msg=(started|stopping|stopped)' | cut -c1-200
say "reader log:"
podman logs "$(ctr reader)" 2>&1 | cut -c1-200 | tail -n 8
say "OK: $rounds writer restarts; the reader kept running and read the new runs' snapshots"
