#!/bin/sh
# runtime-deps.sh FILE... - print, one per line, the Debian/Ubuntu packages holding the shared
# libraries that the ELF FILEs load (ldd, then dpkg -S). The image build runs it in the build
# stage and installs exactly that list in the runtime stage, so the runtime image follows the
# binary: a new library (libmicrohttpd for the metrics endpoint) or another distribution's
# package names (Ubuntu 24.04's t64 renames) need no edit here.
#
# A library that no package owns (libmfsnap from the build tree, copied into the image by
# hand) is named on stderr and skipped. A library ldd cannot find is an error: exit 1.
set -eu
[ $# -gt 0 ] || { echo "usage: runtime-deps.sh ELF..." >&2; exit 2; }
libs=$(mktemp)
trap 'rm -f "$libs"' EXIT
for f in "$@"; do
	out=$(ldd "$f") || { echo "runtime-deps: ldd $f failed" >&2; exit 1; }
	if printf '%s\n' "$out" | grep -q 'not found'; then
		printf '%s\n' "$out" | grep 'not found' >&2
		echo "runtime-deps: $f has unresolved libraries" >&2
		exit 1
	fi
	printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' >>"$libs"
done
# usrmerge: ldd may print /lib/... while dpkg recorded /usr/lib/... (or the other way round)
sort -u "$libs" | while read -r lib; do
	pkg=
	for p in "$lib" "/usr$lib" "${lib#/usr}" "$(readlink -f "$lib")"; do
		pkg=$(dpkg -S "$p" 2>/dev/null | grep -v '^diversion' | head -n 1 | cut -d: -f1) || true
		[ -n "$pkg" ] && break
	done
	if [ -n "$pkg" ]; then
		echo "$pkg"
	else
		echo "runtime-deps: no package owns $lib (copy it into the image yourself)" >&2
	fi
done | sort -u
