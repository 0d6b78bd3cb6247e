#!/usr/bin/python3
"""test_seen_items.py - top-K leaves out what the user rated (issue 20, snapshot.seen_items).

`mfstream train` on a small ratings file with event times (not in time order, one time shared
by two ratings, one item rated twice, one rating in a test file it must not count) and
--snapshot.seen_items 3:
  lists      every user's user_rated list holds their last 3 distinct training items by event
             time (file order between equal times), newest last; a re-rated item counts once,
             at its newest place; a user with fewer ratings has them all; the bytes are the
             layout of docs/SNAPSHOT_FORMAT.md
  readers    `mfstream query --top` (libmfsnap) and mfsnap.py leave the listed items out by
             default: their answer is the --include-seen / include_seen=True answer without
             those items, the next ones moving up; --exclude still adds to it; both readers
             agree, item for item
  off        --snapshot.seen_items 0 writes no list: top-K is the full ranking again
  old        a snapshot without the user_rated DB (dropped by hand, as an older writer left
             it) still answers: nothing excluded, no error

Env: MFS_BIN (mfstream), MFS_SRC_DIR (repository root). Needs Debian's python3-lmdb and numpy.
"""

import os
import shutil
import struct
import sys
import tempfile

SRC = os.path.abspath(os.environ.get("MFS_SRC_DIR", os.getcwd()))
BIN = os.path.abspath(os.environ.get("MFS_BIN", os.path.join(SRC, "build", "mfstream")))

sys.path.insert(0, os.path.join(SRC, "tests"))
sys.path.insert(0, os.path.join(SRC, "snapshots", "reader", "python"))
from testhelp import check, report, run  # noqa: E402

try:
    import lmdb
    import mfsnap
except ImportError as e:
    print("SKIP: %s (Debian's python3-lmdb and python3-numpy)" % e)
    sys.exit(77)

# user item rating time: user 1 rates items 10..16 out of time order; 12 twice (the later one
# counts); items 14 and 15 share a time (file order: 15 is newer)
RATINGS = """\
1\t10\t4\t100
1\t16\t2\t900
1\t12\t5\t200
1\t11\t3\t150
1\t14\t4\t700
1\t15\t1\t700
1\t12\t4\t800
1\t13\t2\t300
2\t10\t5\t100
2\t11\t1\t50
3\t10\t3\t10
3\t11\t3\t20
3\t12\t3\t30
3\t13\t3\t40
3\t14\t3\t50
3\t15\t3\t60
3\t16\t3\t70
3\t17\t3\t80
4\t17\t4\t10
4\t16\t4\t20
"""
# newest last: user 1 by time: 10@100 11@150 12@200 13@300 14@700 15@700 12@800 16@900
WANT = {1: [15, 12, 16], 2: [11, 10], 3: [15, 16, 17], 4: [17, 16]}
TEST = "1\t17\t5\t999\n"     # a test-file rating: not a training rating, not in the list


def train(data, snap, *extra):
    return run([BIN, "train", "--input", data, "--test", os.path.join(os.path.dirname(data), "test.tsv"),
                "--snapshot", snap, "--k", "4", "--epochs", "3", "--engine", "cpu", "--threads", "1",
                "--train.validation_fraction", "0", "--snapshot.mode", "replace"] + list(extra))


def query(snap, user, k, *extra):
    p = run([BIN, "query", "--snapshot", snap, "--user", str(user), "--top", str(k)] + list(extra))
    check(p.returncode == 0, "query %s %s: exit 0 (%s)" % (user, extra, p.stderr.strip()[-200:]))
    return [(int(a), b) for a, b in (line.split() for line in p.stdout.splitlines())]


def raw_list(snap, user):
    """The user's user_rated value decoded by hand from the documented layout."""
    env = lmdb.open(snap, readonly=True, lock=True, max_dbs=6, max_readers=1024, create=False)
    try:
        db = env.open_db(b"user_rated", create=False)
        with env.begin() as txn:
            raw = txn.get(b"\x01" + user.to_bytes(8, "big"), db=db)
    finally:
        env.close()
    if raw is None:
        return None
    raw = bytes(raw)
    n, pos, out = struct.unpack_from("<I", raw)[0], 4, []
    for _ in range(n):
        ln = struct.unpack_from("<H", raw, pos)[0]
        key = raw[pos + 2:pos + 2 + ln]
        check(ln == 9 and key[0] == 1, "entry is an encoded u64 id (9 bytes, tag 0x01)")
        out.append(int.from_bytes(key[1:], "big"))
        pos += 2 + ln
    check(pos == len(raw), "user %d: no bytes after the %d entries" % (user, n))
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="mfs-seen-")
    try:
        data, snap = os.path.join(tmp, "r.tsv"), os.path.join(tmp, "snap")
        with open(data, "w") as f:
            f.write(RATINGS)
        with open(os.path.join(tmp, "test.tsv"), "w") as f:
            f.write(TEST)
        p = train(data, snap, "--snapshot.seen_items", "3")
        check(p.returncode == 0, "train: exit 0 (%s)" % p.stderr.strip()[-300:])

        # lists: the last 3 distinct items by event time, newest last
        for u, want in WANT.items():
            check(raw_list(snap, u) == want, "user %d: stored list %s == %s" % (u, raw_list(snap, u), want))
        with mfsnap.Snapshot(snap) as s:
            for u, want in WANT.items():
                check(s.rated(u) == want, "mfsnap rated(%d) == %s (got %s)" % (u, want, s.rated(u)))
            check(s.rated(99) == [], "an unknown user has no list")

            # readers: default = include-seen answer minus the list
            for u, want in WANT.items():
                full = query(snap, u, 8, "--include-seen")
                dflt = query(snap, u, 8)
                check(len(full) == 8, "user %d: --include-seen ranks all 8 items" % u)
                check(dflt == [h for h in full if h[0] not in want],
                      "user %d: query --top leaves out %s: %s vs %s" % (u, want, dflt, full))
                py_full = [(i, "%.9g" % x) for i, x in s.topk(u, 8, include_seen=True)]
                py_dflt = [(i, "%.9g" % x) for i, x in s.topk(u, 8)]
                check(py_full == full, "user %d: mfsnap include_seen=True == query --include-seen" % u)
                check(py_dflt == dflt, "user %d: mfsnap topk == query --top (both exclude)" % u)
                ex = [h[0] for h in dflt[:1]]
                dx = query(snap, u, 8, "--exclude", ",".join(map(str, ex)))
                check(dx == [h for h in dflt if h[0] not in ex], "user %d: --exclude adds to the list" % u)
                pdx = [(i, "%.9g" % x) for i, x in s.topk(u, 8, exclude=ex)]
                check(pdx == dx, "user %d: mfsnap exclude= adds to the list too" % u)
            top2 = query(snap, 1, 2)
            check(len(top2) == 2 and not {i for i, _ in top2} & set(WANT[1]),
                  "user 1: a top-2 fills from below the rated items: %s" % top2)
        p = run([sys.executable, os.path.join(SRC, "snapshots", "reader", "python", "mfsnap.py"), snap,
                 "--user", "1", "--top", "8"])
        q = run([sys.executable, os.path.join(SRC, "snapshots", "reader", "python", "mfsnap.py"), snap,
                 "--user", "1", "--top", "8", "--include-seen"])
        check(p.returncode == 0 and q.returncode == 0, "mfsnap.py CLI: exit 0")
        check(len(p.stdout.splitlines()) == 5 and len(q.stdout.splitlines()) == 8,
              "mfsnap.py --top 8: 5 lines, --include-seen: 8")

        # off: no list, the whole ranking
        p = train(data, snap, "--snapshot.seen_items", "0")
        check(p.returncode == 0, "train with seen_items 0: exit 0")
        check(raw_list(snap, 1) is None, "seen_items 0 (replace): no list written")
        check(query(snap, 1, 8) == query(snap, 1, 8, "--include-seen"), "seen_items 0: nothing excluded")

        # old: no user_rated DB at all
        p = train(data, snap, "--snapshot.seen_items", "3")
        env = lmdb.open(snap, max_dbs=6, max_readers=1024)
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(b"user_rated", txn=txn), delete=True)
        env.close()
        check(query(snap, 1, 8) == query(snap, 1, 8, "--include-seen"), "no user_rated DB: query excludes nothing")
        with mfsnap.Snapshot(snap) as s:
            check(s.rated(1) == [] and len(s.topk(1, 8)) == 8, "no user_rated DB: mfsnap excludes nothing")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_seen_items")


if __name__ == "__main__":
    sys.exit(main())
