#!/usr/bin/env bash
# MovieLens on the CUDA engine against the CPU engine (GPU machine, one call): `mfstream train`
# with the defaults (k=128, 20 epochs, the 90/10 split of train.split_seed), the deterministic
# CPU engine as the reference, then the CUDA engine in fp32 and fp16. Prints a table, writes CSV.
#
#   bench/gpu_movielens.sh BUILD_DIR OUT.csv [DATA_DIR]
#
# DATA_DIR holds ml-100k_u.data, ml-latest-small_ratings.csv and
# ml-1m-prefix487650_ratings.dat, plain or .zst (default ../shared/data/movielens; the GPU
# machine has no zstd: decompress into .data/movielens here and carry that).
set -euo pipefail
build=${1:-build}
csv=${2:-bench/results/gpu-movielens.csv}
data=${3:-../shared/data/movielens}
bin=$build/mfstream
echo "dataset,engine,dtype,test_rmse,cpu_test_rmse,ratio,train_seconds" >"$csv"
printf '%-18s %-6s %-5s %10s %10s %8s %8s\n' dataset engine dtype test_rmse cpu_rmse ratio train_s
train() { # file extra... -> "rmse seconds"
	local out
	out=$("$bin" train --input "$1" --train.patience 0 --log.level warn "${@:2}" 2>/dev/null)
	echo "$(echo "$out" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p' | tail -1)" \
		"$(echo "$out" | sed -n 's/^done: [0-9]* epochs, \([0-9.]*\) s training.*/\1/p')"
}
for f in ml-100k_u.data ml-latest-small_ratings.csv ml-1m-prefix487650_ratings.dat; do
	p=$data/$f
	[ -f "$p" ] || p=$p.zst
	[ -f "$p" ] || { echo "missing $data/$f" >&2; exit 1; }
	read -r cpu cs <<<"$(train "$p" --engine cpu --deterministic)"
	printf '%-18s %-6s %-5s %10s %10s %8s %8s\n' "${f%%_*}" cpu fp32 "$cpu" "$cpu" 1.0000 "$cs"
	echo "${f%%_*},cpu,fp32,$cpu,$cpu,1.0000,$cs" >>"$csv"
	for dt in fp32 fp16; do
		read -r g gs <<<"$(train "$p" --engine cuda --model.dtype "$dt")"
		[ -n "$g" ] || { echo "mfstream train --engine cuda failed on $p" >&2; exit 1; }
		ratio=$(awk -v a="$g" -v b="$cpu" 'BEGIN { printf "%.4f", a / b }')
		printf '%-18s %-6s %-5s %10s %10s %8s %8s\n' "${f%%_*}" cuda "$dt" "$g" "$cpu" "$ratio" "$gs"
		echo "${f%%_*},cuda,$dt,$g,$cpu,$ratio,$gs" >>"$csv"
	done
done
echo "wrote $csv"
