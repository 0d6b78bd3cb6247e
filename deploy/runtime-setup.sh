#!/bin/sh
# runtime-setup.sh PACKAGES.txt - prepare a runtime image (Debian 12 slim or the Ubuntu 24.04 CUDA
# base) as root: install the packages build.sh listed for the binary, plus ca-certificates (TLS
# to brokers signed by a public CA: librdkafka reads OpenSSL's default store); create the
# unprivileged user mfstream (uid/gid 10001) and the snapshot volume /var/lib/mfstream it owns.
#
# The uid is fixed on purpose: LMDB creates lock.mdb with mode 0644, so every process that reads
# the snapshot (the reader sidecar, serving processes) must run as the same uid as the writer.
set -eu
list=$1
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046 # one package name per word
apt-get install -y -qq --no-install-recommends ca-certificates $(cat "$list") >/dev/null
rm -rf /var/lib/apt/lists/*
groupadd --system --gid 10001 mfstream
useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/mfstream --no-create-home \
	--shell /usr/sbin/nologin mfstream
install -d -o 10001 -g 10001 -m 0750 /var/lib/mfstream
