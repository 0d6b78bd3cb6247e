#!/usr/bin/python3
"""scrape.py - sample a running `mfstream serve`'s /metrics into the streaming time-series CSV
that `scripts/plot.py stream` charts.

    scripts/scrape.py http://127.0.0.1:9464/metrics OUT.csv [--interval 0.5] [--max-seconds N]

One row per sample:
    t_s,events_applied,events_per_s,prequential_rmse,holdout_rmse,window_rmse,lr,snapshot_age_ms,ring_fill,
    prequential_window_rmse,prequential_cumulative_rmse,replayed_per_s
t_s counts from the first good scrape; events_per_s (replayed_per_s) is the change of events applied
(of updates replayed) since the previous sample; ring_fill is queued / capacity (0..1); a metric the service does not report is
left empty. It stops when the endpoint goes away after at least one good scrape (the service
exited) or after --max-seconds. Exit 0 with at least one row written, 1 otherwise.
"""

import argparse
import math
import sys
import time
import urllib.error
import urllib.request

COLUMNS = ["t_s", "events_applied", "events_per_s", "prequential_rmse", "holdout_rmse",
           "window_rmse", "lr", "snapshot_age_ms", "ring_fill", "prequential_window_rmse",
           "prequential_cumulative_rmse", "replayed_per_s"]


def parse(text):
    """Prometheus text format -> {metric name: sum over its series} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_labels, _, rest = line.rpartition(" ") if "}" not in line else line.partition("} ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            v = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + v
    return out


def fmt(v):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else "%.6g" % v


def main():
    ap = argparse.ArgumentParser(prog="scrape.py", description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--max-seconds", type=float, default=3600)
    a = ap.parse_args()
    rows, t0, prev = 0, None, None
    start = time.monotonic()
    with open(a.out, "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        while time.monotonic() - start < a.max_seconds:
            tick = time.monotonic()
            try:
                with urllib.request.urlopen(a.url, timeout=2) as r:
                    m = parse(r.read().decode("utf-8", "replace"))
            except (urllib.error.URLError, ConnectionError, OSError):
                if rows:
                    break  # the service is gone
                time.sleep(a.interval)
                continue
            now = time.monotonic()
            if t0 is None:
                t0 = now
            applied = m.get("mfstream_events_applied_total")
            replayed = m.get("mfstream_replayed_events_total")
            eps = rps = None
            if prev and applied is not None and now > prev[0]:
                eps = (applied - prev[1]) / (now - prev[0])
                if replayed is not None and prev[2] is not None:
                    rps = (replayed - prev[2]) / (now - prev[0])
            prev = (now, applied, replayed) if applied is not None else prev
            cap = m.get("mfstream_ring_batches_capacity")
            fill = m["mfstream_ring_batches_queued"] / cap if cap and "mfstream_ring_batches_queued" in m else None
            age = m.get("mfstream_snapshot_age_seconds")
            vals = [now - t0, applied, eps, m.get("mfstream_prequential_rmse"), m.get("mfstream_holdout_rmse"),
                    m.get("mfstream_window_rmse"), m.get("mfstream_learning_rate"),
                    age * 1000.0 if age is not None else None, fill, m.get("mfstream_prequential_window_rmse"),
                    m.get("mfstream_prequential_cumulative_rmse"), rps]
            f.write(",".join(fmt(v) for v in vals) + "\n")
            f.flush()
            rows += 1
            time.sleep(max(0.0, a.interval - (time.monotonic() - tick)))
    print("scrape.py: %d samples -> %s" % (rows, a.out), file=sys.stderr)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
