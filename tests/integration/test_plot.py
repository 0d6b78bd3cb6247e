#!/usr/bin/python3
"""test_plot.py - scripts/plot.py turns CSV files into PNG charts.

A synthetic streaming time series (the header the streaming benchmark writes, with gaps: an
all-empty holdout column, NaN cells, a run without events_per_s) goes through `plot.py stream`,
and the benchmark CSVs in bench/results/ through `plot.py bench`. Every PNG the script names
must exist, start with the PNG signature, carry an IHDR of a plausible size, and hold more than
a blank canvas (size and distinct bytes). A CSV of an unknown kind is a usage error (exit 2).
Exit 77 when python3-matplotlib is missing.
"""

import math
import os
import shutil
import struct
import sys
import tempfile
import zlib

SRC = os.path.abspath(os.environ.get("MFS_SRC_DIR", os.getcwd()))
PLOT = os.path.join(SRC, "scripts", "plot.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

try:
    import matplotlib  # noqa: F401
except ImportError:
    print("SKIP: python3-matplotlib is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.join(SRC, "tests"))
from testhelp import check, report, run  # noqa: E402


def write_stream_csv(path, n=240, with_eps=True):
    """A run of n seconds: RMSE falling from 1.2 towards 0.8, a holdout column left empty, the
    window RMSE only every 5 s (NaN between), a learning rate cut twice, a snapshot age that
    cycles, a ring that fills under a burst."""
    cols = ["t_s", "events_applied", "events_per_s", "prequential_rmse", "holdout_rmse", "window_rmse",
            "lr", "snapshot_age_ms", "ring_fill"]
    applied = 0
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for i in range(n):
            t = 0.5 * i
            eps = 50000 + 20000 * math.sin(i / 15.0) + (30000 if 100 <= i < 130 else 0)
            applied += int(eps * 0.5)
            rmse = 0.8 + 0.4 * math.exp(-i / 60.0)
            row = ["%.1f" % t, str(applied), ("%.0f" % eps) if with_eps else "", "%.4f" % rmse, "",
                   ("%.4f" % (rmse - 0.02)) if i % 10 == 0 else "nan",
                   "%.4f" % (0.03 if i < 80 else 0.015 if i < 160 else 0.0075),
                   "%.0f" % (100 + (i * 37) % 900), "%.2f" % (0.9 if 100 <= i < 130 else 0.1)]
            f.write(",".join(row) + "\n")


def png_ok(path, min_bytes=8000):
    """(ok, why): the PNG signature, an IHDR chunk with a sane size, a decodable image that is
    not one flat colour."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        return False, str(e)
    if not data.startswith(PNG_MAGIC):
        return False, "no PNG signature"
    if len(data) < min_bytes:
        return False, "only %d bytes" % len(data)
    length, ctype = struct.unpack(">I4s", data[8:16])
    if ctype != b"IHDR" or length != 13:
        return False, "first chunk is not IHDR"
    w, h, depth, colour = struct.unpack(">IIBB", data[16:26])
    if not (300 <= w <= 4000 and 200 <= h <= 4000):
        return False, "size %dx%d" % (w, h)
    # the pixels: concatenate IDAT, inflate, and count distinct bytes (a blank canvas has ~2)
    idat, pos = b"", 8
    while pos < len(data):
        n, t = struct.unpack(">I4s", data[pos:pos + 8])
        if t == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    try:
        raw = zlib.decompress(idat)
    except zlib.error as e:
        return False, "IDAT does not inflate: %s" % e
    if len(set(raw)) < 16:
        return False, "nearly blank (%d distinct bytes)" % len(set(raw))
    return True, "%dx%d" % (w, h)


def run_plot(args):
    p = run([sys.executable, PLOT] + args, timeout=300)
    return p.returncode, [ln for ln in p.stdout.splitlines() if ln.strip()], p.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="mfs-plot-")
    try:
        csv = os.path.join(tmp, "stream-synthetic.csv")
        write_stream_csv(csv)
        out = os.path.join(tmp, "img")
        rc, files, err = run_plot(["stream", csv, "-o", out])
        check(rc == 0, "plot.py stream exits 0: %s" % err)
        want = {os.path.join(out, "stream-synthetic-%s.png" % k) for k in ("rmse", "throughput", "freshness")}
        check(set(files) == want, "plot.py stream names its three PNGs: %s" % files)
        for f in sorted(want):
            ok, why = png_ok(f)
            check(ok, "%s is a non-trivial PNG (%s)" % (os.path.basename(f), why))
        # events_per_s empty: derived from events_applied
        csv2 = os.path.join(tmp, "stream-noeps.csv")
        write_stream_csv(csv2, n=60, with_eps=False)
        rc, files, err = run_plot(["stream", csv2, "-o", out, "--title", "no events_per_s"])
        check(rc == 0 and len(files) == 3 and all(png_ok(f)[0] for f in files),
              "plot.py stream copes with an empty events_per_s column: %s" % err)
        # the benchmark results in the repository
        results = os.path.join(SRC, "bench", "results")
        # the kinds plot.py charts (reader and stream tables are printed, not plotted)
        kinds = ("accuracy-", "cpu-sgd-", "gpu-sgd-", "id-flood-")
        csvs = sorted(os.path.join(results, f) for f in os.listdir(results)
                      if f.endswith(".csv") and f.startswith(kinds) and "reference" not in f and "gpumem" not in f)
        check(csvs, "bench/results has CSV files")
        rc, files, err = run_plot(["bench"] + csvs + ["-o", out])
        check(rc == 0, "plot.py bench exits 0: %s" % err)
        check(len(files) >= len(csvs), "plot.py bench wrote at least one PNG per CSV (%d for %d)" % (len(files), len(csvs)))
        for f in files:
            ok, why = png_ok(f)
            check(ok, "%s is a non-trivial PNG (%s)" % (os.path.basename(f), why))
        for c in csvs:
            stem = os.path.splitext(os.path.basename(c))[0]
            check(any(os.path.basename(f).startswith(stem + "-") for f in files), "a chart for %s" % stem)
        # usage errors
        bad = os.path.join(tmp, "other.csv")
        with open(bad, "w") as f:
            f.write("a,b\n1,2\n")
        rc, files, err = run_plot(["bench", bad, "-o", out])
        check(rc == 2 and "unknown CSV kind" in err, "an unknown CSV kind is exit 2 (%d: %s)" % (rc, err.strip()))
        rc, files, err = run_plot(["stream", bad, "-o", out])
        check(rc == 2 and "not a streaming time series" in err, "stream on another CSV is exit 2")
        rc, files, err = run_plot(["stream", os.path.join(tmp, "missing.csv"), "-o", out])
        check(rc == 1, "a missing file is exit 1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_plot")


if __name__ == "__main__":
    sys.exit(main())
