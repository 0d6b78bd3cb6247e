#!/usr/bin/env bash
# The persistent kernel fed from its device ring against one launch over the whole set, on the
# same data and row modes (GPU machine, one call): k=128 fp16 on 1M x 1M x 100M with uniform,
# Zipf 0.8 and Zipf 1.2 item popularity; ring pieces of 262144 and 65536 ratings with room
# left for a loss kernel beside (ring, the grid serve uses with serve.prequential), and 262144
# with the whole GPU (ringfull). Median epoch updates/s of EPOCHS epochs. Prints a table;
# writes CSV.
#
#   bench/gpu_ring.sh BUILD_DIR OUT.csv [EPOCHS]
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/gpu-ring.csv}
epochs=${3:-5}
rm -f "$csv"
for z in 0 0.8 1.2; do
	"$build/bench/bench_gpu_sgd" --users 1000000 --items 1000000 --ratings 100000000 --zipf "$z" --k 128 \
		--dtype fp16 --epochs "$epochs" --max-epochs "$epochs" --label 1Mx1Mx100M --csv "$csv" --copy-gb 4 \
		--variants "launch,ring,ringfull,ring/65536"
done
echo "wrote $csv"
