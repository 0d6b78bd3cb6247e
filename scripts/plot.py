#!/usr/bin/python3
"""plot.py - PNG charts from the CSV files the benchmarks write (Debian's python3-matplotlib).

    scripts/plot.py stream STREAM.csv [-o DIR] [--title T]
    scripts/plot.py bench bench/results/gpu-sgd-h200.csv [MORE.csv ...] [-o DIR]

stream: a streaming time series with the header (scripts/scrape.py writes it; the last three
columns may be absent)
    t_s,events_applied,events_per_s,prequential_rmse,holdout_rmse,window_rmse,lr,snapshot_age_ms,ring_fill,
    prequential_window_rmse,prequential_cumulative_rmse,replayed_per_s
(empty cells and nan are gaps; a column that is all gaps is left out) ->
    <stem>-rmse.png        prequential (per snapshot interval, running window, cumulative) / holdout /
                           window RMSE over time, learning rate beside
    <stem>-throughput.png  events/s and replayed updates/s over time, events applied beside
    <stem>-freshness.png   snapshot age over time (p50/p99 in the legend), ring fill beside

bench: the kind is told by the header ->
    gpu-sgd (label,engine,...,updates_per_s,...,test_rmse): <stem>-updates.png, grouped bars of
        updates/s per data set and Zipf exponent, one bar per (k, dtype), the engine's targets as
        dashed lines; <stem>-rmse.png, test RMSE the same way
    cpu-sgd per epoch (epoch,sgd_s,updates_per_s,...): <stem>-updates.png bars per epoch,
        <stem>-rmse.png train and test RMSE per epoch
    accuracy (dataset,...,mfstream_test_rmse,reference,reference_rmse,...): <stem>-rmse.png,
        mfstream beside the reference for each data set

Every PNG written is printed on stdout, one path per line. Exit 0; 1 when a file cannot be read
or matplotlib is missing; 2 for usage errors and CSV files of an unknown kind.
"""

import argparse
import csv
import math
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # pragma: no cover - depends on the machine
    plt = None

STREAM_COLUMNS = ["t_s", "events_applied", "events_per_s", "prequential_rmse", "holdout_rmse",
                  "window_rmse", "lr", "snapshot_age_ms", "ring_fill", "prequential_window_rmse",
                  "prequential_cumulative_rmse", "replayed_per_s"]
# the targets (docs/BENCHMARKS.md): updates/s the CUDA engine must hold at k=128, by Zipf exponent
GPU_TARGETS = {0.0: 3e9, 0.8: 2e9, 1.2: 1e9}
DPI = 120


class UsageError(Exception):
    pass


def num(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return math.nan
    return v


def read_csv(path):
    """Rows as dicts. A row with more fields than the header had commas in its first, free-text
    column (bench/accuracy.sh writes "synthetic 10M, 20000x5000, rank 8" unquoted): the extra
    leading fields are joined back into it."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if len(lines) < 2:
        raise UsageError("%s: no rows" % path)
    header, rows = lines[0], []
    for fields in lines[1:]:
        if not fields:
            continue
        extra = len(fields) - len(header)
        if extra > 0:
            fields = [",".join(fields[:extra + 1])] + fields[extra + 1:]
        rows.append(dict(zip(header, fields)))
    return rows


def column(rows, name):
    return [num(r.get(name)) for r in rows]


def present(values):
    return any(not math.isnan(v) for v in values)


def finite(xs, ys):
    """The points where both are numbers: sparse columns (a full pass every few seconds) draw
    as a line through their samples instead of vanishing between NaNs."""
    pts = [(x, y) for x, y in zip(xs, ys) if not (math.isnan(x) or math.isnan(y))]
    return [p[0] for p in pts], [p[1] for p in pts]


def legend_below(ax, handles, labels):
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(handles)),
              fontsize=8, frameon=False)


def percentile(values, q):
    v = sorted(x for x in values if not math.isnan(x))
    if not v:
        return math.nan
    i = min(len(v) - 1, max(0, int(math.ceil(q / 100.0 * len(v))) - 1))
    return v[i]


def save(fig, outdir, name, written):
    path = os.path.join(outdir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    written.append(path)


def si(v, _pos=None):
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return "%g%s" % (round(v / div, 2), suf)
    return "%g" % v


# ---- stream ------------------------------------------------------------------------------------
def plot_stream(path, outdir, title=None):
    rows = read_csv(path)
    missing = [c for c in ("t_s", "events_applied") if c not in rows[0]]
    if missing:
        raise UsageError("%s: not a streaming time series (no %s; want header %s)"
                         % (path, ", ".join(missing), ",".join(STREAM_COLUMNS)))
    stem = os.path.splitext(os.path.basename(path))[0]
    title = title or stem
    t = column(rows, "t_s")
    written = []
    from matplotlib.ticker import FuncFormatter

    # RMSE (and the learning rate the controller sets from it)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = 0
    for name, label in (("prequential_rmse", "prequential (test-then-train), per snapshot"),
                        ("prequential_window_rmse", "prequential, running window"),
                        ("prequential_cumulative_rmse", "prequential, cumulative"),
                        ("holdout_rmse", "holdout"), ("window_rmse", "retained window")):
        x, y = finite(t, column(rows, name))
        if y:
            sparse = len(y) < 0.5 * len(t)
            ax.plot(x, y, label=label, marker="." if sparse or len(y) < 60 else None)
            drawn += 1
    ax.set_xlabel("time (s)")
    ax.set_ylabel("RMSE")
    ax.grid(True, alpha=0.3)
    lr = column(rows, "lr")
    handles, labels = ax.get_legend_handles_labels()
    if present(lr):
        ax2 = ax.twinx()
        h = ax2.plot(*finite(t, lr), color="grey", linestyle="--", label="learning rate")
        ax2.set_ylabel("learning rate")
        handles += h
        labels += ["learning rate"]
    if not drawn:
        ax.text(0.5, 0.5, "no RMSE in this run", transform=ax.transAxes, ha="center")
    if handles:
        legend_below(ax, handles, labels)
    ax.set_title("%s: accuracy while streaming" % title)
    save(fig, outdir, stem + "-rmse.png", written)

    # throughput
    fig, ax = plt.subplots(figsize=(8, 4.5))
    eps = column(rows, "events_per_s")
    applied = column(rows, "events_applied")
    if not present(eps) and present(applied):  # derive it from the counter
        eps = [math.nan] + [(applied[i] - applied[i - 1]) / (t[i] - t[i - 1]) if t[i] > t[i - 1] else math.nan
                            for i in range(1, len(t))]
    ax.plot(*finite(t, eps), label="events/s", color="tab:blue")
    rps = column(rows, "replayed_per_s")
    if present(rps):
        ax.plot(*finite(t, rps), label="replayed updates/s", color="tab:purple")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("per second")
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(*finite(t, applied), label="events applied", color="tab:orange", linestyle="--")
    ax2.set_ylabel("events applied (total)")
    ax2.yaxis.set_major_formatter(FuncFormatter(si))
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    legend_below(ax, h1 + h2, l1 + l2)
    ax.set_title("%s: throughput" % title)
    save(fig, outdir, stem + "-throughput.png", written)

    # freshness
    fig, ax = plt.subplots(figsize=(8, 4.5))
    age = column(rows, "snapshot_age_ms")
    if present(age):
        ax.plot(*finite(t, age), color="tab:green",
                label="snapshot age (p50 %.0f ms, p99 %.0f ms)" % (percentile(age, 50), percentile(age, 99)))
    else:
        ax.text(0.5, 0.5, "no snapshot age in this run", transform=ax.transAxes, ha="center")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("age of the published snapshot (ms)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fill = column(rows, "ring_fill")
    if present(fill):
        ax2 = ax.twinx()
        handles += ax2.plot(*finite(t, fill), color="tab:red", linestyle=":", label="ring fill")
        labels += ["ring fill"]
        ax2.set_ylabel("ring fill")
    if handles:
        legend_below(ax, handles, labels)
    ax.set_title("%s: freshness" % title)
    save(fig, outdir, stem + "-freshness.png", written)
    return written


# ---- bench -------------------------------------------------------------------------------------
def bench_kind(header):
    h = set(header)
    if {"label", "zipf", "k", "dtype", "updates_per_s", "test_rmse"} <= h:
        return "gpu-sgd"
    if {"epoch", "updates_per_s", "train_rmse", "test_rmse"} <= h:
        return "cpu-epochs"
    if {"dataset", "mfstream_test_rmse", "reference", "reference_rmse"} <= h:
        return "accuracy"
    if {"t_s", "rss_mib", "events_applied", "users"} <= h:
        return "id-flood"
    return None


def short_label(label):
    return label.split(" ")[0]


def grouped_bars(ax, groups, series, values, fmt):
    """groups: x labels; series: legend labels; values[(g, s)] -> number (missing: no bar)."""
    n = max(1, len(series))
    width = 0.8 / n
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, g in enumerate(groups):
            v = values.get((g, s))
            if v is not None and not math.isnan(v):
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(v)
        bars = ax.bar(xs, ys, width, label=s)
        for b, y in zip(bars, ys):
            ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom",
                        fontsize=7, rotation=90 if n > 2 else 0, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(groups)))


def plot_gpu(rows, stem, outdir, written):
    from matplotlib.ticker import FuncFormatter
    groups, series = [], []
    ups, rmse = {}, {}
    for r in rows:
        z = num(r["zipf"])
        g = (short_label(r["label"]), z)
        s = "k=%s %s" % (r["k"], r["dtype"])
        if g not in groups:
            groups.append(g)
        if s not in series:
            series.append(s)
        ups[(g, s)] = num(r["updates_per_s"])
        rmse[(g, s)] = num(r["test_rmse"])
    groups.sort(key=lambda g: (g[0], g[1]))
    names = ["%s\nZipf %g" % g if g[1] else "%s\nuniform" % g[0] for g in groups]

    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(groups) + 2), 4.8))
    grouped_bars(ax, groups, series, ups, lambda v: "%.2fG" % (v / 1e9))
    labelled = False
    for i, g in enumerate(groups):
        tgt = GPU_TARGETS.get(round(g[1], 2))
        if tgt:
            ax.hlines(tgt, i - 0.45, i + 0.45, colors="black", linestyles="dashed", linewidth=1,
                      label=None if labelled else "target at k=128")
            labelled = True
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("SGD updates per second")
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    top = max([v for v in ups.values() if not math.isnan(v)] + list(GPU_TARGETS.values()))
    ax.set_ylim(0, top * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=len(series) + 1)
    engine = rows[0].get("engine", "")
    ax.set_title("%s: %s engine throughput" % (stem, engine))
    save(fig, outdir, stem + "-updates.png", written)

    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(groups) + 2), 4.8))
    grouped_bars(ax, groups, series, rmse, lambda v: "%.3f" % v)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("test RMSE")
    vals = [v for v in rmse.values() if not math.isnan(v)]
    if vals:
        ax.set_ylim(0, max(vals) * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=len(series))
    ax.set_title("%s: test RMSE after %s epochs" % (stem, rows[0].get("epochs", "?")))
    save(fig, outdir, stem + "-rmse.png", written)


def plot_cpu_epochs(rows, stem, outdir, written):
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    ep = column(rows, "epoch")
    ups = column(rows, "updates_per_s")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(ep, ups, color="tab:blue", label="updates/s")
    med = percentile(ups, 50)
    ax.axhline(med, color="black", linestyle="--", linewidth=1, label="median %s/s" % si(med))
    ax.set_xlabel("epoch")
    ax.set_ylabel("SGD updates per second")
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("%s: CPU engine throughput per epoch" % stem)
    save(fig, outdir, stem + "-updates.png", written)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in ("train_rmse", "test_rmse"):
        y = column(rows, name)
        if present(y):
            ax.plot(ep, y, marker="o", markersize=3, label=name.replace("_", " "))
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("RMSE")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("%s: RMSE per epoch" % stem)
    save(fig, outdir, stem + "-rmse.png", written)


def plot_accuracy(rows, stem, outdir, written):
    groups = [r["dataset"] for r in rows]
    vals = {}
    refs = []
    for r in rows:
        vals[(r["dataset"], "mfstream")] = num(r["mfstream_test_rmse"])
        ref = "reference (%s)" % r["reference"]
        vals[(r["dataset"], "reference")] = num(r["reference_rmse"])
        refs.append(ref)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(groups) + 2), 4.8))
    grouped_bars(ax, groups, ["mfstream", "reference"], vals, lambda v: "%.3f" % v)
    ax.set_xticklabels(["%s\nvs %s" % (g.replace(", ", "\n", 1).replace(" (", "\n("), r["reference"])
                        for g, r in zip(groups, rows)], fontsize=7)
    ax.set_ylabel("test RMSE (lower is better)")
    top = max(v for v in vals.values() if not math.isnan(v))
    ax.set_ylim(0, top * 1.2)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(["mfstream", "reference: LIBMF, or the planted noise sigma"], fontsize=8, loc="upper right")
    ax.set_title("%s: test RMSE against a reference" % stem)
    save(fig, outdir, stem + "-rmse.png", written)


def plot_id_flood(rows, stem, outdir, written):
    """bench/id_flood.sh: host memory and the user table over time (evictions where counted)."""
    from matplotlib.ticker import FuncFormatter
    t = column(rows, "t_s")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    h1 = ax.plot(t, column(rows, "rss_mib"), color="C0", label="RSS (MiB)")
    if "rss_anon_mib" in rows[0] and present(column(rows, "rss_anon_mib")):
        h1 += ax.plot(t, column(rows, "rss_anon_mib"), color="C0", linestyle="--", label="of it anonymous (MiB)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    h2 = ax2.plot(t, column(rows, "users"), color="C1", label="users in the table")
    handles = h1 + h2
    if "users_evicted" in rows[0] and present(column(rows, "users_evicted")):
        handles += ax2.plot(t, column(rows, "users_evicted"), color="C2", linestyle="--", label="users evicted")
    ax2.plot(t, column(rows, "events_applied"), color="C3", linestyle=":", label="events applied")
    handles = handles + [ax2.lines[-1]]
    ax2.set_ylabel("count")
    ax2.set_ylim(bottom=0)
    ax2.yaxis.set_major_formatter(FuncFormatter(si))
    legend_below(ax, handles, [x.get_label() for x in handles])
    ax.set_title("%s: memory during an id flood" % stem)
    save(fig, outdir, stem + "-rss.png", written)


def plot_bench(path, outdir):
    rows = read_csv(path)
    kind = bench_kind(rows[0].keys())
    stem = os.path.splitext(os.path.basename(path))[0]
    written = []
    if kind == "gpu-sgd":
        plot_gpu(rows, stem, outdir, written)
    elif kind == "cpu-epochs":
        plot_cpu_epochs(rows, stem, outdir, written)
    elif kind == "accuracy":
        plot_accuracy(rows, stem, outdir, written)
    elif kind == "id-flood":
        plot_id_flood(rows, stem, outdir, written)
    else:
        raise UsageError("%s: unknown CSV kind (header %s)" % (path, ",".join(rows[0].keys())))
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(prog="plot.py", description="PNG charts from mfstream CSV files.")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stream", help="a streaming time series CSV")
    s.add_argument("csv")
    s.add_argument("-o", "--outdir", default=".")
    s.add_argument("--title")
    b = sub.add_parser("bench", help="benchmark CSVs from bench/results/")
    b.add_argument("csv", nargs="+")
    b.add_argument("-o", "--outdir", default=".")
    a = ap.parse_args(argv)
    if plt is None:
        print("plot.py: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    os.makedirs(a.outdir, exist_ok=True)
    try:
        if a.what == "stream":
            written = plot_stream(a.csv, a.outdir, a.title)
        else:
            written = []
            for path in a.csv:
                written += plot_bench(path, a.outdir)
    except UsageError as e:
        print("plot.py: %s" % e, file=sys.stderr)
        return 2
    except (OSError, csv.Error, KeyError) as e:
        print("plot.py: %s" % e, file=sys.stderr)
        return 1
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
