#!/usr/bin/env bash
# The README's first command: install what is missing, build, train a model on a synthetic
# stream (or on the ratings file given as $1), publish a snapshot and answer queries from it.
# Runs on the GPU when one answers, else on the CPU (engine.kind=auto).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)"
bin=build/release/mfstream
mkdir -p .data
input=${1:-}
if [ -z "$input" ]; then
	input=.data/demo.tsv.zst
	[ -f "$input" ] || "$bin" gen --gen.ratings 2000000 --gen.users 20000 --gen.items 5000 --gen.zipf 0.8 \
		--gen.noise 0.5 --gen.seed 1 --output "$input"
fi
snap=.data/demo-snapshot
rm -rf "$snap"
"$bin" train --input "$input" --snapshot "$snap" --epochs "${EPOCHS:-10}" --engine auto
echo; "$bin" inspect --snapshot "$snap"
echo; echo "top 5 items for user 1:"; "$bin" query --snapshot "$snap" --user 1 --top 5
echo; echo "the same from the Python reader:"
/usr/bin/python3 snapshots/reader/python/mfsnap.py "$snap" --user 1 --top 5
