#!/usr/bin/env bash
# test_install.sh - `cmake --install` into a temporary prefix gives a tree that works where it
# lands (issue 20): the installed mfstream runs with no LD_LIBRARY_PATH (its run path finds
# libmfsnap.so.1 beside it), and a small C reader builds with `pkg-config --cflags --libs
# mfsnap` alone and reads a snapshot. The tree is then moved: the binary and the .pc file are
# relative to where they lie, so both still work.
# Env: MFS_BUILD_DIR (a built tree), MFS_BIN (to make the snapshot), MFS_CMAKE (default cmake).
# Exit 77 only when pkg-config or a C compiler is missing.
set -euo pipefail
build=${MFS_BUILD_DIR:?}
bin=${MFS_BIN:?}
cmake=${MFS_CMAKE:-cmake}
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config (apt-get install pkg-config)"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "SKIP: no C compiler ($cc)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mfs-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$cmake" --install "$build" --prefix "$tmp/p" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; fail "cmake --install failed"; }
pc=$(cd "$tmp/p" && find . -name mfsnap.pc | head -1)
[ -n "$pc" ] || fail "no mfsnap.pc installed: $(cat "$tmp/install.log")"
[ -f "$tmp/p/include/mfs_snap.h" ] || fail "no include/mfs_snap.h installed"
pcdir=$(dirname "$pc")

# a snapshot to read (the build tree's binary; the installed one is checked below)
"$bin" gen --gen.ratings 3000 --gen.users 50 --gen.items 40 --gen.seed 5 --output "$tmp/r.tsv" 2>/dev/null
"$bin" train --input "$tmp/r.tsv" --snapshot "$tmp/snap" --k 8 --epochs 2 --engine cpu --threads 1 \
	>/dev/null 2>"$tmp/train.log" || { cat "$tmp/train.log"; fail "train failed"; }

cat >"$tmp/reader.c" <<'C'
#include <mfs_snap.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	mfs_snap_t *s;
	char err[256];
	if (argc != 2 || mfs_snap_open(argv[1], &s, err, sizeof err)) {
		fprintf(stderr, "reader: %s\n", argc == 2 ? err : "usage: reader SNAPDIR");
		return 1;
	}
	mfs_snap_meta_t m;
	mfs_snap_id_t u;
	mfs_snap_hit_t hit;
	size_t n = 0;
	int rc = mfs_snap_get_meta(s, &m);
	if (!rc)
		rc = mfs_snap_id_parse("1", &u);
	if (!rc)
		rc = mfs_snap_topk(s, &u, 1, &hit, &n);
	if (rc) {
		fprintf(stderr, "reader: %s\n", mfs_snap_strerror(rc));
		return 1;
	}
	printf("k=%u users=%llu items=%llu top=%llu\n", m.k, (unsigned long long)m.n_users,
	       (unsigned long long)m.n_items, (unsigned long long)hit.num);
	mfs_snap_close(s);
	return 0;
}
C

# check_tree ROOT: the installed binary and a reader built against ROOT's mfsnap.pc
check_tree() {
	local root=$1 out flags libdir
	out=$(env -u LD_LIBRARY_PATH "$root/bin/mfstream" --help 2>&1) ||
		fail "$root/bin/mfstream --help: $(echo "$out" | head -3)"
	echo "$out" | grep -q "usage: mfstream" || fail "$root/bin/mfstream --help printed no usage"
	out=$(env -u LD_LIBRARY_PATH ldd "$root/bin/mfstream" | grep libmfsnap) || fail "mfstream does not link libmfsnap"
	case $out in *"$root/"*) ;; *) fail "installed mfstream loads another libmfsnap: $out" ;; esac
	env -u LD_LIBRARY_PATH "$root/bin/mfstream" inspect --snapshot "$tmp/snap" >"$tmp/inspect" 2>&1 ||
		fail "installed mfstream inspect: $(cat "$tmp/inspect")"

	export PKG_CONFIG_PATH="$root/$pcdir"
	pkg-config --exists mfsnap || fail "pkg-config finds no mfsnap in $root/$pcdir"
	[ "$(pkg-config --modversion mfsnap)" = "$("$bin" --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1)" ] ||
		fail "mfsnap.pc version $(pkg-config --modversion mfsnap) is not mfstream's ($("$bin" --version))"
	flags=$(pkg-config --cflags --libs mfsnap)
	libdir=$(pkg-config --variable=libdir mfsnap)
	# shellcheck disable=SC2086 # flags are words
	"$cc" -std=c11 -Wall -Werror -o "$tmp/reader" "$tmp/reader.c" $flags -Wl,-rpath,"$libdir" 2>"$tmp/cc.log" ||
		fail "cc reader.c \$(pkg-config --cflags --libs mfsnap) [$flags]: $(cat "$tmp/cc.log")"
	out=$(env -u LD_LIBRARY_PATH "$tmp/reader" "$tmp/snap") || fail "the reader failed: $out"
	echo "  $root: $out"
	echo "$out" | grep -qE '^k=8 users=[0-9]+ items=[0-9]+ top=[0-9]+$' || fail "reader printed: $out"
	env -u LD_LIBRARY_PATH ldd "$tmp/reader" | grep libmfsnap | grep -q "$root/" ||
		fail "the reader does not load libmfsnap from $root"
}

check_tree "$tmp/p"
echo "ok   installed at a custom prefix: binary runs, reader builds with pkg-config"
mv "$tmp/p" "$tmp/moved"
check_tree "$tmp/moved"
echo "ok   the installed tree still works after it is moved"
