#!/usr/bin/env bash
# The README's test command: install dependencies, build, run the whole test suite, then the
# unit tests again under ASan+UBSan. GPU tests skip (exit 77) where no device answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
jobs=$(nproc)
cmake -S . -B build/test -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMFS_WERROR=ON
cmake --build build/test -j "$jobs"
ctest --test-dir build/test --output-on-failure -j "$jobs" "$@"
# the sanitize preset: unit tests clean under AddressSanitizer and UndefinedBehaviorSanitizer
cmake --preset sanitize -G Ninja >/dev/null
cmake --build build/sanitize -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --test-dir build/sanitize --output-on-failure -j "$jobs" -L unit
