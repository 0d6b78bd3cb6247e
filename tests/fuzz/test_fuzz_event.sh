#!/usr/bin/env bash
# test_fuzz_event.sh - ctest's short run of the event-decoder fuzzer (label fuzz): build
# tests/fuzz/fuzz_event.c with tests/fuzz/build.sh and fuzz from the seed corpus for at most
# $MFS_FUZZ_RUNS inputs or $MFS_FUZZ_SECS seconds, whichever comes first. Both bounds are on
# the fuzzer's own work, so a busy machine fuzzes less but never fails for being slow. Any
# crash, sanitizer report, leak, timeout or OOM fails the test and leaves the input in
# $MFS_BUILD_DIR/fuzz-event/work/. Skips (77) only where no clang can link libFuzzer; a target
# that does not build with a working libFuzzer fails.
set -uo pipefail
src=${MFS_SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
dir=${MFS_BUILD_DIR:-/tmp}/fuzz-event
runs=${MFS_FUZZ_RUNS:-500000}
secs=${MFS_FUZZ_SECS:-60}

cc=${FUZZ_CC:-}
if [ -z "$cc" ]; then
	for c in clang-14 clang; do
		if command -v "$c" >/dev/null; then
			cc=$c
			break
		fi
	done
fi
if [ -z "$cc" ]; then
	echo "SKIP: no clang (Debian: apt-get install clang-14 libclang-rt-14-dev)"
	exit 77
fi
rm -rf "$dir"
mkdir -p "$dir/work"
# libFuzzer and the sanitizer runtimes are compiler-rt, which Debian packages apart from clang
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\n%s\n' \
	'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
	>"$dir/probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$dir/probe.c" -o "$dir/probe" 2>"$dir/probe.err"; then
	echo "SKIP: $cc cannot link -fsanitize=fuzzer,address,undefined (libclang-rt-14-dev?): $(head -n 1 "$dir/probe.err")"
	exit 77
fi

# libFuzzer's default exit code for a bug is 77, which ctest would read as a skip: use 1
FUZZ_CC=$cc FUZZ_OUT="$dir/fuzz_event" FUZZ_WORK="$dir/work" bash "$src/tests/fuzz/build.sh" "$secs" \
	-runs="$runs" -error_exitcode=1 -timeout_exitcode=1 >"$dir/fuzz.log" 2>&1
rc=$?
grep -E '^(built |Done |stat::)' "$dir/fuzz.log"
executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log")
if [ "$rc" -ne 0 ]; then
	tail -n 60 "$dir/fuzz.log"
	ls "$dir/work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|input: $dir/work/|"
	if grep -q '^built ' "$dir/fuzz.log"; then
		echo "FAIL: the fuzzer exited with $rc (log: $dir/fuzz.log)"
	else
		echo "FAIL: the fuzz target does not build with $cc (log: $dir/fuzz.log)"
	fi
	exit 1
fi
if [ -z "$executed" ] || [ "$executed" -eq 0 ]; then
	tail -n 20 "$dir/fuzz.log"
	echo "FAIL: the fuzzer ran no inputs (log: $dir/fuzz.log)"
	exit 1
fi
echo "fuzz_event: $executed inputs, no crash"
