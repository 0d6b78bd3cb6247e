#!/usr/bin/env bash
# restart.sh BROKER_SH DIR [SECONDS] - bring a killed test broker (broker.sh in DIR) back and
# wait until every partition has a leader again.
#
# A Kafka 2.4 broker restarted before ZooKeeper has expired its dead predecessor's session
# (zookeeper.session.timeout.ms, 6 s by default) finds its registration still there
# (NodeExists) and exits; broker.sh would then wait minutes for a port that never opens. So this
# watches the process it started and tries again once it has died, until SECONDS (120) pass:
# a wait on what happens, not on a guess of the session timeout.
set -uo pipefail
sh=$1 dir=$2 limit=${3:-120}
end=$((SECONDS + limit))
while ((SECONDS < end)); do
	"$sh" restart "$dir" >"$dir/restart.out" 2>&1 &
	rp=$!
	died=0
	sleep 0.5
	while kill -0 "$rp" 2>/dev/null; do
		p=$(cat "$dir/kafka.pid" 2>/dev/null || true)
		if [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null; then # the broker it started has exited
			died=1
			kill "$rp" 2>/dev/null
			break
		fi
		sleep 0.5
	done
	wait "$rp" 2>/dev/null
	rc=$?
	if [ "$died" = 0 ] && [ "$rc" = 0 ]; then
		left=$((end - SECONDS))
		exec "$sh" ready "$dir" $((left > 10 ? left : 10))
	fi
	sleep 1
done
echo "restart.sh: the broker in $dir did not come back within ${limit} s" >&2
tail -n 5 "$dir/logs/server.log" >&2 2>/dev/null
exit 1
