#!/bin/bash
# healthcheck.sh [PATH] - the image's HEALTHCHECK: exit 0 when GET PATH (default /healthz) on
# mfstream's metrics listener answers 200, else 1 with the reason on stderr.
#
# Why bash and /dev/tcp: the runtime images hold no HTTP client, and adding curl or wget for one
# request per interval would add packages (and their CVEs) to every image; bash is in both base
# images (Debian's and Ubuntu's essential set). Kubernetes does not use this: its probes are
# httpGet (deploy/k8s/deployment.yaml).
#
# Address: metrics.listen as the service sees it (MFSTREAM_METRICS_LISTEN, else `mfstream config`
# with the container's MFSTREAM_CONFIG), else MFS_DEFAULT_METRICS_LISTEN, else 0.0.0.0:9464; a
# wildcard host is asked on 127.0.0.1. MFS_HEALTHCHECK_TIMEOUT (seconds, default 3) bounds the read.
set -u
path=${1:-/healthz}
listen=${MFSTREAM_METRICS_LISTEN:-}
if [ -z "$listen" ] && [ -x "${MFS_BIN:-/usr/local/bin/mfstream}" ]; then
	listen=$("${MFS_BIN:-/usr/local/bin/mfstream}" config 2>/dev/null | sed -n 's/^metrics\.listen = //p')
	# the binary's own default is loopback; the entrypoint moved it to the container default
	[ "$listen" = "127.0.0.1:9464" ] && listen=
fi
listen=${listen:-${MFS_DEFAULT_METRICS_LISTEN:-0.0.0.0:9464}}
host=${listen%:*}
port=${listen##*:}
host=${host#[}
host=${host%]}
case $host in
"" | 0.0.0.0 | "*" | ::) host=127.0.0.1 ;;
esac
timeout=${MFS_HEALTHCHECK_TIMEOUT:-3}

# Docker's HEALTHCHECK --timeout bounds the connect; the read is bounded here as well
exec 3<>"/dev/tcp/$host/$port" || { echo "healthcheck: cannot connect to $host:$port" >&2; exit 1; }
printf 'GET %s HTTP/1.0\r\nHost: %s:%s\r\nConnection: close\r\n\r\n' "$path" "$host" "$port" >&3
IFS= read -r -t "$timeout" status <&3 || { echo "healthcheck: no answer from $host:$port$path" >&2; exit 1; }
status=${status%$'\r'}
case $status in
"HTTP/1."[01]" 200"*) exit 0 ;;
esac
echo "healthcheck: $host:$port$path answered: $status" >&2
exit 1
