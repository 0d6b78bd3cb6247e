#!/usr/bin/env bash
# End to end through the binary: gen -> train -> inspect / query / predict, plus the error
# exits a user will meet (missing input, bad key, unavailable engine). Training hygiene: a test
# file is read only after the last epoch (before the first only with train.trace_test, which prints
# its RMSE per epoch and steers nothing);
# with a validation set, early stopping and the model
# kept follow the validation RMSE, and the model kept is that epoch's.
set -euo pipefail
bin=${MFS_BIN:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --help and -h print the usage and exit 0, like every Unix tool
for c in train config serve produce gen; do
	for h in --help -h; do
		"$bin" "$c" "$h" >"$tmp/help" 2>&1 || fail "$c $h exited non-zero: $(head -2 "$tmp/help")"
		grep -q "usage: mfstream $c" "$tmp/help" || fail "$c $h printed no usage: $(head -2 "$tmp/help")"
	done
done

"$bin" gen --gen.ratings 60000 --gen.users 600 --gen.items 300 --gen.rank 4 --gen.noise 0.3 \
	--gen.seed 3 --output "$tmp/r.tsv" 2>/dev/null
[ "$(wc -l <"$tmp/r.tsv")" -eq 60000 ] || fail "gen wrote $(wc -l <"$tmp/r.tsv") lines"

out=$("$bin" train --input "$tmp/r.tsv" --snapshot "$tmp/snap" --k 16 --epochs 15 --engine cpu \
	--threads 1 --deterministic --train.patience 0 2>"$tmp/err") || { cat "$tmp/err"; fail "train failed"; }
echo "$out"
echo "$out" | grep -q "published snapshot seq=1" || fail "no snapshot published"
rmse=$(echo "$out" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
# noise sigma = 0.3: a planted rank-4 model must be learned to near the noise floor
awk -v r="$rmse" 'BEGIN { exit !(r > 0.2 && r < 0.36) }' || fail "test RMSE $rmse not near sigma 0.3"

# deterministic mode is reproducible bit for bit: a second run gives the same table
out2=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 15 --engine cpu --deterministic \
	--train.patience 0 2>/dev/null)
[ "$(echo "$out" | grep -E '^ +[0-9]+ ' | awk '{print $4, $5}')" = \
  "$(echo "$out2" | grep -E '^ +[0-9]+ ' | awk '{print $4, $5}')" ] || fail "deterministic runs differ"

# --test FILE: read after the last epoch (its log line follows the table), scored once
head -n 6000 "$tmp/r.tsv" >"$tmp/t.tsv"
tail -n +6001 "$tmp/r.tsv" >"$tmp/tr.tsv"
"$bin" train --input "$tmp/tr.tsv" --test "$tmp/t.tsv" --k 16 --epochs 5 --engine cpu --deterministic \
	--log.level info >"$tmp/order" 2>&1 || { cat "$tmp/order"; fail "train --test failed"; }
last_epoch=$(grep -nE '^ +5 ' "$tmp/order" | cut -d: -f1)
read_at=$(grep -n 'msg="test file read"' "$tmp/order" | cut -d: -f1)
[ -n "$last_epoch" ] && [ -n "$read_at" ] && [ "$read_at" -gt "$last_epoch" ] ||
	{ cat "$tmp/order"; fail "the test file was read before the last epoch (line $read_at, epoch 5 at $last_epoch)"; }
[ "$(grep -c 'test RMSE' "$tmp/order")" -eq 1 ] || fail "the test was not scored exactly once"
grep -q "test: 6000 ratings" "$tmp/order" || fail "test set: $(grep 'test:' "$tmp/order")"

# train.item_order: the item rows renumbered at random by default (one log line), kept with
# appearance. A test file read after training looks its ids up in the renumbered map: the
# training file itself, scored as the test, gives the training RMSE (unclipped against clipped)
for o in random appearance; do
	"$bin" train --input "$tmp/tr.tsv" --test "$tmp/tr.tsv" --k 16 --epochs 5 --engine cpu --deterministic \
		--train.item_order "$o" --log.level info >"$tmp/io" 2>&1 || { cat "$tmp/io"; fail "train.item_order $o failed"; }
	n=$(grep -c 'msg="item rows renumbered"' "$tmp/io" || true)
	[ "$n" -eq "$([ "$o" = random ] && echo 1 || echo 0)" ] || { cat "$tmp/io"; fail "train.item_order $o: $n renumbering lines"; }
	a=$(sed -n 's/.*train RMSE \([0-9.]*\).*/\1/p' "$tmp/io")
	b=$(sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p' "$tmp/io")
	awk -v a="$a" -v b="$b" 'BEGIN { exit !(a != "" && b != "" && a - b < 0.005 && b - a < 0.005) }' ||
		{ cat "$tmp/io"; fail "train.item_order $o: the training file as the test scores $b, training $a"; }
done

# --train.trace_test: a test_rmse column on every epoch row, from the test made resident on the
# engine before training. With no validation split the model kept is the last epoch's, and the
# CPU engine's resident loss and the final score (score_host: another CPU engine over the same
# host arrays) run the same loss code with a reduction fixed by chunk order; they differ only in
# the clip: every epoch's loss and the final score clip predictions to [rating.min, rating.max]
# (as serving does), so the last row's test_rmse is the final test RMSE to all 4 printed
# decimals, with the default range and with one that clips nothing.
tt=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 6 --engine cpu --deterministic --train.patience 0 \
	--train.trace_test 1 2>/dev/null) || fail "train --train.trace_test failed"
echo "$tt"
echo "$tt" | grep -Eq '^epoch .* eta +test_rmse$' || fail "no test_rmse column in the header"
[ "$(echo "$tt" | grep -E '^ +[0-9]+ ' | awk 'NF == 8 && $8 ~ /^[0-9]+\.[0-9][0-9][0-9][0-9]$/' | wc -l)" -eq 6 ] ||
	fail "not every epoch row has a test_rmse"
tlast=$(echo "$tt" | grep -E '^ +6 ' | awk '{ print $8 }')
tfinal=$(echo "$tt" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
[ -n "$tlast" ] && [ "$tlast" = "$tfinal" ] || fail "last epoch's test_rmse $tlast, final test RMSE $tfinal"
wide=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 6 --engine cpu --deterministic --train.patience 0 \
	--train.trace_test 1 --rating.min -1000 --rating.max 1000 2>/dev/null) || fail "train with a wide range failed"
wlast=$(echo "$wide" | grep -E '^ +6 ' | awk '{ print $8 }')
wfinal=$(echo "$wide" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
[ -n "$wlast" ] && [ "$wlast" = "$wfinal" ] || fail "unclipped: last epoch's test_rmse $wlast, final test RMSE $wfinal"
# the trace steers nothing: the same train column and final score as without it
nt=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 6 --engine cpu --deterministic --train.patience 0 2>/dev/null)
[ "$(echo "$tt" | grep -E '^ +[0-9]+ ' | awk '{ print $4 }')" = "$(echo "$nt" | grep -E '^ +[0-9]+ ' | awk '{ print $4 }')" ] &&
	[ "$(echo "$nt" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')" = "$tfinal" ] || fail "trace_test changed the training"
# a test file is read before the first epoch when traced, and still scored once at the end
"$bin" train --input "$tmp/tr.tsv" --test "$tmp/t.tsv" --k 16 --epochs 5 --engine cpu --deterministic \
	--train.trace_test 1 --log.level info >"$tmp/order2" 2>&1 || { cat "$tmp/order2"; fail "traced train --test failed"; }
first_epoch=$(grep -nE '^ +1 ' "$tmp/order2" | cut -d: -f1)
read_at=$(grep -n 'msg="test file read"' "$tmp/order2" | cut -d: -f1)
[ -n "$first_epoch" ] && [ -n "$read_at" ] && [ "$read_at" -lt "$first_epoch" ] || fail "traced test file not read first"
[ "$(grep -c 'test RMSE' "$tmp/order2")" -eq 1 ] && grep -q "test: 6000 ratings" "$tmp/order2" ||
	fail "traced test file: $(grep 'test' "$tmp/order2")"
t5=$(grep -E '^ +5 ' "$tmp/order2" | awk '{ print $8 }')
[ -n "$t5" ] && [ "$t5" = "$(sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p' "$tmp/order2")" ] ||
	fail "traced test file: the last test_rmse $t5 is not the final score"

# validation: early stopping on it, and the model kept is the best epoch's: training the same
# split for exactly that many epochs gives the same test score
# (a rate that decays slowly, so that the small set overfits and the validation RMSE turns)
v=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 40 --lr 0.1 --lr.beta 0.05 --engine cpu --deterministic \
	--train.validation_fraction 0.1 --train.patience 3 2>/dev/null) || fail "train with validation failed"
echo "$v" | grep -q "early stop: validation RMSE has not improved for 3 epochs" || fail "no early stop: $v"
best=$(echo "$v" | sed -n 's/.*(the model of epoch \([0-9]*\)).*/\1/p')
vbest=$(echo "$v" | sed -n 's/.*validation RMSE \([0-9.]*\) (the model.*/\1/p')
[ -n "$best" ] && [ "$(echo "$v" | awk -v e="$best" '$1 == e { print $5 }')" = "$vbest" ] ||
	fail "kept epoch $best: validation $vbest is not that epoch's row"
last=$(echo "$v" | grep -E '^ +[0-9]+ ' | tail -1 | awk '{ print $1 }')
[ "$best" -lt "$last" ] || fail "the best epoch $best is the last one ($last): nothing to select"
t1=$(echo "$v" | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
t2=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs "$best" --lr 0.1 --lr.beta 0.05 --engine cpu --deterministic \
	--train.validation_fraction 0.1 --train.patience 0 2>/dev/null | sed -n 's/.*test RMSE \([0-9.]*\).*/\1/p')
[ -n "$t1" ] && [ "$t1" = "$t2" ] || fail "the model kept scores $t1 on the test, epoch $best's model $t2"
# with the trace on, the same early stop and the same model kept: the test column steers nothing
vt=$("$bin" train --input "$tmp/r.tsv" --k 16 --epochs 40 --lr 0.1 --lr.beta 0.05 --engine cpu --deterministic \
	--train.validation_fraction 0.1 --train.patience 3 --train.trace_test 1 2>/dev/null) || fail "traced validation run"
[ "$(echo "$vt" | grep -E '^(test|early)|the model of epoch')" != "" ] &&
	[ "$(echo "$vt" | grep -E '^(test|early)'; echo "$vt" | grep -o 'validation RMSE.*')" = \
	  "$(echo "$v" | grep -E '^(test|early)'; echo "$v" | grep -o 'validation RMSE.*')" ] ||
	fail "trace_test changed early stopping or the model kept: $(echo "$vt" | tail -4)"

"$bin" inspect --snapshot "$tmp/snap" | tee "$tmp/meta"
grep -Eq '^k = 16$' "$tmp/meta" || fail "inspect: k"
grep -Eq '^seq = 1$' "$tmp/meta" || fail "inspect: seq"
grep -Eq '^n_users = 600$' "$tmp/meta" || fail "inspect: n_users"

top=$("$bin" query --snapshot "$tmp/snap" --user 1 --top 5)
[ "$(echo "$top" | grep -c .)" -eq 5 ] || fail "query --top 5 gave: $top"
p=$("$bin" query --snapshot "$tmp/snap" --user 1 --item 1)
awk -v p="$p" 'BEGIN { exit !(p >= 0.5 && p <= 5) }' || fail "prediction $p outside the rating range"

printf '1 1\n2 3\n999999 1\n1 999999\n' >"$tmp/pairs"
"$bin" predict --snapshot "$tmp/snap" --pairs "$tmp/pairs" >"$tmp/pred" 2>"$tmp/perr"
[ "$(wc -l <"$tmp/pred")" -eq 4 ] || fail "predict: $(cat "$tmp/pred")"
[ "$(sed -n 1p "$tmp/pred")" = "$p" ] || fail "predict and query disagree: $(sed -n 1p "$tmp/pred") vs $p"

# errors: clear message, usage exit 2 or runtime exit 1, never a crash
set +e
"$bin" train --snapshot "$tmp/s2" 2>"$tmp/e1"; rc=$?
[ $rc -eq 2 ] && grep -q "input" "$tmp/e1" || fail "missing --input: rc=$rc $(cat "$tmp/e1")"
"$bin" train --input "$tmp/r.tsv" --model.k 0 2>"$tmp/e2"; rc=$?
[ $rc -eq 2 ] && grep -q "1..1024" "$tmp/e2" || fail "bad k: rc=$rc $(cat "$tmp/e2")"
"$bin" train --input "$tmp/nope.tsv" 2>"$tmp/e3"; rc=$?
[ $rc -eq 1 ] && grep -q "nope.tsv" "$tmp/e3" || fail "missing file: rc=$rc $(cat "$tmp/e3")"
if ! "$bin" train --input "$tmp/r.tsv" --epochs 1 --engine cuda >/dev/null 2>"$tmp/e4"; then
	grep -qi "cuda" "$tmp/e4" || fail "engine cuda error does not say why: $(cat "$tmp/e4")"
fi
"$bin" query --snapshot "$tmp/empty" --user 1 2>"$tmp/e5"; rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "query on a missing snapshot: rc=$rc"
set -e
echo "1 passed, 0 failed"
