#!/bin/sh
# build-deps.sh - install what building mfstream needs in an image build stage (Debian 12 or
# Ubuntu 24.04, as root). The list is scripts/setup-deps.sh's minus the Python and test tools,
# plus libmicrohttpd-dev for the metrics endpoint.
#
# msgpack-c: Debian 12 ships 4.x as libmsgpack-dev (pkg-config module "msgpack"); 6.x renamed the
# package to libmsgpack-c-dev and the module to "msgpack-c". cmake/deps.cmake asks for "msgpack",
# so when only msgpack-c.pc exists we add msgpack.pc pointing at it (same library, same API).
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
msgpack=libmsgpack-dev
if apt-cache show libmsgpack-c-dev >/dev/null 2>&1; then
	msgpack=libmsgpack-c-dev
fi
apt-get install -y -qq --no-install-recommends \
	build-essential cmake ninja-build pkg-config ca-certificates \
	librdkafka-dev liblmdb-dev "$msgpack" libinih-dev libxxhash-dev libzstd-dev zlib1g-dev \
	libmicrohttpd-dev >/dev/null
if ! pkg-config --exists msgpack && pkg-config --exists msgpack-c; then
	dir=$(pkg-config --variable=pcfiledir msgpack-c)
	ln -s msgpack-c.pc "$dir/msgpack.pc"
	echo "build-deps: msgpack.pc -> msgpack-c.pc ($(pkg-config --modversion msgpack-c))"
fi
rm -rf /var/lib/apt/lists/*
