#!/usr/bin/env bash
# pack-devtools.sh - copy this Debian machine's perf and gdb, with the shared libraries they
# need beyond glibc, into .devtools.txz (git-ignored, ~25 MB: the unpacked 90 MB would not fit
# the device call's carry limit), for the GPU machine, which has neither and no package
# registry. There: carry ".devtools.txz" and run
#   tar -C /tmp -xJf .devtools.txz
#   /tmp/.devtools/run perf record -g -p PID -- sleep 10   (or: /tmp/.devtools/run gdb -p PID -batch ...)
# Whether the GPU machine's container allows perf_event_open is its own business: try
# `/tmp/.devtools/run perf stat -- true` first.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
d=.devtools
rm -rf "$d" && mkdir -p "$d/bin" "$d/lib"
for t in perf gdb; do
	p=$(command -v "$t") || { echo "no $t here (apt-get install linux-perf gdb)"; exit 1; }
	cp -L "$p" "$d/bin/$t"
	# glibc and the loader are newer on the GPU machine; everything else travels
	ldd "$p" | awk '$3 ~ /^\// {print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
		while read -r l; do cp -Ln "$l" "$d/lib/"; done
done
cat >"$d/run" <<'RUN'
#!/bin/sh
# .devtools/run TOOL ARGS...: TOOL with the libraries packed beside it
h=$(cd "$(dirname "$0")" && pwd)
t=$1
shift
LD_LIBRARY_PATH="$h/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$h/bin/$t" "$@"
RUN
chmod +x "$d/run"
tar -cJf "$d.txz" "$d"
rm -rf "$d"
for x in /.devtools/ /.devtools.txz; do
	grep -qxF "$x" .git/info/exclude 2>/dev/null || echo "$x" >>.git/info/exclude
done
echo "packed $d.txz ($(du -sh "$d.txz" | cut -f1)); carry it as \".devtools.txz\""
