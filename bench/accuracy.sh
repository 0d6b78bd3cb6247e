#!/usr/bin/env bash
# Accuracy table: mfstream's test RMSE with default hyperparameters (k=128, 20 epochs, 90/10
# split, deterministic CPU engine) beside a reference: LIBMF's RMSE on this VM for the
# MovieLens files (lambda 0.05, lr 0.08, 20 iterations), the planted noise sigma for synthetic
# data. Prints a table and writes CSV.   usage: bench/accuracy.sh [build-dir] [out.csv]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
csv=${2:-bench/accuracy.csv}
bin=$build/mfstream
[ -x "$bin" ] || { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null; cmake --build "$build"; }
data=../shared/data/movielens
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "dataset,ratings,users,items,mfstream_test_rmse,reference,reference_rmse,ratio,train_seconds" >"$csv"
printf '%-34s %9s %7s %7s %10s %-10s %9s %7s %7s\n' dataset ratings users items mfstream reference ref_rmse ratio train_s
row() { # name file reference ref_rmse extra-args...
	local name=$1 file=$2 ref=$3 refr=$4
	shift 4
	out=$("$bin" train --input "$file" --engine cpu --deterministic --train.patience 0 --log-level warn "$@" 2>/dev/null)
	local n u i r s
	n=$(echo "$out" | sed -n 's/^mfstream train: \([0-9]*\) train \/ \([0-9]*\) validation \/ \([0-9]*\) test.*/\1 \2 \3/p' |
		awk '{print $1+$2+$3}')
	u=$(echo "$out" | sed -n 's/.* ratings, \([0-9]*\) users x \([0-9]*\) items.*/\1/p')
	i=$(echo "$out" | sed -n 's/.* users x \([0-9]*\) items.*/\1/p')
	r=$(echo "$out" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
	s=$(echo "$out" | sed -n 's/^done: [0-9]* epochs, \([0-9.]*\) s training.*/\1/p')
	ratio=$(awk -v a="$r" -v b="$refr" 'BEGIN { printf "%.4f", a / b }')
	printf '%-34s %9s %7s %7s %10s %-10s %9s %7s %7s\n' "$name" "$n" "$u" "$i" "$r" "$ref" "$refr" "$ratio" "$s"
	echo "$name,$n,$u,$i,$r,$ref,$refr,$ratio,$s" >>"$csv"
}
if [ -d "$data" ]; then
	row ml-100k "$data/ml-100k_u.data.zst" LIBMF 0.909
	row ml-latest-small "$data/ml-latest-small_ratings.csv.zst" LIBMF 0.854
	row "ml-1m prefix (487,650 ratings)" "$data/ml-1m-prefix487650_ratings.dat.zst" LIBMF 0.853
fi
for spec in "10000000 20000 5000" "2000000 20000 5000"; do
	set -- $spec
	f=$tmp/syn-$1.bin
	"$bin" gen --gen.ratings "$1" --gen.users "$2" --gen.items "$3" --gen.rank 8 --gen.noise 0.5 --gen.seed 1 \
		--output "$f" 2>/dev/null
	row "synthetic $(($1 / 1000000))M, $2x$3, rank 8" "$f" "sigma" 0.5 --rating.min 1 --rating.max 5
done
echo "wrote $csv"
