#!/usr/bin/env bash
# test_gen.sh - `mfstream gen`: determinism, counts, output formats, Zipf skew, the rating
# range and the planted model's moments.
set -euo pipefail

BIN=${MFS_BIN:-./build/mfstream}
[ -x "$BIN" ] || { echo "SKIP: $BIN not built"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/mfs-gen-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
check() { # check "what" command...
	local what=$1; shift
	if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

# drift (gen.drift_period): 0 is the stream without the key; on, the same users, items and
# timestamps with other ratings; one user and one item without noise or biases rate along a
# sinusoid of the period: half a period later, the opposite
"$BIN" gen --n 5000 --seed 3 --gen.drift_period 0 --output "$T/d0.tsv" 2>/dev/null
"$BIN" gen --n 5000 --seed 3 --gen.drift_period 2000 --output "$T/d1.tsv" 2>/dev/null
"$BIN" gen --n 5000 --seed 3 --output "$T/nd.tsv" 2>/dev/null
check "drift 0 is no drift" cmp -s "$T/d0.tsv" "$T/nd.tsv"
check "drift keeps users, items, times" cmp -s <(cut -f1,2,4 "$T/d1.tsv") <(cut -f1,2,4 "$T/nd.tsv")
check "drift changes ratings" bash -c "! cmp -s '$T/d1.tsv' '$T/nd.tsv'"
"$BIN" gen --n 1000 --users 1 --items 1 --noise 0 --gen.bias_sd 0 --mean 0 --min -100 --max 100 \
	--gen.drift_period 1000 --output "$T/sine.tsv" 2>/dev/null
check "drift turns a full circle per period" awk -F'\t' '{ r[NR - 1] = $3 } END {
	for (n = 0; n < 500; n++) { d = r[n] + r[n + 500]; if (d > 1e-5 || d < -1e-5) bad = 1 }
	for (n = 0; n < 1000; n++) if (r[n] > 0.05) pos = 1; else if (r[n] < -0.05) neg = 1
	exit bad || !pos || !neg }' "$T/sine.tsv"

# arriving users (gen.user_arrival): 0 is the stream without the key; on, the same items and
# times; the users of rating n are the gen.users most recent of U + floor(A n) joined, so early
# users leave and new ones come; a prefix stays a prefix; gen.user_offset shifts user ids only
"$BIN" gen --n 20000 --seed 3 --users 100 --gen.user_arrival 0 --output "$T/a0.tsv" 2>/dev/null
"$BIN" gen --n 20000 --seed 3 --users 100 --output "$T/an.tsv" 2>/dev/null
"$BIN" gen --n 20000 --seed 3 --users 100 --gen.user_arrival 0.1 --output "$T/a1.tsv" 2>"$T/a1.log"
"$BIN" gen --n 5000 --seed 3 --users 100 --gen.user_arrival 0.1 --output "$T/a1p.tsv" 2>/dev/null
"$BIN" gen --n 20000 --seed 3 --users 100 --gen.user_arrival 0.1 --gen.user_offset 1000000 --output "$T/a1o.tsv" 2>/dev/null
check "arrival 0 is a fixed population" cmp -s "$T/a0.tsv" "$T/an.tsv"
check "arrivals keep items and times" cmp -s <(cut -f2,4 "$T/a1.tsv") <(cut -f2,4 "$T/an.tsv")
check "users are the 100 most recent of those joined" awk -F'\t' '{ j = 100 + int(0.1 * (NR - 1)); if ($1 > j || $1 <= j - 100) bad = 1 } END { exit bad }' "$T/a1.tsv"
check "new users keep coming" test "$(cut -f1 "$T/a1.tsv" | sort -u | wc -l)" -gt 1900
check "users touched counted" grep -q 'users_touched=[0-9]\{4\}' "$T/a1.log"
check "arrivals: a prefix stays a prefix" cmp -s "$T/a1p.tsv" <(head -n 5000 "$T/a1.tsv")
check "user offset shifts user ids only" cmp -s <(awk -F'\t' -v OFS='\t' '{ $1 -= 1000000; print }' "$T/a1o.tsv") "$T/a1.tsv"

# determinism and counts
"$BIN" gen --n 5000 --seed 3 --output "$T/a.tsv" 2>"$T/a.log"
"$BIN" gen --n 5000 --seed 3 --output "$T/b.tsv" 2>/dev/null
"$BIN" gen --n 5000 --seed 4 --output "$T/c.tsv" 2>/dev/null
"$BIN" gen --n 1000 --seed 3 --output "$T/prefix.tsv" 2>/dev/null
check "same seed, same bytes" cmp -s "$T/a.tsv" "$T/b.tsv"
check "other seed, other bytes" bash -c "! cmp -s '$T/a.tsv' '$T/c.tsv'"
check "writes N lines" test "$(wc -l <"$T/a.tsv")" -eq 5000
check "shorter run is a prefix" cmp -s "$T/prefix.tsv" <(head -n 1000 "$T/a.tsv")
check "summary line on stderr" grep -q "ratings=5000 users_touched=" "$T/a.log"
check "stdout is tsv" cmp -s "$T/a.tsv" <("$BIN" gen --n 5000 --seed 3 2>/dev/null)
check "4 tab-separated fields, u64 ids in range" awk -F'\t' \
	'NF != 4 || $1 < 1 || $1 > 10000 || $2 < 1 || $2 > 5000 || $1 !~ /^[0-9]+$/ { bad = 1 } END { exit bad }' "$T/a.tsv"
check "timestamps non-decreasing" awk -F'\t' 'NR > 1 && $4 < prev { bad = 1 } { prev = $4 } END { exit bad }' "$T/a.tsv"

# ratings within [min, max], and the clip reaches both ends with large noise
"$BIN" gen --n 20000 --noise 3 --min 1 --max 5 --output "$T/clip.tsv" 2>/dev/null
check "ratings within [1, 5]" awk -F'\t' '$3 < 1 || $3 > 5 { bad = 1 } END { exit bad }' "$T/clip.tsv"
check "clipping hits both ends" awk -F'\t' '$3 == 1 { lo++ } $3 == 5 { hi++ } END { exit !(lo > 100 && hi > 100) }' "$T/clip.tsv"
check "ratings are not rounded" awk -F'\t' '$3 != int($3) { frac++ } END { exit !(frac > NR / 2) }' "$T/a.tsv"

# the planted model: no noise, no biases, no signal -> every rating is the mean
"$BIN" gen --n 1000 --noise 0 --gen.bias_sd 0 --gen.signal_sd 0 --mean 3.25 --output "$T/flat.tsv" 2>/dev/null
check "flat model gives the mean" awk -F'\t' '$3 != 3.25 { bad = 1 } END { exit bad }' "$T/flat.tsv"
# unclipped variance = 2 bias_sd^2 + signal_sd^2 + noise^2 = 2*0.09 + 0.25 + 0.25 = 0.68
"$BIN" gen --n 200000 --min -100 --max 100 --output "$T/var.tsv" 2>/dev/null
check "mean 3.5 and variance 0.68 (+-5%)" awk -F'\t' '{ s += $3; q += $3 * $3 } END {
	m = s / NR; v = q / NR - m * m; printf "  mean %.4f var %.4f\n", m, v
	exit !(m > 3.45 && m < 3.55 && v > 0.68 * 0.95 && v < 0.68 * 1.05) }' "$T/var.tsv"

# Zipf 1.2 over 1000 items: the top item draws 1/H(1000, 1.2) ~ 23% of all ratings;
# uniform gives ~0.1% (plus noise). Popular items are not item 1.
"$BIN" gen --n 50000 --items 1000 --zipf 1.2 --output "$T/zipf.tsv" 2>/dev/null
"$BIN" gen --n 50000 --items 1000 --zipf 0 --output "$T/unif.tsv" 2>/dev/null
top() { cut -f2 "$1" | sort | uniq -c | sort -rn | head -n 1; }
read -r zc zitem < <(top "$T/zipf.tsv")
read -r uc _ < <(top "$T/unif.tsv")
echo "  top item: zipf 1.2 $zc (item $zitem), uniform $uc"
check "zipf top item >= 20x uniform top item" test "$zc" -ge $((20 * uc))
check "zipf top share ~23%" test "$zc" -gt 10000 -a "$zc" -lt 13000
check "uniform top share small" test "$uc" -lt 150
check "top item is a permuted id" test "$zitem" -ne 1

# output formats by suffix
"$BIN" gen --n 3000 --output "$T/a.csv" 2>/dev/null
check "csv header + N lines" test "$(head -n 1 "$T/a.csv")" = "userId,movieId,rating,timestamp" -a \
	"$(wc -l <"$T/a.csv")" -eq 3001
"$BIN" gen --n 3000 --output "$T/a.bin" 2>/dev/null
check "bin = 8 + 28 N bytes" test "$(stat -c %s "$T/a.bin")" -eq $((8 + 28 * 3000))
check "bin magic" test "$(head -c 8 "$T/a.bin")" = "MFSRAT01"
"$BIN" gen --n 3000 --output "$T/a.tsv.gz" 2>/dev/null
"$BIN" gen --n 3000 --output "$T/a3000.tsv" 2>/dev/null
if command -v gzip >/dev/null; then
	check ".gz decompresses to the tsv" cmp -s "$T/a3000.tsv" <(gzip -dc "$T/a.tsv.gz")
fi
"$BIN" gen --n 3000 --output "$T/a.tsv.zst" 2>/dev/null
if command -v zstd >/dev/null; then
	check ".zst decompresses to the tsv" cmp -s "$T/a3000.tsv" <(zstd -dc "$T/a.tsv.zst")
fi

# usage errors exit 2
set +e
"$BIN" gen --min 5 --max 1 --output "$T/x.tsv" 2>/dev/null; rc1=$?
"$BIN" gen --no-such-flag 1 2>/dev/null; rc2=$?
"$BIN" gen extra-arg 2>/dev/null; rc3=$?
"$BIN" gen --n 10 --output "$T/no/such/dir.tsv" 2>/dev/null; rc4=$?
set -e
check "min > max is a usage error" test "$rc1" -eq 2
check "unknown flag is a usage error" test "$rc2" -eq 2
check "positional argument is a usage error" test "$rc3" -eq 2
check "unwritable output is a runtime error" test "$rc4" -eq 1

echo "$fails failed"
[ "$fails" -eq 0 ]
