#!/usr/bin/env bash
# side_by_side.sh - mfstream train (CUDA engine, fp16, k=128) beside cuMF_SGD on the same ratings,
# the same 99/1 split and the same GPU, in one device session (issue 19). Run on the GPU machine
# from the repository root:
#
#   CUMF=.peers/cumf_sgd bash bench/side_by_side.sh BUILD_DIR OUT_DIR [SETS]
#
# BUILD_DIR holds mfstream and bench/cumf_{split,rmse} (a CUDA build, e.g. build-dev from
# scripts/gpu-check.sh build). CUMF is a cuMF_SGD checkout (github cuMF/cumf_sgd at d5e429e) with
# the workplace's Hopper patch applied; docs/BENCHMARKS.md, "Side by side with cuMF_SGD", says
# how to fetch, patch and carry it. It is never part of the repository (.peers/ is ignored).
# SETS (default "u z08 z12 nf"), all `mfstream gen ... --user-skew 0`:
#   u    1M users x 1M items x 100M ratings, uniform items     z08, z12   the same, --zipf 0.8 / 1.2
#   nf   480,189 x 17,770 x 100,480,507, uniform (Netflix shape)
#   t    2,000 x 1,000 x 200,000, uniform: a tiny set to try the script out (ENGINE=cpu works)
# Record n of a set is test when n % 100 == 99 (bench/cumf_split.c writes both programs' files).
#
# Steps (STEPS, default "setup gen pair:SET... report"); each skips what an earlier call on the
# same warm machine already did, so a run too long for one device call (10 minutes) is split
# into calls such as STEPS="setup gen", STEPS="pair:u pair:z08", ...:
#   setup      machine facts; builds cuMF_SGD with its own Makefile (into $DATA/bin, in the
#              background while the next steps run; CUMF_BIN names a ready binary instead)
#   gen        every set in parallel: mfstream gen writes into a FIFO that cumf_split reads, so
#              only the split files land on disk (in $DATA, ~4 GB a set; never under OUT_DIR)
#   mfs:SET    mfstream train --input/--test the split --engine $ENGINE --model.dtype fp16 --k 128
#              --epochs 20 --patience 0 --train.trace_test 1: time_s and test_rmse per epoch
#   cumf:SET   cumf_sgd $CUMF_FLAGS -k 128 -t N for N in CUMF_ITERS, each run followed by
#              cumf_rmse on its model. cuMF prints no RMSE while training, and its learning rate at
#              iteration i is alpha / (1 + beta i^1.5), a function of i alone, so the -t N run is
#              the trajectory's point N (each run is a fresh Hogwild run: points are independent).
#              Its time is the kernel's: updates / wall_update_per_sec (the patch's timer around
#              the one launch); load and save are not counted, as mfstream's time_s counts
#              only its epochs.
#   pair:SET   mfs:SET then cumf:SET
#   report     a table per set and two CSV files in OUT_DIR (from whatever results exist)
# The target of a set is the better (lower) of mfstream's test RMSE at epoch 20 and cuMF's at
# iteration 20; each program's time to target is mfstream's summed epoch time_s up to the first
# epoch at or below it, and cuMF's kernel time of the smallest N at or below it (or "not
# reached"). RMSEs are compared at the 4 decimals mfstream prints. cuMF's RMSE is its own,
# unclipped (as its mf-predict computes it); mfstream's loss clips predictions to [0.5, 5], so
# cumf_rmse's clipped figure (CLIP) is kept in the CSV beside it.
#
# Environment: ENGINE (cuda; cpu runs without a GPU, and without CUMF cuMF is skipped with a
# message), CUMF, CUMF_BIN, DATA (/tmp/mfs-sbs: the split files and cuMF's 1 GB model files),
# BUDGET (seconds one call may use, 540: a step that would not fit is skipped and said so),
# MFS_EST / CUMF_EST (seconds a mfstream run / one cuMF run is assumed to take until one is
# measured), CUMF_ITERS ("1 2 3 4 6 8 10 12 14 16 18 20"), CUMF_FLAGS (the -g -l -a -b -u -v -x -y
# -s flags), EPOCHS (20), K (128), DTYPE (fp16), CLIP (0.5,5), MFS_ARGS (extra train flags).
# OUT_DIR gets only small files (kept in $DATA/results between calls, copied at the end of each):
# per set the train table, the tail of its log, one summary line per cuMF run; side_by_side.csv
# (one row per set and program) and side_by_side_epochs.csv (per epoch, per -t N for cuMF).
set -uo pipefail
BUILD=${1:?usage: bench/side_by_side.sh BUILD_DIR OUT_DIR [SETS]}
OUTD=${2:?usage: bench/side_by_side.sh BUILD_DIR OUT_DIR [SETS]}
SETS=${3:-u z08 z12 nf}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ENGINE=${ENGINE:-cuda}
CUMF=${CUMF:-}
DATA=${DATA:-/tmp/mfs-sbs}
BUDGET=${BUDGET:-540}
EPOCHS=${EPOCHS:-20}
K=${K:-128}
DTYPE=${DTYPE:-fp16}
CLIP=${CLIP:-0.5,5}
MFS_ARGS=${MFS_ARGS:-}
# shellcheck disable=SC2086 # a list: split on purpose
CUMF_ITERS=$(printf '%s\n' ${CUMF_ITERS:-1 2 3 4 6 8 10 12 14 16 18 20} | sort -n | uniq | tr '\n' ' ') # ascending:
# the first N at or below the target is the smallest
CUMF_FLAGS=${CUMF_FLAGS:--g 0 -l 0.05 -a 0.08 -b 0.3 -u 1 -v 1 -x 1 -y 1 -s 8448}
STEPS=${STEPS:-setup gen $(for s in $SETS; do printf 'pair:%s ' "$s"; done)report}
MFS=$BUILD/mfstream
SPLIT=$BUILD/bench/cumf_split
RMSE=$BUILD/bench/cumf_rmse
CUMF_EXE=${CUMF_BIN:-}
[ -z "$CUMF_EXE" ] && [ -n "$CUMF" ] && CUMF_EXE=$DATA/bin/cumf_sgd
CUMF_BUILD=
# Results live beside the data ($DATA/results), so a later call on the same warm machine sees
# them whatever OUT_DIR it is given (the device machine hands each call an empty $OUT); every
# call ends by copying them all to OUT_DIR.
RES=$DATA/results
mkdir -p "$DATA/bin" "$RES" "$OUTD" || exit 1
# The GPU machine's runtime libraries (scripts/gpu-check.sh), when the tree carries them: every
# device call is a new shell. Only for the CUDA engine: a development checkout may hold .devdeps
# too, and its libraries are not this machine's.
# shellcheck disable=SC1091
[ "$ENGINE" = cuda ] && [ -f "$ROOT/.devdeps/env.sh" ] && source "$ROOT/.devdeps/env.sh"
T0=$SECONDS
say() { printf '[%4ss] %s\n' $((SECONDS - T0)) "$*"; }
left() { local l=$((BUDGET - (SECONDS - T0))); echo $((l > 10 ? l : 10)); }
fits() { [ $((SECONDS - T0 + $1)) -le "$BUDGET" ]; }

spec() { # set -> users items ratings zipf
	case $1 in
	u) echo "1000000 1000000 100000000 0" ;;
	z08) echo "1000000 1000000 100000000 0.8" ;;
	z12) echo "1000000 1000000 100000000 1.2" ;;
	nf) echo "480189 17770 100480507 0" ;;
	t) echo "2000 1000 200000 0" ;;
	*) return 1 ;;
	esac
}
small() { [ "$1" = t ]; } # estimates: the tiny set takes seconds
gpu_state() {
	command -v nvidia-smi >/dev/null &&
		nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used --format=csv,noheader ||
		echo "n/a"
}

step_setup() {
	say "setup: engine=$ENGINE sets=$SETS data=$DATA budget=${BUDGET}s"
	command -v nvidia-smi >/dev/null &&
		nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
	echo "  cpus: $(nproc); $(free -g | awk '/^Mem/ { print $2 " GiB memory, " $7 " available" }'); disk: $(df -h "$DATA" | awk 'NR == 2 { print $4 " free" }')"
	local x
	for x in "$MFS" "$SPLIT" "$RMSE"; do
		[ -x "$x" ] || { say "missing $x: build BUILD_DIR first (scripts/gpu-check.sh build for CUDA)"; return 1; }
	done
	ldd "$MFS" | grep "not found" | sed 's/^/  missing at run time: /'
	if [ -n "${CUMF_BIN:-}" ]; then
		say "cuMF_SGD: $CUMF_BIN (CUMF_BIN: not built here)"
	elif [ -z "$CUMF" ]; then
		say "cuMF_SGD: CUMF is unset: only mfstream runs"
	elif ! grep -q wall_update_per_sec "$CUMF/singleGPU/sgd_kernel.cu" 2>/dev/null; then
		say "cuMF_SGD: $CUMF is not a patched checkout (no wall_update_per_sec timer): docs/BENCHMARKS.md says how"
		CUMF_EXE=
		return 1
	elif [ ! -x "$CUMF_EXE" ]; then
		say "cuMF_SGD: building $CUMF with its Makefile (background; log $RES/cumf-build.log)"
		( # a copy: the checkout stays as it was carried
			export PATH=/usr/local/cuda/bin:$PATH
			rm -rf "$DATA/cumf-src" && cp -r "$CUMF" "$DATA/cumf-src" && cd "$DATA/cumf-src/singleGPU" &&
				make >"$DATA/cumf-build.log" 2>&1 && cp cumf_sgd "$CUMF_EXE"
			rc=$?
			{ grep -iE "error|warning" "$DATA/cumf-build.log" | head -20; echo "cumf build rc=$rc"; } >"$RES/cumf-build.log"
		) &
		CUMF_BUILD=$!
	else
		say "cuMF_SGD: $CUMF_EXE (built by an earlier call)"
	fi
}
cumf_wait() {
	[ -n "$CUMF_BUILD" ] || return 0
	wait "$CUMF_BUILD"
	CUMF_BUILD=
	say "cuMF_SGD build: $(tail -1 "$RES/cumf-build.log")"
}

step_gen() {
	local n d pids=() U I N Z
	for n in $SETS; do
		d=$DATA/$n
		if [ -f "$d/split.done" ]; then
			say "gen $n: present: $(cat "$d/split.out")"
			continue
		fi
		spec "$n" >/dev/null || { say "gen $n: unknown set (u z08 z12 nf t)"; continue; }
		read -r U I N Z <<<"$(spec "$n")"
		rm -rf "$d" && mkdir -p "$d" && mkfifo "$d/gen.bin" || return 1
		say "gen $n: mfstream gen --users $U --items $I --n $N --zipf $Z --user-skew 0 --output FIFO | cumf_split"
		(
			"$SPLIT" "$d/gen.bin" "$d" >"$d/split.out" 2>"$d/split.err" &
			sp=$!
			timeout "$(left)" "$MFS" gen --users "$U" --items "$I" --n "$N" --zipf "$Z" --user-skew 0 \
				--output "$d/gen.bin" >"$d/gen.log" 2>&1
			grc=$?
			# a gen that failed before it opened the FIFO leaves the reader blocked in open
			[ $grc = 0 ] || timeout 5 sh -c ": >'$d/gen.bin'"
			wait $sp
			src=$?
			rm -f "$d/gen.bin"
			[ $grc = 0 ] && [ $src = 0 ] && grep -q " records=$N " "$d/split.out" && touch "$d/split.done"
		) &
		pids+=($!)
	done
	[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
	for n in $SETS; do
		d=$DATA/$n
		[ -d "$d" ] || continue
		mkdir -p "$RES/$n"
		cat "$d/gen.log" "$d/split.out" "$d/split.err" 2>/dev/null | tail -5 >"$RES/$n/gen.log"
		if [ -f "$d/split.done" ]; then
			cp "$d/split.out" "$RES/$n/split.out"
		else
			say "gen $n FAILED: $(tail -2 "$RES/$n/gen.log" | tr '\n' ' ')"
		fi
	done
	say "gen: $(du -sh "$DATA" | cut -f1) in $DATA"
}

step_mfs() {
	local n=$1 d=$DATA/$1 r=$RES/$1
	[ -f "$d/split.done" ] || { say "mfs $n: no data (the gen step)"; return 1; }
	grep -q '^done:' "$r/mfs.out" 2>/dev/null && { say "mfs $n: already run"; return 0; }
	local est=${MFS_EST:-150}
	small "$n" && est=${MFS_EST:-10}
	fits "$est" || { say "mfs $n: SKIPPED (elapsed $((SECONDS - T0)) s + ~$est s > budget $BUDGET s)"; return 0; }
	mkdir -p "$r"
	local args=(train --input "$d/mfs_train.bin" --test "$d/mfs_test.bin" --engine "$ENGINE" --model.dtype "$DTYPE"
		--k "$K" --epochs "$EPOCHS" --patience 0 --train.trace_test 1)
	# shellcheck disable=SC2206
	args+=($MFS_ARGS)
	say "mfs $n: mfstream ${args[*]} (gpu: $(gpu_state))"
	local t0=$SECONDS
	timeout "$(left)" "$MFS" "${args[@]}" >"$r/mfs.out" 2>"$d/mfs.err"
	local rc=$?
	tail -n 20 "$d/mfs.err" | cut -c1-400 >"$r/mfs.err"
	say "mfs $n: rc=$rc in $((SECONDS - t0)) s"
	[ $rc = 0 ] || { sed 's/^/  /' "$r/mfs.err" | tail -5; mv "$r/mfs.out" "$r/mfs.failed"; return 1; }
	grep -E '^(mfstream train|done|test):' "$r/mfs.out" | sed 's/^/  /'
}

step_cumf() {
	local n=$1 d=$DATA/$1 r=$RES/$1 t
	[ -f "$d/split.done" ] || { say "cumf $n: no data (the gen step)"; return 1; }
	[ -n "$CUMF_EXE" ] || { say "cumf $n: no cuMF_SGD (CUMF unset): skipped"; return 0; }
	cumf_wait
	[ -x "$CUMF_EXE" ] || { say "cumf $n: $CUMF_EXE missing (setup step; $RES/cumf-build.log)"; return 1; }
	mkdir -p "$r"
	local est=${CUMF_EST:-90}
	small "$n" && est=${CUMF_EST:-5}
	# -t EPOCHS first: with the mfstream run it fixes the target and nearly always cuMF's time to it
	# (its own final RMSE is reached at its last iteration), so a budget cut costs only curve points
	# shellcheck disable=SC2086
	for t in $(printf '%s\n' $CUMF_ITERS | awk -v e="$EPOCHS" '$1 == e { print; next } { a[++n] = $1 } END { for (i = 1; i <= n; i++) print a[i] }'); do
		grep -q ' rmse=' "$r/cumf-t$t.txt" 2>/dev/null && continue
		fits "$est" || { say "cumf $n: -t $t and later SKIPPED (elapsed $((SECONDS - T0)) s + ~$est s > budget $BUDGET s)"; return 0; }
		local t0=$SECONDS log=$d/cumf-t$t.log
		# shellcheck disable=SC2086
		timeout "$(left)" "$CUMF_EXE" $CUMF_FLAGS -k "$K" -t "$t" "$d/cumf_train.bin" "$d/cumf.model" >"$log" 2>&1
		local crc=$?
		grep -E "^m:|update_per_sec|kernel_status|rror|assert" "$log" | head -8 | cut -c1-300 >"$r/cumf-t$t.log"
		# kernel_status:no error wall_kernel_s:S nnz:N iters:T wall_update_per_sec:R (the patch's line)
		local k
		k=$(sed -n 's/^kernel_status:\(.*\) wall_kernel_s:[0-9.]* nnz:\([0-9]*\) iters:\([0-9]*\) wall_update_per_sec:\([0-9.]*\).*/\1|\2|\3|\4/p' "$log" | tail -1)
		local status=${k%%|*} rest=${k#*|} nnz iters rate
		IFS='|' read -r nnz iters rate <<<"$rest"
		if [ $crc != 0 ] || [ -z "$k" ] || [ "$status" != "no error" ] || [ ! -s "$d/cumf.model" ]; then
			say "cumf $n -t $t: FAILED (rc=$crc, status '${status:-none}'): $(tail -2 "$log" | tr '\n' ' ' | cut -c1-300)"
			rm -f "$d/cumf.model"
			return 1
		fi
		local sc
		sc=$(timeout "$(left)" "$RMSE" -c "$CLIP" "$d/cumf.model" "$d/cumf_test.bin" 2>&1)
		rm -f "$d/cumf.model"
		local kernel_s
		kernel_s=$(awk -v n="$nnz" -v i="$iters" -v r="$rate" 'BEGIN { printf "%.6f", (r > 0 ? n * i / r : 0) }')
		echo "iters=$t nnz=$nnz rate=$rate kernel_s=$kernel_s run_s=$((SECONDS - t0)) ${sc#cumf_rmse: }" >"$r/cumf-t$t.txt"
		say "cumf $n -t $t: $(cat "$r/cumf-t$t.txt")"
		est=$((SECONDS - t0 + 5))
	done
}

# One set's table and CSV rows, from OUT_DIR/SET alone.
report_set() {
	local n=$1 r=$RES/$1 t
	[ -f "$r/mfs.out" ] || [ -n "$(ls "$r"/cumf-t*.txt 2>/dev/null)" ] || { say "report $n: no results"; return 0; }
	{
		echo "I set $n"
		echo "I spec $(spec "$n")"
		echo "I epochs $EPOCHS"
		echo "I engine $ENGINE"
		echo "I dtype $([ "$ENGINE" = cuda ] && echo "$DTYPE" || echo fp32)" # the CPU engine is fp32 only
		echo "I k $K"
		sed -n 's/.* train=\([0-9]*\) test=\([0-9]*\) .*/I split \1 \2/p' "$r/split.out" 2>/dev/null
		# epoch time_s updates/s train_rmse valid_rmse lr eta test_rmse
		[ -f "$r/mfs.out" ] && awk '$1 ~ /^[0-9]+$/ && NF == 8 { print "M", $1, $2, $3, $8 }' "$r/mfs.out"
		for t in $CUMF_ITERS; do
			[ -f "$r/cumf-t$t.txt" ] && tr ' ' '\n' <"$r/cumf-t$t.txt" |
				awk -F= '{ v[$1] = $2 } END { if (v["rmse"] != "") print "C", v["iters"], v["kernel_s"], v["rate"], v["rmse"], (v["rmse_clipped"] == "" ? "nan" : v["rmse_clipped"]) }'
		done
	} | awk -v csv="$RES/side_by_side.csv" -v ecsv="$RES/side_by_side_epochs.csv" '
	function r4(x) { return sprintf("%.4f", x) + 0 }
	function rate(s,   m) { m = 1; if (s ~ /G$/) m = 1e9; else if (s ~ /M$/) m = 1e6; else if (s ~ /K$/) m = 1e3
		sub(/[GMK]$/, "", s); return s * m }
	function g(x) { return x == "" ? "-" : sprintf("%.3f G", x / 1e9) }
	$1 == "I" { info[$2] = $3; if ($2 == "spec") { U = $3; I = $4; N = $5; Z = $6 } if ($2 == "split") { ntr = $3; nte = $4 } }
	$1 == "M" { me++; mt[me] = $3; mr[me] = rate($4); mrm[me] = $5 }
	$1 == "C" { ce++; ct[ce] = $2; cs[ce] = $3; cr[ce] = $4; crm[ce] = $5; crc[ce] = $6 }
	END {
		E = info["epochs"]
		# mfstream: the median epoch rate (the printed updates/s, 3 significant digits)
		for (a = 1; a <= me; a++) s[a] = mr[a]
		for (a = 2; a <= me; a++) { v = s[a]; for (b = a - 1; b >= 1 && s[b] > v; b--) s[b + 1] = s[b]; s[b + 1] = v }
		mmed = me ? (me % 2 ? s[(me + 1) / 2] : (s[me / 2] + s[me / 2 + 1]) / 2) : ""
		mfin = me >= E ? mrm[E] : ""
		for (a = 1; a <= ce; a++) if (ct[a] == E) { cfin = crm[a]; crate = cr[a] }
		target = ""
		if (mfin != "") target = r4(mfin)
		if (cfin != "" && (target == "" || r4(cfin) < target)) target = r4(cfin)
		mtt = ""; cum = 0
		for (a = 1; a <= me; a++) { cum += mt[a]; mcum[a] = cum; if (mtt == "" && target != "" && mrm[a] + 0 <= target + 1e-9) { mtt = cum; mat = a } }
		ctt = ""
		for (a = 1; a <= ce; a++) if (ctt == "" && target != "" && r4(crm[a]) <= target + 1e-9) { ctt = cs[a]; cat = ct[a] }
		printf "\n== %s: %s users x %s items x %s ratings, zipf %s; train %s / test %s; k=%s, %s epochs ==\n", info["set"], U, I, N, Z, ntr, nte, info["k"], E
		printf "%-28s %12s %12s   time to target %s\n", "", "updates/s", "RMSE@" E, (target == "" ? "-" : sprintf("%.4f", target))
		mname = "mfstream (" info["engine"] (info["engine"] == "cuda" ? " " info["dtype"] : "") ")"
		printf "%-28s %12s %12s   %s\n", mname, (me ? g(mmed) : "not run"), (mfin == "" ? "-" : sprintf("%.4f", mfin)),
			(!me ? "-" : mtt == "" ? "not reached" : sprintf("%.3f s (epoch %d)", mtt, mat))
		printf "%-28s %12s %12s   %s\n", "cuMF_SGD", (crate == "" ? (ce ? "-" : "not run") : g(crate)), (cfin == "" ? "-" : sprintf("%.4f", cfin)),
			(!ce ? "-" : ctt == "" ? "not reached (by -t " ct[ce] ")" : sprintf("%.3f s (-t %d)", ctt, cat))
		printf "%-28s %12s %12s   %s\n", "mfstream / cuMF_SGD", (mmed != "" && crate > 0 ? sprintf("%.2fx", mmed / crate) : "-"), "",
			(mtt != "" && ctt != "" ? sprintf("cuMF takes %.2fx mfstream'"'"'s time", ctt / mtt) : \
			mtt != "" && ce ? "only mfstream reaches it" : ctt != "" && me ? "only cuMF_SGD reaches it" : "-")
		tgt = target == "" ? "" : sprintf("%.4f", target)
		line = ""; for (a = 1; a <= me; a++) line = line " " mrm[a]
		if (me) printf "mfstream test RMSE by epoch 1..%d:%s\n", me, line
		line = ""; for (a = 1; a <= ce; a++) line = line " " ct[a] ":" sprintf("%.4f", crm[a])
		if (ce) printf "cuMF_SGD test RMSE by -t N:%s\n", line
		if (me) printf "%s,mfstream,%s,%s,%s,%s,%s,%s,%.0f,%s,%s,%s,%s\n", info["set"], info["engine"], info["dtype"], info["k"], E, ntr, nte,
			mmed, mfin, tgt, mtt == "" ? "" : sprintf("%.4f", mtt), mtt == "" ? "" : mat >> csv
		if (ce) printf "%s,cumf_sgd,cuda,fp16,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", info["set"], info["k"], E, ntr, nte,
			crate, cfin, tgt, ctt == "" ? "" : sprintf("%.4f", ctt), ctt == "" ? "" : cat >> csv
		for (a = 1; a <= me; a++) printf "%s,mfstream,%d,%s,%.4f,%.0f,%s,\n", info["set"], a, mt[a], mcum[a], mr[a], mrm[a] >> ecsv
		for (a = 1; a <= ce; a++) printf "%s,cumf_sgd,%d,%s,%s,%s,%s,%s\n", info["set"], ct[a], cs[a], cs[a], cr[a], crm[a], crc[a] >> ecsv
	}'
}
step_report() {
	echo "set,program,engine,dtype,k,epochs,train,test,updates_per_s,test_rmse_final,target_rmse,time_to_target_s,reached_at" >"$RES/side_by_side.csv"
	echo "set,program,epoch,time_s,cum_time_s,updates_per_s,test_rmse,test_rmse_clipped" >"$RES/side_by_side_epochs.csv"
	local n
	for n in $SETS; do report_set "$n"; done
	echo
	echo "(cuMF_SGD: epoch = -t N, a run of its own; time_s = cum_time_s = that run's kernel time.)"
	say "report: $RES/side_by_side.csv, $RES/side_by_side_epochs.csv"
}

for s in $STEPS; do
	case $s in
	setup) step_setup ;;
	gen) step_gen ;;
	mfs:*) step_mfs "${s#mfs:}" ;;
	cumf:*) step_cumf "${s#cumf:}" ;;
	pair:*) # independent: a failed mfstream run does not cost cuMF its turn
		step_mfs "${s#pair:}"
		step_cumf "${s#pair:}"
		;;
	report) step_report ;;
	*) say "unknown step $s" ;;
	esac
done
cumf_wait
[ "$(cd "$RES" && pwd)" = "$(cd "$OUTD" && pwd)" ] || cp -r "$RES/." "$OUTD/"
say "end: results in $OUTD"
