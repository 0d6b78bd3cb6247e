#!/usr/bin/python3
"""test_train_snapshot_mode.py - `mfstream train` into a snapshot directory that is not empty.

  new (default)  a directory that holds a snapshot, or files of another program, is refused:
                 exit 2 naming it, before the data is read (no epoch runs), the snapshot as it
                 was; a directory left with an environment and no snapshot (a run that failed
                 after opening it) is not in the way
  append         the new rows are written over the old ones (the old ids stay)
  replace        the new model takes the old one's place in one transaction: a reader polling
                 the directory meanwhile sees, in each read transaction, the old model or the
                 new one, whole (meta, row counts and row sizes agree), never a mix
  k              both modes refuse a k that is not the snapshot's, up front (readers size
                 their buffers by k: it never changes in a directory)
  not writable   a path under a regular file, and a read-only directory (as a user without
                 the right to write it; as root through setpriv where it can run the binary)

Env: MFS_BIN (mfstream), MFS_SRC_DIR (repository root). The reader needs Debian's
python3-lmdb; without it that part is skipped and said so.
"""

import os
import re
import shutil
import struct
import sys
import tempfile
import threading

SRC = os.path.abspath(os.environ.get("MFS_SRC_DIR", os.getcwd()))
BIN = os.path.abspath(os.environ.get("MFS_BIN", os.path.join(SRC, "build", "mfstream")))

sys.path.insert(0, os.path.join(SRC, "tests"))
from testhelp import check, report, run, spawn, stop  # noqa: E402

try:
    import lmdb
except ImportError:
    lmdb = None


def train(data, snap, *extra, k=16, prefix=()):
    return run(list(prefix) + [BIN, "train", "--input", data, "--snapshot", snap, "--k", str(k), "--epochs", "2",
                               "--engine", "cpu", "--threads", "1", "--log.level", "info"] + list(extra))


def meta(snap):
    p = run([BIN, "inspect", "--snapshot", snap])
    return dict(re.findall(r"^(\S+) = (.*)$", p.stdout, re.M)) if p.returncode == 0 else {}


def refused(p, what, *words):
    """Exit 2, the words on stderr, and nothing read or trained: no data-loaded log line, no
    epoch table."""
    check(p.returncode == 2, "%s: exit 2 (got %d): %s" % (what, p.returncode, p.stderr.strip()[-300:]))
    for w in words:
        check(w in p.stderr, "%s: stderr names %r: %s" % (what, w, p.stderr.strip()[-300:]))
    check('msg="data loaded"' not in p.stderr and "train_rmse" not in p.stdout,
          "%s: refused before the data was read and before any epoch" % what)


class Poller(threading.Thread):
    """Reads the snapshot in a loop, one read transaction at a time, and records per
    transaction (seq, k, n_users, n_items, whether it is whole: the meta's row counts are the
    databases' and a user row is 1 + k floats)."""

    def __init__(self, snap):
        super().__init__(daemon=True)
        self.snap, self.seen, self.done = snap, [], threading.Event()

    def read_once(self, env, dbs):
        with env.begin() as txn:
            u32 = lambda key: struct.unpack("<I", txn.get(key, db=dbs[0]))[0]
            u64 = lambda key: struct.unpack("<Q", txn.get(key, db=dbs[0]))[0]
            seq, k, nu, ni = u64(b"seq"), u32(b"k"), u64(b"n_users"), u64(b"n_items")
            cur = txn.cursor(db=dbs[1])
            row = cur.value() if cur.first() else b""
            whole = (txn.stat(dbs[1])["entries"] == nu and txn.stat(dbs[2])["entries"] == ni
                     and len(row) == 4 * (1 + k))
            self.seen.append((seq, k, nu, ni, whole))

    def run(self):
        env = lmdb.open(self.snap, readonly=True, lock=True, max_dbs=3, max_readers=1024, create=False)
        dbs = [env.open_db(n, create=False) for n in (b"meta", b"users", b"items")]
        try:
            while not self.done.is_set():
                try:
                    self.read_once(env, dbs)
                except lmdb.MapResizedError:
                    env.set_mapsize(0)
            self.read_once(env, dbs)
        finally:
            env.close()


def main():
    if not os.access(BIN, os.X_OK):
        print("FAIL: MFS_BIN=%s is not an executable" % BIN)
        return 1
    tmp = tempfile.mkdtemp(prefix="mfs-train-snap-")
    try:
        os.chmod(tmp, 0o755)  # setpriv's user below must reach the files
        a, b = os.path.join(tmp, "a.tsv"), os.path.join(tmp, "b.tsv")
        for path, n, users, items, seed in ((a, 5000, 300, 200, 5), (b, 3000, 50, 40, 6)):
            p = run([BIN, "gen", "--gen.ratings", str(n), "--gen.users", str(users), "--gen.items", str(items),
                     "--gen.seed", str(seed), "--output", path])
            check(p.returncode == 0, "gen %s: %s" % (path, p.stderr[-300:]))
            os.chmod(path, 0o644)
        snap = os.path.join(tmp, "snap")
        p = train(a, snap)
        check(p.returncode == 0 and "published snapshot seq=1" in p.stdout, "train into a new directory: %s"
              % (p.stdout + p.stderr)[-400:])
        m = meta(snap)
        check(m.get("k") == "16" and m.get("n_users") == "300" and m.get("n_items") == "200", "first model: %s" % m)

        # new: a snapshot there is refused, and left as it was
        p = train(b, snap)
        refused(p, "a snapshot in the directory", snap, "holds a snapshot already", "--snapshot.mode replace",
                "--snapshot.mode append")
        check(meta(snap) == m, "the refused run left the snapshot as it was")

        # append: k must match, checked up front; then the rows are merged
        p = train(b, snap, "--snapshot.mode", "append", k=8)
        refused(p, "append with another k", snap, "k=16", "k=8")
        p = train(b, snap, "--snapshot.mode", "append")
        check(p.returncode == 0, "append: %s" % p.stderr[-300:])
        m2 = meta(snap)
        check(m2.get("seq") == "2" and m2.get("k") == "16" and m2.get("n_users") == "300"
              and m2.get("n_items") == "200", "append keeps the old ids and adds the new rows: %s" % m2)
        check("50 users, 40 items written; it holds 300 users, 200 items" in p.stdout,
              "append says what it wrote and what the snapshot holds: %s" % p.stdout.strip()[-200:])

        # replace: k must match too; then, while a reader polls the directory
        p = train(b, snap, "--snapshot.mode", "replace", k=8)
        refused(p, "replace with another k", snap, "k=16", "k=8")
        poller = Poller(snap) if lmdb else None
        if poller:
            poller.start()
        else:
            print("note: python3-lmdb is not installed; the concurrent reader is not run")
        p = train(b, snap, "--snapshot.mode", "replace")
        if poller:
            poller.done.set()
            poller.join()
        check(p.returncode == 0, "replace: %s" % p.stderr[-300:])
        m3 = meta(snap)
        check(m3.get("seq") == "3" and m3.get("k") == "16" and m3.get("n_users") == "50" and m3.get("n_items") == "40",
              "replace: the snapshot is the new model only, seq goes on: %s" % m3)
        q = run([BIN, "query", "--snapshot", snap, "--user", "300", "--top", "3"])
        check(q.returncode != 0 and "not in the snapshot" in q.stderr,
              "replace: a user of the old model only is gone (query: rc %d %s)" % (q.returncode, q.stderr.strip()))
        if poller:
            kinds = {(s, k, nu, ni) for s, k, nu, ni, _ in poller.seen}
            torn = [x for x in poller.seen if not x[4]]
            check(not torn, "every read transaction is whole: %d of %d are not (%s)"
                  % (len(torn), len(poller.seen), torn[:3]))
            check(kinds <= {(2, 16, 300, 200), (3, 16, 50, 40)} and (3, 16, 50, 40) in kinds,
                  "readers see the old model or the new one: %s" % sorted(kinds))
            print("reader: %d read transactions, models seen %s" % (len(poller.seen), sorted(kinds)))

        # files of another program: refused by default, written among with a mode
        other = os.path.join(tmp, "other")
        os.mkdir(other)
        open(os.path.join(other, "notes.txt"), "w").close()
        p = train(a, other)
        refused(p, "a directory with another program's file", other, "notes.txt")
        p = train(a, other, "--snapshot.mode", "append")
        check(p.returncode == 0, "append into a directory with another file: %s" % p.stderr[-300:])

        # a run that fails after opening a new directory leaves an environment, no snapshot:
        # the next run may use the directory
        fresh = os.path.join(tmp, "fresh")
        p = train(os.path.join(tmp, "missing.tsv"), fresh)
        check(p.returncode != 0 and os.path.isdir(fresh), "train with a missing input fails (rc %d)" % p.returncode)
        p = train(a, fresh)
        check(p.returncode == 0 and meta(fresh).get("seq") == "1",
              "a directory with an environment and no snapshot is taken: %s" % p.stderr[-300:])

        # not writable
        p = train(a, os.path.join(a, "snap"))
        refused(p, "a path under a regular file", os.path.join(a, "snap"))
        ro = os.path.join(tmp, "ro")
        os.mkdir(ro, 0o555)
        os.chmod(ro, 0o555)
        prefix = []
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            if setpriv and run(nobody + [BIN, "--version"]).returncode == 0:
                prefix = nobody
            else:
                print("note: root, and no setpriv that runs the binary as nobody: the read-only directory "
                      "is not checked")
                ro = None
        if ro:
            p = train(a, ro, prefix=prefix)
            refused(p, "a read-only directory", ro, "not writable")
            p = train(a, os.path.join(ro, "sub"), prefix=prefix)
            refused(p, "a new directory in a read-only one", os.path.join(ro, "sub"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_train_snapshot_mode")


if __name__ == "__main__":
    sys.exit(main())
