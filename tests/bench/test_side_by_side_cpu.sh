#!/usr/bin/env bash
# bench/side_by_side.sh without a GPU or cuMF_SGD (ENGINE=cpu, CUMF unset) on its tiny set t:
# gen through the FIFO, the split, mfstream's traced run, the report and its CSV; a second call
# (with an empty OUT_DIR, as every device call gets) redoes nothing. Then the report's choice of target and times, from cuMF run summaries written
# here in the form the cumf step leaves them (no cuMF binary is involved).
set -euo pipefail
src=${MFS_SRC_DIR:?}
build=${MFS_BUILD_DIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export ENGINE=cpu DATA=$tmp/data EPOCHS=5 K=16 CUMF='' CUMF_BIN='' BUDGET=300
bash "$src/bench/side_by_side.sh" "$build" "$tmp/out" t >"$tmp/log1" 2>&1 || { cat "$tmp/log1"; fail "first call"; }
cat "$tmp/log1"
grep -q "CUMF is unset: only mfstream runs" "$tmp/log1" || fail "no word that cuMF is skipped"
grep -q "records=200000 train=198000 test=2000 " "$tmp/out/t/split.out" || fail "split: $(cat "$tmp/out/t/split.out")"
[ "$(grep -c '^t,mfstream,[1-5],' "$tmp/out/side_by_side_epochs.csv")" -eq 5 ] || fail "epoch rows"
row=$(grep '^t,mfstream,cpu,fp32,16,5,198000,2000,' "$tmp/out/side_by_side.csv") || fail "summary row: $(cat "$tmp/out/side_by_side.csv")"
final=$(echo "$row" | cut -d, -f10)
[ "$final" = "$(grep -E '^ +5 ' "$tmp/out/t/mfs.out" | awk '{ print $8 }')" ] || fail "final RMSE $final is not epoch 5's"
# no cuMF: the target is mfstream's own last RMSE, reached at the first epoch at or below it
[ "$(echo "$row" | cut -d, -f11)" = "$final" ] || fail "target: $row"
first=$(awk -F, -v t="$final" '$2 == "mfstream" && $7 + 0 <= t + 0 { print $3; exit }' "$tmp/out/side_by_side_epochs.csv")
[ "$(echo "$row" | cut -d, -f13)" = "$first" ] || fail "reached at $(echo "$row" | cut -d, -f13), want epoch $first"
# a second call, given an empty OUT_DIR as each device call is: the results kept beside the data
bash "$src/bench/side_by_side.sh" "$build" "$tmp/out2" t >"$tmp/log2" 2>&1 || fail "second call"
grep -q "gen t: present" "$tmp/log2" && grep -q "mfs t: already run" "$tmp/log2" || fail "second call redid work: $(cat "$tmp/log2")"
[ "$(grep '^t,mfstream,' "$tmp/out2/side_by_side.csv")" = "$row" ] || fail "second call's OUT_DIR lacks the first's results"

# cuMF better at its -t 5 (0.0001 below mfstream's best epoch) and at -t 3 already (its runs
# are independent): the target is cuMF's, its time the -t 3 run's kernel time, mfstream not reached
best=$(awk -F, '$2 == "mfstream" && (b == "" || $7 + 0 < b + 0) { b = $7 } END { print b }' "$tmp/out/side_by_side_epochs.csv")
better=$(awk -v f="$best" 'BEGIN { printf "%.4f", f - 0.0001 }')
for t in 1 3 5; do
	case $t in 1) r=9.9 ;; 3) r=$(awk -v f="$best" 'BEGIN { printf "%.4f", f - 0.0002 }') ;; 5) r=$better ;; esac
	echo "iters=$t nnz=198000 rate=$((t * 1000000)) kernel_s=0.$t run_s=1 m=2000 n=1000 k=16 b=3.4 test=2000 outside=0 nan=0 rmse=$r rmse_clipped=$r" \
		>"$DATA/results/t/cumf-t$t.txt"
done
STEPS=report CUMF_ITERS="1 3 5" bash "$src/bench/side_by_side.sh" "$build" "$tmp/out" t >"$tmp/log3" 2>&1 || fail "report"
cat "$tmp/log3"
c=$(grep '^t,cumf_sgd,' "$tmp/out/side_by_side.csv") || fail "no cuMF row"
[ "$c" = "t,cumf_sgd,cuda,fp16,16,5,198000,2000,5000000,$better,$better,0.3000,3" ] || fail "cuMF row: $c"
m=$(grep '^t,mfstream,' "$tmp/out/side_by_side.csv")
[ "$(echo "$m" | cut -d, -f11-13)" = "$better,," ] || fail "mfstream row: $m"
grep -q "only cuMF_SGD reaches it" "$tmp/log3" || fail "the table does not say who reaches the target"
echo "1 passed, 0 failed"
