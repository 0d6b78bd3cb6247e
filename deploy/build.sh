#!/bin/sh
# build.sh SRC BUILD STAGE [cmake -D...] - the build an image runs (deploy/Dockerfile): a release
# build of mfstream and libmfsnap without tests, installed under STAGE (DESTDIR, prefix
# /usr/local) together with the Python reader, and STAGE/runtime-packages.txt, the packages the
# runtime image must install (deploy/runtime-deps.sh).
#
# Portable code: MFS_NATIVE stays OFF (no -march=native: the image runs on other CPUs than the
# one that built it). CUDA is compiled when nvcc is found; pass -DMFS_ENABLE_CUDA=OFF for the
# CPU image and -DCMAKE_CUDA_ARCHITECTURES=... to choose the GPUs. MFS_REQUIRE_CUDA=1 makes a
# build without the CUDA engine (nvcc not found) an error instead of a silent CPU-only binary.
set -eu
[ $# -ge 3 ] || { echo "usage: build.sh SRC BUILD STAGE [cmake args]" >&2; exit 2; }
src=$1 build=$2 stage=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DMFS_NATIVE=OFF \
	-DCMAKE_INSTALL_PREFIX=/usr/local "$@"
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target mfstream mfsnap
if [ "${MFS_REQUIRE_CUDA:-0}" = 1 ] && [ ! -f "$build/libmfs_gpu_cuda.a" ]; then
	echo "build.sh: MFS_REQUIRE_CUDA=1 but the CUDA engine was not built (nvcc not found?)" >&2
	exit 1
fi
DESTDIR=$stage cmake --install "$build"
install -D -m 0644 "$src/snapshots/reader/python/mfsnap.py" "$stage/usr/local/lib/mfstream/python/mfsnap.py"
"$here/runtime-deps.sh" "$build/mfstream" "$build/libmfsnap.so" >"$stage/runtime-packages.txt"
echo "build.sh: installed into $stage; runtime packages: $(tr '\n' ' ' <"$stage/runtime-packages.txt")"
