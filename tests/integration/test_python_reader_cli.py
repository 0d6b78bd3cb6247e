#!/usr/bin/python3
"""test_python_reader_cli.py - mfsnap.py as a command behaves like `mfstream query` (issue 20):
every user error (a missing, foreign or non-directory snapshot path, an unknown id, a bad id,
bad arguments, output that cannot be written, a missing python3-lmdb) is one line on stderr
that names the thing, with a non-zero exit and no traceback; `--dump | head` ends quietly
(SIGPIPE, as a C tool does). Used as a library, the same errors are still exceptions.

Env: MFS_BIN (mfstream, to make a snapshot), MFS_SRC_DIR. Exit 77 when this python3 has no
lmdb or numpy (apt-get install python3-lmdb python3-numpy).
"""

import os
import signal
import subprocess
import sys
import tempfile

SRC = os.path.abspath(os.environ.get("MFS_SRC_DIR", os.getcwd()))
BIN = os.path.abspath(os.environ.get("MFS_BIN", os.path.join(SRC, "build", "mfstream")))
PYDIR = os.path.join(SRC, "snapshots", "reader", "python")
SCRIPT = os.path.join(PYDIR, "mfsnap.py")

sys.path.insert(0, os.path.join(SRC, "tests"))
from testhelp import check, report, run, seconds, spawn  # noqa: E402

try:
    import lmdb  # noqa: F401
    import numpy  # noqa: F401
except ImportError:
    print("SKIP: %s has no lmdb or numpy (apt-get install python3-lmdb python3-numpy)" % sys.executable)
    sys.exit(77)


def cli(*args, env=None):
    return run([sys.executable, SCRIPT, *args], env=env)


def one_line_error(what, args, rc, needle, env=None):
    """mfsnap.py ARGS exits rc, prints nothing on stdout and exactly one stderr line holding needle."""
    p = cli(*args, env=env)
    lines = p.stderr.splitlines()
    ok = (p.returncode == rc and len(lines) == 1 and lines[0].startswith("mfsnap: ") and needle in lines[0]
          and "Traceback" not in p.stderr and p.stdout == "")
    check(ok, "%s: mfsnap.py %s: exit %d (want %d), stderr %r (want one line with %r), stdout %r"
          % (what, " ".join(args), p.returncode, rc, p.stderr, needle, p.stdout[:200]))
    if ok:
        print("ok   %-28s %s" % (what, lines[0]))


def main():
    with tempfile.TemporaryDirectory(prefix="mfs-pycli-") as tmp:
        ratings, snap = os.path.join(tmp, "r.tsv"), os.path.join(tmp, "snap")
        # rows enough that --dump overflows a pipe buffer (64 KiB): about 600 KB of it
        for args in ([BIN, "gen", "--gen.ratings", "20000", "--gen.users", "3000", "--gen.items", "500",
                      "--output", ratings],
                     [BIN, "train", "--input", ratings, "--snapshot", snap, "--k", "16", "--epochs", "1",
                      "--engine", "cpu", "--threads", "1"]):
            p = run(args)
            if not check(p.returncode == 0, "%s: %s" % (" ".join(args[:2]), p.stderr)):
                return report("test_python_reader_cli")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        foreign = os.path.join(tmp, "foreign")     # a directory whose data.mdb is not LMDB
        os.mkdir(foreign)
        with open(os.path.join(foreign, "data.mdb"), "wb") as f:
            f.write(os.urandom(65536))
        missing = os.path.join(tmp, "nosuch")

        # the snapshot works (so the errors below are the arguments' doing)
        p = cli(snap, "--user", "1", "--top", "3")
        check(p.returncode == 0 and len(p.stdout.splitlines()) == 3 and p.stderr == "",
              "top-3 of user 1: exit %d, %r %r" % (p.returncode, p.stdout, p.stderr))

        one_line_error("missing directory", [missing], 1, missing)
        one_line_error("not a directory", [ratings], 1, ratings + " is not a directory")
        one_line_error("directory without snapshot", [empty], 1, "no snapshot in " + empty)
        one_line_error("foreign data.mdb", [foreign], 1, foreign)
        one_line_error("unknown user", [snap, "--user", "99999"], 1, "user 99999 is not in the snapshot")
        one_line_error("unknown user, top-K", [snap, "--user", "99999", "--top", "3"], 1, "user 99999")
        one_line_error("unknown item", [snap, "--item", "alice"], 1, "item alice is not in the snapshot")
        one_line_error("empty id", [snap, "--user", "str:"], 2, '--user "str:"')
        one_line_error("too long id", [snap, "--item", "x" * 300], 2, "--item")
        one_line_error("empty exclude id", [snap, "--user", "1", "--top", "3", "--exclude", "2,str:"], 2,
                       '--exclude "str:"')
        one_line_error("no arguments", [], 2, "dir")
        one_line_error("unknown flag", [snap, "--bogus"], 2, "--bogus")
        one_line_error("bad --top", [snap, "--user", "1", "--top", "x"], 2, "--top")
        one_line_error("--top 0", [snap, "--user", "1", "--top", "0"], 2, "--top")
        one_line_error("--top with --item", [snap, "--user", "1", "--item", "2", "--top", "3"], 2, "--top")
        one_line_error("--exclude without --top", [snap, "--exclude", "1"], 2, "--exclude")
        if os.path.exists("/dev/full"):
            with open("/dev/full", "w") as full:
                p = spawn([sys.executable, SCRIPT, snap, "--dump"], stdout=full, stderr=subprocess.PIPE, text=True)
                err = p.communicate(timeout=seconds(60))[1]
            lines = err.splitlines()
            check(p.returncode == 1 and len(lines) == 1 and "writing the output" in lines[0],
                  "a full disk: exit %d, stderr %r" % (p.returncode, err))
        # python3-lmdb missing: a stand-in lmdb module that fails to import
        fake = os.path.join(tmp, "fake")
        os.mkdir(fake)
        with open(os.path.join(fake, "lmdb.py"), "w") as f:
            f.write('raise ImportError("No module named \'lmdb\'")\n')
        env = dict(os.environ, PYTHONPATH=fake)
        one_line_error("no python3-lmdb", [snap], 1, "apt-get install python3-lmdb", env=env)
        p = run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import mfsnap", PYDIR],
                env=env)
        check(p.returncode == 1 and "ImportError" in p.stderr,
              "import mfsnap without lmdb still raises ImportError: %d %r" % (p.returncode, p.stderr))

        # --dump | head: the reader stops early; mfsnap.py dies of SIGPIPE, silently
        rd, wr = os.pipe()
        child = spawn([sys.executable, SCRIPT, snap, "--dump"], stdout=wr, stderr=subprocess.PIPE)
        os.close(wr)
        with os.fdopen(rd, "rb") as r:
            first = r.readline()
        err = child.communicate(timeout=seconds(60))[1].decode()
        check(first.startswith(b"users ") and child.returncode == -signal.SIGPIPE and err == "",
              "--dump into a closed pipe: exit %d, stderr %r" % (child.returncode, err))

        # the library still raises
        sys.path.insert(0, PYDIR)
        import mfsnap
        for path, exc in ((missing, mfsnap.SnapshotNotFound), (ratings, mfsnap.SnapshotError),
                          (empty, mfsnap.SnapshotNotFound), (foreign, mfsnap.SnapshotError)):
            try:
                mfsnap.Snapshot(path)
                check(False, "Snapshot(%s) did not raise" % path)
            except exc:
                check(True, "")
        s = mfsnap.Snapshot(snap)
        for call in (lambda: s.user(99999), lambda: s.topk(99999, 3)):
            try:
                call()
                check(False, "an unknown user did not raise KeyError")
            except KeyError:
                check(True, "")
        try:
            s.user("str:")
            check(False, "an empty id did not raise ValueError")
        except ValueError:
            check(True, "")
        s.close()
    return report("test_python_reader_cli")


if __name__ == "__main__":
    sys.exit(main())
