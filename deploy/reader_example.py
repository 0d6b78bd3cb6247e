#!/usr/bin/python3
"""reader_example.py - an example serving process: follow the live snapshot of a running
`mfstream serve` and print a user's top-K items every few seconds (mfs-reader-example in the
reader image; the `reader` service of deploy/compose.yaml and the sidecar of deploy/k8s).

    mfs-reader-example /var/lib/mfstream/snap --user 1 --top 10 --interval 10
    mfs-reader-example SNAPDIR --user 42 --once        # one line, exit 0 (1 if no snapshot)

It reads with mfsnap.py (python3-lmdb + numpy; PYTHONPATH points at it in the image), one short
read transaction per call, so it never holds the writer back. Before the first snapshot it
waits; a user the model has not seen yet is reported, not fatal; a restart of the writer is
invisible to it (LMDB keeps the environment). It must share the writer's PID namespace and uid
(docs/OPERATIONS.md: LMDB identifies readers by PID, and lock.mdb is 0644).

Output, one logfmt line per interval on stdout:
    ts=... level=info mod=reader seq=12 events_applied=480000 age_ms=412 users=9731 items=4960
        prequential_rmse=0.93 user=1 top="17:4.81 230:4.77 ..."
"""

import argparse
import os
import signal
import sys
import time

try:
    import mfsnap
except ImportError:  # run from a source tree: the reader lives in snapshots/reader/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "snapshots", "reader", "python"))
    import mfsnap

_stop = False


def _on_term(signum, frame):
    global _stop
    _stop = True


def _ts():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % (int(t * 1000) % 1000)


def _log(level, **kv):
    parts = ["ts=%s" % _ts(), "level=%s" % level, "mod=reader"]
    for k, v in kv.items():
        s = str(v)
        parts.append('%s="%s"' % (k, s.replace('"', "'")) if (" " in s or not s) else "%s=%s" % (k, s))
    print(" ".join(parts), flush=True)


def report(snap, user, top):
    """One line about the snapshot now published; returns True when the user's top-K printed."""
    meta = snap.meta()
    fields = {
        "seq": meta["seq"],
        "events_applied": meta["events_applied"],
        "age_ms": max(0, int(time.time() * 1000) - meta["wall_time_ms"]),
        "users": meta["n_users"],
        "items": meta["n_items"],
    }
    rmse = meta.get("prequential_rmse")
    if rmse is not None and rmse == rmse:
        fields["prequential_rmse"] = "%.4f" % rmse
    try:
        best = snap.topk(user, top)
    except KeyError:
        _log("info", **fields, user=user, msg="user not in the model yet")
        return False
    fields["user"] = user
    fields["top"] = " ".join("%s:%.3f" % (mfsnap.format_id(i), s) for i, s in best)
    _log("info", **fields)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(prog="mfs-reader-example", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the snapshot directory (snapshot.dir of the writer)")
    ap.add_argument("--user", default="1", help="user id (text form: 42, alice, str:42)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between lines")
    ap.add_argument("--once", action="store_true", help="print one line and exit")
    a = ap.parse_args(argv)
    if a.top < 1 or a.interval <= 0:
        ap.error("--top and --interval must be positive")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    snap = None
    waited = False
    while not _stop:
        try:
            if snap is None:
                snap = mfsnap.Snapshot(a.dir)
            report(snap, a.user, a.top)
        except mfsnap.SnapshotNotFound as e:
            if a.once:
                print("mfs-reader-example: %s" % e, file=sys.stderr)
                return 1
            if not waited:
                _log("info", msg="waiting for the first snapshot", dir=a.dir)
                waited = True
        except mfsnap.SnapshotError as e:  # another format version, corrupt: not ours to fix
            print("mfs-reader-example: %s" % e, file=sys.stderr)
            return 1
        if a.once:
            break
        deadline = time.monotonic() + a.interval
        while not _stop and time.monotonic() < deadline:
            time.sleep(min(0.2, a.interval))
    if snap is not None:
        snap.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
