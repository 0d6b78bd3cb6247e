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
libs=$(mktemp) cands=$(mktemp) owners=$(mktemp)
trap 'rm -f "$libs" "$cands" "$owners"' EXIT
for f in "$@"; do
	out=$(ldd "$f") || { echo "runtime-deps: ldd $f failed" >&2; exit 1; }
	if printf '%s\n' "$out" | grep -q 'not found'; then
		printf '%s\n' "$out" | grep 'not found' >&2
		echo "runtime-deps: $f has unresolved libraries" >&2
		exit 1
	fi
	printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' >>"$libs"
done
# usrmerge: ldd may print /lib/... while dpkg recorded /usr/lib/... (or the other way round),
# so each library has four candidate paths, tried in order. They all go to one dpkg-query call:
# every call reads dpkg's whole file database (about 0.4 s idle), and one call per candidate
# took over a minute on a busy machine.
sort -u "$libs" | while read -r lib; do
	for p in "$lib" "/usr$lib" "${lib#/usr}" "$(readlink -f "$lib")"; do
		printf '%s\t%s\n' "$lib" "$p"
	done
done >"$cands"
# "pkg[:arch][, pkg...]: path" per owned path; paths nobody owns only complain on stderr
cut -f2 "$cands" | sort -u | tr '\n' '\0' | xargs -0 -r dpkg-query -S 2>/dev/null |
	grep -v -e '^diversion by ' -e '^local diversion ' >"$owners" || true
awk -F '\t' '
	FILENAME == ARGV[1] { i = index($0, ": "); if (i == 0) next
		pkg = substr($0, 1, i - 1); sub(/,.*/, "", pkg); sub(/:.*/, "", pkg)
		path = substr($0, i + 2); if (!(path in owner)) owner[path] = pkg; next }
	!($1 in seen) { seen[$1] = 1; order[++n] = $1 }
	!($1 in found) && ($2 in owner) { found[$1] = owner[$2] }
	END { for (i = 1; i <= n; i++)
		if (order[i] in found) print found[order[i]]
		else print "runtime-deps: no package owns " order[i] " (copy it into the image yourself)" > "/dev/stderr" }
' "$owners" "$cands" | sort -u
