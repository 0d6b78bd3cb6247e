#!/usr/bin/env bash
# build.sh - build the event-decoder fuzz target with clang-14 (libFuzzer + ASan + UBSan) and
# run it on one core.
#
#   tests/fuzz/build.sh [SECONDS] [extra libFuzzer flags...]   # default 600 s; 0 = build only
#
# The binary is $FUZZ_OUT (default /tmp/fuzz_event). The seed corpus tests/fuzz/corpus_event/
# is only read: new inputs go to a scratch corpus ($FUZZ_WORK, default /tmp/fuzz_event.work)
# so a run never dirties the tree; crashes land in $FUZZ_WORK/crash-* (add them to the seed
# corpus once fixed). Needs clang-14 and libclang-rt-14-dev (Debian), libmsgpack-dev and
# libxxhash-dev; $FUZZ_CC picks another clang. ctest runs a short bounded run of it
# (tests/fuzz/test_fuzz_event.sh, label fuzz).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-600}
shift || true
out=${FUZZ_OUT:-/tmp/fuzz_event}
work=${FUZZ_WORK:-/tmp/fuzz_event.work}
cc=${FUZZ_CC:-clang-14}

# event.c hashes ids with XXH3 (libxxhash); the stage libraries get it from cmake/deps.cmake
"$cc" -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O1 \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
	-I"$root" \
	"$root"/ingest/event.c "$root"/model_store/id.c "$root"/common/err.c "$root"/common/log.c \
	"$root"/tests/fuzz/fuzz_event.c \
	$(pkg-config --cflags --libs msgpack libxxhash) -lm -o "$out"
echo "built $out"
[ "$secs" -gt 0 ] || exit 0

mkdir -p "$work/corpus"
cd "$work"
exec "$out" -max_total_time="$secs" -print_final_stats=1 -max_len=4096 \
	-timeout=10 -rss_limit_mb=2048 "$@" "$work/corpus" "$root/tests/fuzz/corpus_event"
