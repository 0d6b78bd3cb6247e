#!/bin/sh
# entrypoint.sh - the container entrypoint of the mfstream images (deploy/Dockerfile).
#
#   (no arguments)            mfstream serve
#   --flag ...                mfstream serve --flag ...
#   SUBCOMMAND ...            mfstream SUBCOMMAND ...   (serve, produce, query, inspect, config, ...)
#   anything else             run it as it is (mfs-reader-example, sh, python3, ...)
#
# Configuration comes from the environment: MFSTREAM_<KEY> (MFSTREAM_SERVE_TOPICS,
# MFSTREAM_KAFKA_BOOTSTRAP_SERVERS, ...) and MFSTREAM_CONFIG=FILE, as everywhere
# (docs/CONFIGURATION.md). On top of the binary's own defaults the container has two of its own,
# applied only where the file, the environment and the flags leave the binary's default:
#
#   snapshot.dir     /var/lib/mfstream/snap   (the image's volume)      MFS_DEFAULT_SNAPSHOT_DIR
#   metrics.listen   0.0.0.0:9464             (reachable from outside)  MFS_DEFAULT_METRICS_LISTEN
#
# A default is applied by exporting MFSTREAM_<KEY>, and only for a key the binary knows, so an
# image whose binary predates a key still starts. `docker run IMAGE config` prints the
# configuration the service would run with (secrets included: kafka.sasl.password).
#
# serve and train write snapshot.dir: where this uid cannot (a host directory bind-mounted over
# the volume, owned by root), the entrypoint stops with exit 1 and says which uid needs write
# access, instead of leaving the user a bare "Permission denied" from the binary.
#
# The last step is exec: mfstream replaces this shell, so SIGTERM from `docker stop` or the
# kubelet reaches it directly and it publishes its final snapshot before exiting.
set -eu
bin=${MFS_BIN:-/usr/local/bin/mfstream}

log() { # level msg key=value...
	lvl=$1 msg=$2
	shift 2
	echo "ts=$(date -u +%Y-%m-%dT%H:%M:%SZ) level=$lvl mod=entrypoint msg=\"$msg\" $*" >&2
}

[ -x "$bin" ] || { log error "no mfstream binary" "bin=$bin"; exit 127; }
[ $# -gt 0 ] || set -- serve
case $1 in
--help | -h | --version) exec "$bin" "$@" ;;
-*) set -- serve "$@" ;;
esac

# a subcommand of the binary? (its usage lists them: "  name  description")
is_cmd=0
for c in $("$bin" help | awk '/^  [a-z]/ { print $1 }') help version; do
	[ "$1" = "$c" ] && is_cmd=1
done
[ "$is_cmd" = 1 ] || exec "$@"

# the config file the command will read: --config F / --config=F (else MFSTREAM_CONFIG)
file=
prev=
for a in "$@"; do
	[ "$prev" = --config ] && file=$a
	case $a in --config=*) file=${a#--config=} ;; esac
	prev=$a
done

# effective configuration without our defaults; a bad key or value stops here with the
# binary's own message (exit 2, as the subcommand would)
if [ -n "$file" ]; then
	effective=$("$bin" config --config "$file") || exit 2
else
	effective=$("$bin" config) || exit 2
fi
builtin=$(env -i "$bin" config) || exit 2

value() { # KEY TEXT -> the value of "KEY = value" in TEXT; status 1 when the key is absent
	printf '%s\n' "$2" | awk -v k="$1" 'index($0, k " =") == 1 { print substr($0, length(k) + 4); found = 1 }
		END { exit !found }'
}

default() { # KEY ENVVAR VALUE
	b=$(value "$1" "$builtin") || return 0 # the binary does not know this key
	e=$(value "$1" "$effective") || return 0
	[ "$e" = "$b" ] || return 0 # set by the file, the environment or a flag: theirs
	export "$2=$3"
	log info "container default" "key=$1" "value=$3"
}

default snapshot.dir MFSTREAM_SNAPSHOT_DIR "${MFS_DEFAULT_SNAPSHOT_DIR:-/var/lib/mfstream/snap}"
default metrics.listen MFSTREAM_METRICS_LISTEN "${MFS_DEFAULT_METRICS_LISTEN:-0.0.0.0:9464}"

# writable DIR: can this uid create DIR, or write it and its LMDB files? (the nearest existing
# ancestor decides for a directory not made yet)
writable() {
	d=$1
	while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done
	if ! { [ -d "$d" ] && [ -w "$d" ] && [ -x "$d" ]; }; then
		bad=$d
		return 1
	fi
	for f in "$1/data.mdb" "$1/lock.mdb"; do
		[ ! -e "$f" ] || [ -w "$f" ] || { bad=$f; return 1; }
	done
}

case $1 in
serve | train)
	# snapshot.dir as the binary will see it: flags over the environment over the file
	snap='' prev=''
	for a in "$@"; do
		case $prev in --snapshot | --snapshot.dir) snap=$a ;; esac
		case $a in --snapshot=* | --snapshot.dir=*) snap=${a#*=} ;; esac
		prev=$a
	done
	[ -n "$snap" ] || snap=${MFSTREAM_SNAPSHOT_DIR:-}
	[ -n "$snap" ] || snap=$(value snapshot.dir "$effective") || snap=
	if [ -n "$snap" ] && ! writable "$snap"; then
		uid=$(id -u) gid=$(id -g)
		log error "snapshot.dir is not writable by this container's user" "dir=$snap" "not_writable=$bad" \
			"owner=$(stat -c %u:%g "$bad" 2>/dev/null || echo unknown)" "uid=$uid" "gid=$gid" \
			"hint=\"give uid $uid write access: for a bind mount, chown -R $uid:$gid HOSTDIR on the host (or run the container as the directory's owner, --user UID:GID)\""
		exit 1
	fi
	;;
esac

exec "$bin" "$@"
