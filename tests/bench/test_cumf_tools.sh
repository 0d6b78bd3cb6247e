#!/usr/bin/env bash
# The cuMF_SGD side-by-side tools (bench/side_by_side.sh, issue 19) on a tiny generated set:
# cumf_split gives both programs the same 99/1 split (record n is test when n % 100 == 99), read
# from a FIFO as from a file, with cuMF's records equal to mfstream's (id - 1, the same f32
# rating); cumf_rmse scores a model file written here in cuMF's layout exactly as an independent
# float32 re-computation of LIBMF's mf_predict + calc_rmse does (ids outside the model and NaN
# predictions fall back to b). Bad input exits 1 with a message.
set -euo pipefail
bin=${MFS_BIN:?}
split=${CUMF_SPLIT:?}
rmse=${CUMF_RMSE:?}
py=$(command -v python3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

gen() { "$bin" gen --users 50 --items 40 --n 2000 --rank 3 --seed 7 --user-skew 0 --output "$1" 2>/dev/null; }
gen "$tmp/g.bin"
mkdir "$tmp/a" "$tmp/b"
"$split" "$tmp/g.bin" "$tmp/a" >"$tmp/a.out" || fail "split of a file: $(cat "$tmp/a.out")"
cat "$tmp/a.out"
grep -q " records=2000 train=1980 test=20 " "$tmp/a.out" || fail "counts: $(cat "$tmp/a.out")"

# through a FIFO, as the benchmark runs it: the same bytes
mkfifo "$tmp/p.bin"
"$split" "$tmp/p.bin" "$tmp/b" >"$tmp/b.out" &
sp=$!
gen "$tmp/p.bin"
wait $sp || fail "split of a FIFO: $(cat "$tmp/b.out")"
for f in mfs_train.bin mfs_test.bin cumf_train.bin cumf_test.bin; do
	cmp -s "$tmp/a/$f" "$tmp/b/$f" || fail "$f differs between the file and the FIFO"
done
[ "$(stat -c %s "$tmp/a/mfs_train.bin")" -eq $((8 + 1980 * 28)) ] || fail "mfs_train.bin size"
[ "$(stat -c %s "$tmp/a/cumf_test.bin")" -eq $((20 * 12)) ] || fail "cumf_test.bin size"

# every record where it belongs, unchanged; then a model in cuMF's layout and its RMSE by hand
"$py" - "$tmp" <<'PY' || fail "split contents or the model"
import math, struct, sys
d = sys.argv[1]
raw = open(d + "/g.bin", "rb").read()
assert raw[:8] == b"MFSRAT01"
recs = [raw[8 + 28 * n: 8 + 28 * (n + 1)] for n in range((len(raw) - 8) // 28)]
want = {"train": [r for n, r in enumerate(recs) if n % 100 != 99], "test": [r for n, r in enumerate(recs) if n % 100 == 99]}
for part, rs in want.items():
    m = open(f"{d}/a/mfs_{part}.bin", "rb").read()
    assert m == b"MFSRAT01" + b"".join(rs), f"mfs_{part}.bin is not records n % 100 {'!=' if part == 'train' else '=='} 99"
    c = open(f"{d}/a/cumf_{part}.bin", "rb").read()
    exp = b"".join(struct.pack("<ii", struct.unpack_from("<Q", r)[0] - 1, struct.unpack_from("<Q", r, 8)[0] - 1) + r[16:20] for r in rs)
    assert c == exp, f"cumf_{part}.bin is not (user - 1, item - 1, rating) of mfs_{part}.bin"

# model: m=30 users (test users >= 30 fall outside), n=40, k=5, b=3.25; user 3's row is NaN
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
m, n, k, b = 30, 40, 5, 3.25
P = [f32(((u * 7 + d * 3) % 11) / 10.0 - 0.2) for u in range(m) for d in range(k)]
Q = [f32(((v * 5 + d * 2) % 13) / 9.0 - 0.3) for v in range(n) for d in range(k)]
P[3 * k + 1] = float("nan")
with open(d + "/model", "wb") as f:
    f.write(struct.pack("<iiiif", 0, m, n, k, b))
    f.write(struct.pack(f"<{m * k}f", *P))
    f.write(struct.pack(f"<{n * k}f", *Q))
test = open(d + "/a/cumf_test.bin", "rb").read()
loss = loss_c = 0.0
outside = nans = 0
for j in range(len(test) // 12):
    u, v, r = struct.unpack_from("<iif", test, 12 * j)
    if not (0 <= u < m and 0 <= v < n):
        z = f32(b); outside += 1
    else:
        z = 0.0
        for x in range(k):  # float32 in index order; double rounding is exact for one op
            z = f32(z + f32(P[u * k + x] * Q[v * k + x]))
        if math.isnan(z):
            z = f32(b); nans += 1
    e = f32(r - z)
    loss += f32(e * e)
    zc = min(max(z, 1.0), 5.0)
    ec = f32(r - zc)
    loss_c += f32(ec * ec)
assert outside > 0, "the test set has no user outside the model: nothing checks that path"
cnt = len(test) // 12
open(d + "/expect", "w").write(f"outside={outside} nan={nans} rmse={math.sqrt(loss / cnt):.6f} rmse_clipped={math.sqrt(loss_c / cnt):.6f}\n")
PY
"$rmse" -c 1,5 "$tmp/model" "$tmp/a/cumf_test.bin" >"$tmp/r.out" || fail "cumf_rmse: $(cat "$tmp/r.out")"
cat "$tmp/r.out" "$tmp/expect"
got=$(grep -o "outside=.*" "$tmp/r.out")
[ "$got" = "$(cat "$tmp/expect")" ] || fail "cumf_rmse says '$got', by hand '$(cat "$tmp/expect")'"

# -m MOD, and bad input: clear message, exit 1
mkdir "$tmp/c"
"$split" -m 10 "$tmp/g.bin" "$tmp/c" | grep -q " train=1800 test=200 " || fail "-m 10 counts"
set +e
printf 'NOTMAGIC' >"$tmp/bad.bin"
"$split" "$tmp/bad.bin" "$tmp/c" 2>"$tmp/e1"; rc=$?
[ $rc -eq 1 ] && grep -q MFSRAT01 "$tmp/e1" || fail "bad magic: rc=$rc $(cat "$tmp/e1")"
head -c $((8 + 28 * 3 + 5)) "$tmp/g.bin" >"$tmp/short.bin"
"$split" "$tmp/short.bin" "$tmp/c" 2>"$tmp/e2"; rc=$?
[ $rc -eq 1 ] && grep -q "truncated record 4" "$tmp/e2" || fail "short record: rc=$rc $(cat "$tmp/e2")"
head -c 100 "$tmp/model" >"$tmp/short.model"
"$rmse" "$tmp/short.model" "$tmp/a/cumf_test.bin" 2>"$tmp/e3"; rc=$?
[ $rc -eq 1 ] && grep -q "does not match" "$tmp/e3" || fail "short model: rc=$rc $(cat "$tmp/e3")"
set -e
echo "1 passed, 0 failed"
