#!/usr/bin/env bash
# Install what mfstream needs on Debian 12 (apt-get; only what is missing). Used by the
# README's two commands and by .ci/run. nvcc is optional: with /usr/local/cuda present the
# CUDA sources are compiled too. The Java runtime runs the real Kafka broker of the tests
# labelled kafka (../shared/kafka, used in place); kcat is the consumption ceiling of
# bench/stream.sh and a handy tool beside it. clang with libFuzzer builds the fuzz target
# (tests/fuzz; its test skips without them).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git zstd
      librdkafka-dev liblmdb-dev libmsgpack-dev libinih-dev libxxhash-dev libzstd-dev zlib1g-dev
      libmicrohttpd-dev python3-yaml python3-matplotlib
      lmdb-utils python3 python3-lmdb python3-numpy
      openjdk-17-jre-headless kcat clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	echo "setup-deps: installing ${missing[*]}"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
