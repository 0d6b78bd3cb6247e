#!/usr/bin/env bash
# reader.sh - libmfsnap serving reads: lookup and predict latency, top-K (int8 fast path,
# exact, no-cache), recall of the fast path against the exact one, and the item-cache
# refresh, on snapshots of 100 K and 1 M items at k = 128 (100 K users) written with the
# snapshot writer. The measuring runs are pinned to one core; every figure is over many
# calls (p50 / p99 / mean). Prints the tables and writes a CSV.
#
#   bench/reader.sh [BUILD_DIR]                  (default build/reader)
#   QUERIES=400 EXACT_QUERIES=40 bench/reader.sh build-prod
#   GAUSS=1 bench/reader.sh                      also i.i.d. Gaussian factors at 1 M items
#                                                (no structure: the hard case for pruning)
#   DATA=/tmp/mfs-reader CSV=out/reader.csv CPU=1 bench/reader.sh
#   SEEN=0 bench/reader.sh                       no rated lists (default 100 per user, the
#                                                snapshot.seen_items default: top100 leaves
#                                                them out, top100inc does not read them)
#
# Needs ~1.5 GB free in DATA and ~2 GB of memory (the 1 M snapshot, the writer's model, the
# reader's item cache). The machine is shared: look at the load average printed first.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/reader}
BIN=$BUILD/bench/bench_reader
[ -x "$BIN" ] || { echo "reader.sh: $BIN not built (cmake --build $BUILD --target bench_reader)" >&2; exit 2; }
DATA=${DATA:-/tmp/mfs-bench-reader}
CSV=${CSV:-bench/results/reader-vm.csv}
CPU=${CPU:-0}
QUERIES=${QUERIES:-400}
EXACT_QUERIES=${EXACT_QUERIES:-40}
SEEN=${SEEN:-100}
mkdir -p "$DATA" "$(dirname "$CSV")"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
	"$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pinned to CPU $CPU; $QUERIES top-K queries per figure ($EXACT_QUERIES exact); $SEEN rated items per user"
echo "label,n_items,k,metric,unit,p50,p99,mean,count" >"$CSV"

SETS=("planted-100k 100000 planted" "planted-1m 1000000 planted")
[ -n "${GAUSS:-}" ] && SETS+=("gauss-1m 1000000 gauss")
for set in "${SETS[@]}"; do
	read -r label items data <<<"$set"
	dir=$DATA/$label
	# always a fresh snapshot: a run publishes incremental snapshots into it (refresh)
	rm -rf "$dir"
	"$BIN" build --dir "$dir" --items "$items" --users 100000 --k 128 --data "$data" --seen "$SEEN"
	taskset -c "$CPU" "$BIN" run --dir "$dir" --label "$label" --queries "$QUERIES" \
		--exact-queries "$EXACT_QUERIES" --csv "$CSV"
	rm -rf "$dir"
done
echo "CSV: $CSV"
