# mypy: ignore-errors
"""Chart of benchmarks/results/peers.json (run with the plot venv's python: matplotlib)."""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

with open(sys.argv[1]) as f:
    doc = json.load(f)
res = doc["results"]


def med(runs, key):
    xs = [r[key] for r in runs or [] if isinstance(r.get(key), (int, float))]
    return statistics.median(xs) if xs else 0.0


peers = [p for p in res if "install" not in res[p]]
panels = [("drain1", "per_s", "no-op drain, 1 worker process (jobs/s)"),
          ("drain2", "per_s", "no-op drain, 2 worker processes (jobs/s)"),
          ("io", "per_s", "10 ms I/O jobs, concurrency 100 (jobs/s)"),
          ("latency", "rtt_p50_ms", "enqueue → result available, p50 (ms, log)")]
fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
for ax, (wk, key, title) in zip(axes.flat, panels, strict=True):
    vals = [med(res[p].get(wk), key) for p in peers]
    colors = ["#d62728" if p == "streamq" else "#4c72b0" for p in peers]
    ax.barh(peers, vals, color=colors)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=11)
    if key.endswith("_ms"):
        ax.set_xscale("log")
    ax.margins(x=0.18)
    left = ax.get_xlim()[0]
    for y, v in enumerate(vals):
        if v == 0:
            ax.text(left, y, " failed / not measured", va="center", fontsize=8, color="gray")
        else:
            ax.text(v, y, f" {v:,.1f}" if key.endswith("_ms") else f" {v:,.0f}",
                    va="center", fontsize=8)
m = doc["machine"]
fig.suptitle(f"streamq vs peers — {m['cores']} cores, Redis {m['redis_server']},"
             f" {m['timestamp']} (higher is better except latency)", fontsize=12)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
