#!/usr/bin/env python3
"""multihost.py - the simulated multi-host run of issue 21 (docs/SCALE_OUT.md, "Between hosts").

H `mfstream serve` processes on this machine (CPU engine) form one consumer group on a rating
topic of P partitions on a real Kafka broker (../shared/kafka): the partitions, and so the
users (events are keyed by user), are split between them. With H > 1 they share item factors
through a compacted topic (exchange.topic). The same time-ordered ratings file is replayed for
every H; the accuracy is the prequential RMSE (each event scored by its host's model before it
is learned) over all hosts' events, against H = 1 on the same stream.

    bench/multihost.py --mfstream build/release/mfstream \\
        --input ../shared/data/movielens/ml-1m-prefix487650_ratings.dat.zst \\
        [--hosts 1,2,4] [--every 1] [--partitions 4] [--csv FILE] [-- extra serve flags]

Steps per H: create the topics; start the H services (serve.replay 0 unless given, so that
the comparison is of the exchange alone, not of how much spare time each host replays);
wait until every one is ready (/readyz: its partitions assigned, so the group is settled
before any event is produced); produce the file; wait until the hosts' events applied and
held out add up to the events produced, and until every row one published every other has
merged (mfstream_exchange_*_rows_total); then stop them (SIGTERM: a final snapshot) and read
each one's snapshot meta (mfstream inspect --json) and its last log lines.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status == 200
    except Exception:
        return False


def wait_for(what, cond, limit_s):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            sys.exit(f"multihost: gave up waiting for {what} after {limit_s} s")
        time.sleep(0.2)


def port_of(log):
    try:
        with open(log) as f:
            m = re.search(r'msg="metrics listening".* port=(\d+)', f.read())
            return int(m.group(1)) if m else None
    except FileNotFoundError:
        return None


def last_line(log, msg):
    out = ""
    with open(log) as f:
        for line in f:
            if f'msg="{msg}"' in line:
                out = line
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', out))


def one_run(a, kafka_bin, bs, H, every, work, produced_n):
    tag = f"mh{H}e{every}x{os.getpid()}"
    topic, items = f"{tag}", f"{tag}.items"
    topics = os.path.join(kafka_bin, "kafka-topics.sh")
    run([topics, "--bootstrap-server", bs, "--create", "--topic", topic, "--partitions", str(a.partitions),
         "--replication-factor", "1"])
    if H > 1:
        run([topics, "--bootstrap-server", bs, "--create", "--topic", items, "--partitions", "4",
             "--replication-factor", "1", "--config", "cleanup.policy=compact"])
    procs, logs, snaps = [], [], []
    for h in range(H):
        snap = os.path.join(work, f"{tag}-h{h}")
        log = snap + ".log"
        cmd = [a.mfstream, "serve", "--snapshot", snap, "--topic", topic, "--brokers", bs, "--engine", "cpu",
               "--kafka.group.id", tag, "--metrics.listen", "127.0.0.1:0", "--serve.replay", "0"]
        if H > 1 and every > 0:
            cmd += ["--exchange.topic", items, "--exchange.host", f"h{h}", "--exchange.every_batches", str(every)]
        cmd += a.serve_args
        procs.append(subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT))
        logs.append(log)
        snaps.append(snap)
    try:
        wait_for("the services' metrics ports", lambda: all(port_of(l) for l in logs), 120)
        ports = [port_of(l) for l in logs]
        wait_for("every service ready (partitions assigned)", lambda: all(ready(p) for p in ports), 120)
        t0 = time.monotonic()
        p = run([a.mfstream, "produce", "--topic", topic, "--input", a.input, "--brokers", bs])
        m = re.search(r"events=(\d+)", p.stdout + p.stderr)
        n = produced_n or (int(m.group(1)) if m else None)

        def done():
            s = sum(metric(pt, "mfstream_events_applied_total") + metric(pt, "mfstream_events_held_out_total") +
                    metric(pt, "mfstream_events_dropped_total") for pt in ports)
            return n is not None and s >= n
        wait_for("every event applied", done, 1800)
        wall = time.monotonic() - t0

        def merged():  # every row a host published merged by every other host (no compaction yet)
            pub = sum(metric(pt, "mfstream_exchange_published_rows_total") for pt in ports)
            mer = sum(metric(pt, "mfstream_exchange_merged_rows_total") for pt in ports)
            return mer >= (H - 1) * pub
        wait_for("every contribution merged", merged, 1800)
        wall_merged = time.monotonic() - t0
    finally:
        for pr in procs:
            pr.send_signal(signal.SIGTERM)
        for pr in procs:
            pr.wait(timeout=300)
    res = {"hosts": H, "every": every, "wall_s": wall, "merged_s": wall_merged, "events": 0, "sse": 0.0, "published": 0, "merged": 0,
           "unknown": 0}
    for h in range(H):
        meta = json.loads(run([a.mfstream, "inspect", "--snapshot", snaps[h], "--json"]).stdout)
        ev = int(meta["prequential_cumulative_n"])
        r = float(meta["prequential_cumulative_rmse"])
        res["events"] += ev
        res["sse"] += ev * r * r
        x = last_line(logs[h], "exchange done")
        res["published"] += int(x.get("published_rows", 0))
        res["merged"] += int(x.get("merged_rows", 0))
        res["unknown"] += int(x.get("items_added", 0))
        res.setdefault("per_host", []).append((ev, r))
    res["rmse"] = (res["sse"] / res["events"]) ** 0.5 if res["events"] else float("nan")
    return res, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mfstream", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--every", default="1", help="publish periods in batches; 0: no exchange (each host alone)")
    ap.add_argument("--partitions", type=int, default=4)
    # the broker kit: MFS_KAFKA_HOME (as the ctest fixture reads it), else ../shared/kafka beside the checkout
    ap.add_argument("--kafka-home", default=os.environ.get("MFS_KAFKA_HOME") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "kafka"))
    ap.add_argument("--csv")
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    a.mfstream = os.path.abspath(a.mfstream)
    hosts = [int(x) for x in a.hosts.split(",")]
    everys = [int(x) for x in a.every.split(",")]
    work = tempfile.mkdtemp(prefix="mfs-multihost-")
    broker = os.path.join(work, "broker")
    bs = run([os.path.join(a.kafka_home, "broker.sh"), "start", broker]).stdout.strip().splitlines()[-1]
    print(f"# broker {bs}; input {a.input}; partitions {a.partitions}; work {work}", flush=True)
    rows, n, base = [], None, None
    try:
        for H in hosts:
            for every in (everys if H > 1 else [1]):
                r, n = one_run(a, os.path.join(a.kafka_home, "kafka_2.11-2.4.0", "bin"), bs, H, every, work, n)
                if H == 1:
                    base = r["rmse"]
                vs = 100 * (r["rmse"] - base) / base if base else float("nan")
                per = " ".join(f"{e}:{x:.4f}" for e, x in r["per_host"])
                print(f"hosts {H} every {every}: events {r['events']} prequential_rmse {r['rmse']:.5f} "
                      f"vs_1 {vs:+.2f}% wall {r['wall_s']:.1f} s ({r['events'] / r['wall_s']:.0f} events/s; "
                      f"every contribution merged at {r['merged_s']:.1f} s) "
                      f"published_rows {r['published']} merged_rows {r['merged']} items_added {r['unknown']} "
                      f"per_host {per}", flush=True)
                rows.append((H, every, r["events"], r["rmse"], vs, r["wall_s"], r["merged_s"], r["published"],
                             r["merged"], r["unknown"]))
    finally:
        subprocess.run([os.path.join(a.kafka_home, "broker.sh"), "wipe", broker], capture_output=True)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("hosts,every,events,prequential_rmse,vs_1_pct,wall_s,merged_s,published_rows,merged_rows,items_added\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
