"""The report's summary table (plain text, also valid Markdown)."""

from __future__ import annotations

import collections
from typing import Any


def render(rep: dict[str, Any]) -> str:
    """The summary table (plain text, also valid Markdown)."""
    lines = [f"streamq chaos run: seed {rep['seed']}, {rep['minutes']:g} min of faults,"
             f" wall time {rep['timing'].get('total_s', 0):.0f} s"
             f" (drain {rep['timing'].get('drain_s', 0):.0f} s)", ""]
    lines += ["| kind | accepted | completed | failed | executions | duplicates |",
              "|---|---:|---:|---:|---:|---:|"]
    tot = collections.Counter[str]()
    for kind, row in rep["jobs"].items():
        cells = [row.get("accepted", 0), row.get("completed", 0), row.get("failed", 0),
                 row.get("executions", 0), row.get("duplicates", 0)]
        tot.update(dict(zip(("a", "c", "f", "e", "d"), cells, strict=True)))
        lines.append(f"| {kind} | " + " | ".join(f"{c:,}" for c in cells) + " |")
    lines.append(f"| **all** | {tot['a']:,} | {tot['c']:,} | {tot['f']:,} | {tot['e']:,} |"
                 f" {tot['d']:,} |")
    lines += ["", "| fault injected | count |", "|---|---:|"]
    lines += [f"| {f} | {n} |" for f, n in rep["faults"].items()]
    lines += ["", "| liveness check | bound (healthy s) | checked | over the bound | worst (s) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {c['bound_s']:g} | {c['checked']:,} | {c['violations']:,} |"
              f" {c['worst_s']:g} |" for name, c in rep.get("liveness_checks", {}).items()]
    cause = ", ".join(f"{w} {n}" for w, n in rep["duplicates_by_cause"].items() if n)
    st = rep["stats"]
    lines += ["", f"- duplicates (executions whose outcome was discarded or never settled):"
              f" {rep['duplicates']:,} ({cause or 'none'})",
              f"- attempts counted but never executed (lost start replies, deaths before the"
              f" handler began): {rep['skipped_attempts']:,}",
              f"- lease_lost {st.get('lease_lost', 0):,}, reclaimed {st.get('reclaimed', 0):,},"
              f" producer re-sends {rep['producer_resends']}, stalls seen"
              f" {rep['stalls_seen']}",
              f"- final consumers {rep['consumers']['final']} ({rep['consumers']['started']}"
              f" worker names started); liveness probes:"
              f" {sum(1 for x in rep['liveness'].values() if x == 'ok')} of"
              f" {len(rep['liveness'])} processes ok",
              f"- stream {rep['keyspace']['stream_len']}, PEL {rep['keyspace']['pel']},"
              f" delayed {rep['keyspace']['delayed']}, dead {rep['keyspace']['dead_len']}",
              f"- **lost = {rep['lost']}**, wrong terminal state = {rep['wrong_state']}"
              " (a dead letter nothing explains is one)",
              f"- dead letters {rep['dead_letters']['total']:,}, every one explained: "
              + (", ".join(f"{why} {n:,}" for why, n in
                           sorted(rep["dead_letters"]["by_reason"].items())) or "none"),
              "- graceful stops (signal to exit or to the new worker, longest): "
              + (", ".join(f"{k} {g['count']} ({g['max_s']:g} s)"
                           for k, g in rep.get("graceful", {}).items()) or "none"),
              f"- checks: {'all passed' if rep.get('ok') else 'FAILED'}"]
    lines += [f"  - {f}" for f in rep["failures"]]
    return "\n".join(lines)
