#!/usr/bin/env bash
# The CUDA engine benchmark (run on the GPU machine in one call): k=128 fp16 and fp32 on
# 1M x 1M x 100M and Netflix-shaped 480K x 17.7K x 99M sets, k=64 fp32 on 1M x 1M, each with
# uniform, Zipf 0.8 and Zipf 1.2 item popularity. Prints a table; writes CSV.
#
#   bench/gpu_sgd.sh BUILD_DIR OUT.csv [EPOCHS] [MAX_EPOCHS]
#
# k=128 rows also report the time to reach the test RMSE the CPU reference reaches after 20
# epochs on the same ratings (the generator is machine-independent): the targets are read from
# $CPU_REF (default bench/results/gpu-cpu-reference-vm.csv, measured with
#   bench_gpu_sgd --engine cpu --threads 2 --epochs 20 --label L [shape flags] --zipf Z --csv F
# on the development VM). VARIANTS (e.g. "plain1@1,plain01@0.1") runs extra engine settings
# side by side on the fp16 k=128 1M x 1M rows (bench_gpu_sgd --variants).
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/gpu-sgd.csv}
epochs=${3:-20}
max_epochs=${4:-40}
ref=${CPU_REF:-bench/results/gpu-cpu-reference-vm.csv}
variants=${VARIANTS:-}
bin=$build/bench/bench_gpu_sgd
rm -f "$csv"
# target LABEL ZIPF: the CPU reference's test RMSE after 20 epochs, or nan
target() {
	[ -f "$ref" ] || { echo nan; return; }
	awk -F, -v l="$1" -v z="$2" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
		$col["label"] == l && $col["zipf"] + 0 == z + 0 && $col["epochs"] == 20 { t = $col["test_rmse"] }
		END { print t == "" ? "nan" : t }' "$ref"
}
printf '%-24s %4s %-9s %5s %4s %5s %8s %6s %7s %7s %6s %8s %7s %12s %5s %5s\n' label eng variant zipf k dtype \
	"G upd/s" "B/upd" "GB/s" "copy" "ofcopy" "rmse@E" target "ep/s_to_tgt" gen_s load_s
run() { # LABEL SHAPE-FLAGS ZIPF K DTYPE [VARIANTS]
	local label=$1 shape=$2 z=$3 k=$4 dt=$5 var=${6:-} t=nan
	[ "$k" = 128 ] && t=$(target "$label" "$z")
	# shellcheck disable=SC2086
	"$bin" $shape --zipf "$z" --k "$k" --dtype "$dt" --epochs "$epochs" --max-epochs "$max_epochs" \
		--target-rmse "$t" --label "$label" --csv "$csv" --copy-gb 4 ${var:+--variants "$var"}
}
M1="--users 1000000 --items 1000000 --ratings 100000000"
NF="--users 480000 --items 17700 --ratings 99000000"
for z in 0 0.8 1.2; do run 1Mx1Mx100M "$M1" $z 128 fp16 "$variants"; done
for z in 0 0.8 1.2; do run netflix "$NF" $z 128 fp16; done
for z in 0 0.8 1.2; do run 1Mx1Mx100M "$M1" $z 128 fp32; done
for z in 0 0.8 1.2; do run netflix "$NF" $z 128 fp32; done
for z in 0 0.8 1.2; do run 1Mx1Mx100M "$M1" $z 64 fp32; done
echo "wrote $csv"
