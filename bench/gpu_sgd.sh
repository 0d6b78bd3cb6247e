#!/usr/bin/env bash
# The CUDA engine benchmark (run on the GPU machine in one call): k=128 fp16 and fp32, k=64 fp32 on
# 1M x 1M x 100M and Netflix-shaped 480K x 17.7K x 99M sets with uniform, Zipf 0.8 and Zipf 1.2
# item popularity. Prints a table; writes CSV.   bench/gpu_sgd.sh BUILD_DIR OUT.csv [EPOCHS]
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/gpu-sgd.csv}
epochs=${3:-5}
bin=$build/bench/bench_gpu_sgd
rm -f "$csv"
printf '%-28s %9s %6s %4s %5s %12s %8s %9s %9s %7s %9s %6s %6s\n' label engine zipf k dtype "G upd/s" "B/upd" \
	"GB/s" "copy GB/s" "of copy" test_rmse gen_s load_s
for cfg in "128 fp16" "128 fp32" "64 fp32"; do
	set -- $cfg
	for z in 0 0.8 1.2; do
		"$bin" --users 1000000 --items 1000000 --ratings 100000000 --zipf $z --k $1 --dtype $2 \
			--epochs "$epochs" --label "1Mx1Mx100M" --csv "$csv" --copy-gb 4
		"$bin" --users 480000 --items 17700 --ratings 99000000 --zipf $z --k $1 --dtype $2 \
			--epochs "$epochs" --label "netflix 480Kx17.7Kx99M" --csv "$csv" --copy-gb 4
	done
done
echo "wrote $csv"
