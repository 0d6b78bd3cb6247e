#!/usr/bin/env bash
# The sharded engine on a host's GPUs (issue 21; docs/SCALE_OUT.md), in one device call:
# build, the GPU test of the sharded engine, then bench_gpu_sgd on the 1M x 1M x 100M sets
# (uniform, Zipf 0.8, Zipf 1.2; fp16, k = 128) with one GPU and the sharded variants side by
# side in one process each (same ratings, same initial model). Prints the table; CSV in OUT.
#
#   bench/multigpu.sh OUT [EPOCHS] [VARIANTS]
#
# VARIANTS: bench_gpu_sgd --variants (default "default,x2": one GPU, then 2 shards on devices 0
# and 1 with the engine's defaults; x2-p16-h4 = 16 pieces an epoch, hot rows at 4 ratings).
# SETS: the Zipf exponents (default "0 0.8 1.2"). SKIP_TEST=1 skips the GPU test.
set -uo pipefail
out=${1:-/tmp/multigpu}
epochs=${2:-20}
variants=${3:-default,x2}
sets=${SETS:-0 0.8 1.2}
build=${BUILD:-build-dev}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
if [ ! -x "$build/bench/bench_gpu_sgd" ]; then
	t0=$SECONDS
	cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/cmake.log" 2>&1 &&
		cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
	echo "build: $((SECONDS - t0)) s"
fi
if [ -z "${SKIP_TEST:-}" ]; then
	t0=$SECONDS
	timeout 300 "$build/tests/test_cuda_sharded" >"$out/test_cuda_sharded.log" 2>&1
	echo "test_cuda_sharded rc=$? ($((SECONDS - t0)) s)"
	grep -E "^  |FAIL|passed" "$out/test_cuda_sharded.log" | head -30
fi
for z in $sets; do
	timeout 400 "$build/bench/bench_gpu_sgd" --users 1000000 --items 1000000 --ratings 100000000 --zipf "$z" --k 128 \
		--dtype fp16 --epochs "$epochs" --label "1Mx1Mx100M" --variants "$variants" --copy-gb 2 \
		--csv "$out/multigpu.csv" 2>"$out/bench-z$z.err" | tee -a "$out/bench.txt"
	echo "bench zipf $z rc=${PIPESTATUS[0]}"
	grep -E "sharded engine|error|failed" "$out/bench-z$z.err" | head -5
done
