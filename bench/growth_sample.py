#!/usr/bin/python3
"""growth_sample.py - sample a running `mfstream serve` while its user table grows (bench/growth.sh).

    bench/growth_sample.py http://127.0.0.1:PORT/metrics OUT.csv [--interval 0.5]

One row per interval: t_s, users (rows holding an id), cap_users (rows allocated), events_per_s,
p99_applied_s (the 99th percentile of message create -> applied over this interval only, from the
change of mfstream_event_to_applied_seconds' buckets: the upper edge of the bucket it falls in),
grow_s and rows_s (the learner's seconds in those phases during the interval), busy (the learner's
share of the interval not waiting), then its seconds in each other phase. Stops when the endpoint goes away after one good sample.
"""
import argparse
import sys
import time
import urllib.request

OTHER = ["score", "submit", "record", "replay", "full_pass", "snapshot", "other"]  # the learner's other phases


def scrape(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    vals, buckets = {}, []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, v = line.rpartition(" ")
        try:
            x = float(v)
        except ValueError:
            continue
        if key.startswith("mfstream_event_to_applied_seconds_bucket"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), x))
        else:
            vals[key] = x
    return vals, sorted(buckets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument("--interval", type=float, default=0.5)
    a = ap.parse_args()
    prev, t0, rows = None, None, 0
    with open(a.out, "w") as f:
        f.write("t_s,users,cap_users,events_per_s,p99_applied_s,grow_s,rows_s,busy," +
                ",".join(p + "_s" for p in OTHER) + "\n")
        while True:
            try:
                vals, b = scrape(a.url)
            except Exception:
                if prev is not None:
                    break
                time.sleep(a.interval)
                continue
            now = time.time()
            if prev is not None:
                pt, pv, pb = prev
                dt = now - pt
                d = [(le, c - pc) for (le, c), (_, pc) in zip(b, pb)]
                total = d[-1][1] if d else 0
                p99 = ""
                if total > 0:
                    for le, c in d:
                        if c >= 0.99 * total:
                            p99 = "%g" % le
                            break
                ph = lambda p: vals.get('mfstream_learner_seconds{phase="%s"}' % p, 0) - pv.get(
                    'mfstream_learner_seconds{phase="%s"}' % p, 0)
                ev = vals.get("mfstream_events_applied_total", 0) - pv.get("mfstream_events_applied_total", 0)
                f.write("%.2f,%d,%d,%.0f,%s,%.3f,%.3f,%.2f,%s\n" % (
                    now - t0, vals.get('mfstream_model_rows{table="users"}', 0),
                    vals.get('mfstream_model_capacity_rows{table="users"}', 0), ev / dt, p99, ph("grow"),
                    ph("rows"), 1 - ph("wait") / dt, ",".join("%.3f" % ph(p) for p in OTHER)))
                f.flush()
                rows += 1
            else:
                t0 = now
            prev = (now, vals, b)
            time.sleep(a.interval)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
