#!/usr/bin/env bash
# cpu_sgd.sh - the CPU engine benchmark on the LIBMF comparison shape, in the configurations
# worth reporting: 2 threads (the headline), 1 thread, deterministic mode, and the flat
# shuffled-batch baseline. Each configuration runs REPS times; the summary lines are kept
# and every run's table goes to a CSV under OUT.
#
#   bench/cpu_sgd.sh [BUILD_DIR] [-- extra bench_cpu_sgd flags]
#   REPS=3 EPOCHS=20 OUT=out/bench-cpu bench/cpu_sgd.sh build-eng
#   QUICK=1 bench/cpu_sgd.sh            # 3 epochs, no per-epoch train loss: speed only
#
# Goal (LIBMF AVX, 2 threads of this VM, k=128, 20 iterations, same shape): 13.3 M updates/s,
# test RMSE 0.586. The machine is shared: compare medians, and updates per CPU-second
# (upd/cpu_s) when other jobs are running.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
[ "${1:-}" = "--" ] && shift
BIN=$BUILD/bench/bench_cpu_sgd
[ -x "$BIN" ] || { echo "cpu_sgd.sh: $BIN not built (ninja -C $BUILD bench_cpu_sgd)" >&2; exit 2; }
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-20}
OUT=${OUT:-out/bench-cpu}
EXTRA=()
if [ -n "${QUICK:-}" ]; then
	EPOCHS=3
	EXTRA+=(--train-loss 0)
fi
mkdir -p "$OUT"
run() { # name, flags...
	local name=$1
	shift
	for rep in $(seq "$REPS"); do
		"$BIN" --epochs "$EPOCHS" "${EXTRA[@]}" "$@" --csv "$OUT/$name-$rep.csv" \
			| tee "$OUT/$name-$rep.txt" | grep '^summary' | sed "s/^summary:/$name rep=$rep:/"
	done
}
run hogwild-2t --threads 2 "$@"
run hogwild-1t --threads 1 "$@"
run deterministic --deterministic "$@"
if [ -z "${QUICK:-}" ] || [ -n "${BASELINE:-}" ]; then
	run shuffled-batch-2t --threads 2 --mode batch --train-loss 0 "$@"
fi
echo "tables and CSV: $OUT/"
