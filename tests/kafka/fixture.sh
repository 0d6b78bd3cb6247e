#!/usr/bin/env bash
# fixture.sh start|stop DIR - the real Kafka broker of the tests labelled kafka (a ctest fixture:
# FIXTURES_SETUP runs start, FIXTURES_CLEANUP runs stop, so one JVM serves the whole run).
#
# The broker is Apache Kafka 2.4.0 from ../shared/kafka beside the checkout (MFS_KAFKA_HOME
# overrides), used in place. DIR/state says what the tests get: "up HOST:PORT", or "absent:
# <reason>" when there is no ../shared/kafka or no Java runtime: then the kafka tests skip (exit
# 77) with that reason, and start passes. A broker that is there but does not start fails start,
# and ctest then does not run the tests that need it.
set -uo pipefail
cmd=${1:-} dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: fixture.sh start|stop DIR" >&2; exit 2; }
src=${MFS_SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
home=${MFS_KAFKA_HOME:-$src/../shared/kafka}
case $cmd in
start)
	[ -d "$dir/broker" ] && "$home/broker.sh" wipe "$dir/broker" >/dev/null 2>&1
	rm -rf "$dir"
	mkdir -p "$dir"
	if [ ! -x "$home/broker.sh" ]; then
		echo "absent: no Kafka broker at $home (../shared/kafka beside the checkout)" | tee "$dir/state"
		exit 0
	fi
	if ! command -v java >/dev/null; then
		echo "absent: no Java runtime (apt-get install openjdk-17-jre-headless; scripts/setup-deps.sh does)" |
			tee "$dir/state"
		exit 0
	fi
	t0=$SECONDS
	if ! bs=$("$home/broker.sh" start "$dir/broker"); then
		echo "the Kafka broker did not start; its logs:" >&2
		tail -n 30 "$dir/broker/logs/server.log" "$dir/broker/logs/kafka.out" "$dir/broker/logs/zk.out" >&2 2>/dev/null
		"$home/broker.sh" wipe "$dir/broker" >/dev/null 2>&1
		exit 1
	fi
	echo "up $bs" | tee "$dir/state"
	echo "Kafka 2.4.0 broker at $bs, started in $((SECONDS - t0)) s"
	;;
stop)
	if [ -d "$dir/broker" ]; then
		"$home/broker.sh" wipe "$dir/broker"
	fi
	rm -rf "$dir"
	;;
*)
	echo "usage: fixture.sh start|stop DIR" >&2
	exit 2
	;;
esac
