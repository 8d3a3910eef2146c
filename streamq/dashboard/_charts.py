"""Charts as server-rendered SVG: no chart library, no script, fine under a strict CSP.

Every number placed in the markup is formatted here; labels are escaped."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

import attrs
from markupsafe import Markup, escape

from .._core.timeseries import Point

W, H, PAD_L, PAD_B, PAD_T = 720, 150, 56, 18, 8


@attrs.frozen
class Line:
    label: str
    value: Callable[[Point], float | None]
    css: str


def _fmt(v: float, unit: str) -> str:
    if unit == "ms" and v >= 1000:
        return f"{v / 1000:,.3g} s"
    if unit == "s" and v >= 120:
        return f"{v / 60:,.3g} min"
    return f"{v:,.4g} {unit}".strip()


def _time(ms: int, hours: bool) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%m-%d %H:00" if hours else "%H:%M")


def chart(title: str, points: Sequence[Point], lines: Sequence[Line], unit: str,
          start_ms: int, end_ms: int, hours: bool) -> Markup:
    """One SVG line chart over [start_ms, end_ms]; a bucket without data breaks a line."""
    span = max(1, end_ms - start_ms)
    values = [v for p in points for ln in lines if (v := ln.value(p)) is not None]
    top = max(values, default=0) or 1
    plot_w, plot_h = W - PAD_L - 4, H - PAD_B - PAD_T

    def xy(p: Point, v: float) -> str:
        x = PAD_L + (p.t_ms - start_ms) / span * plot_w
        y = PAD_T + plot_h - v / top * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<line class="axis" x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{W - 4}" '
             f'y2="{PAD_T + plot_h}"/>',
             f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + plot_h}"/>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + 8}" text-anchor="end">'
             f'{escape(_fmt(top, unit))}</text>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + plot_h}" text-anchor="end">0</text>',
             f'<text class="tick" x="{PAD_L}" y="{H - 4}">{escape(_time(start_ms, hours))}</text>',
             f'<text class="tick" x="{W - 4}" y="{H - 4}" text-anchor="end">'
             f'{escape(_time(end_ms, hours))}</text>']
    for ln in lines:
        segments: list[list[str]] = [[]]
        for p in points:
            v = ln.value(p)
            if v is None:
                if segments[-1]:
                    segments.append([])
                continue
            segments[-1].append(xy(p, v))
        for seg in segments:
            if len(seg) == 1:
                x, y = seg[0].split(",")
                parts.append(f'<circle class="{ln.css}" cx="{x}" cy="{y}" r="2"/>')
            elif seg:
                parts.append(f'<polyline class="{ln.css}" points="{" ".join(seg)}"/>')
    parts.append("</svg>")
    legend = " ".join(f'<span class="key {ln.css}">{escape(ln.label)}</span>' for ln in lines)
    return Markup(f'<figure><figcaption>{escape(title)} {legend}</figcaption>'
                  f'{"".join(parts)}</figure>')


def charts(points: Sequence[Point], now_ms: int, hours: bool) -> list[Markup]:
    width = 3_600_000 if hours else 60_000
    start = now_ms - (720 if hours else 360) * width
    shown = [p for p in points if p.t_ms >= start]
    per = "hour" if hours else "min"
    return [
        chart(f"Throughput per {per}", shown,
              [Line("completed", lambda p: p.completed, "s1"),
               Line("failed", lambda p: p.failed, "s2")], "", start, now_ms, hours),
        chart("Wait time (enqueued to started)", shown,
              [Line("p50", lambda p: p.wait_p50_ms, "s1"),
               Line("p95", lambda p: p.wait_p95_ms, "s3")], "ms", start, now_ms, hours),
        chart("Run time", shown,
              [Line("p50", lambda p: p.run_p50_ms, "s1"),
               Line("p95", lambda p: p.run_p95_ms, "s3")], "ms", start, now_ms, hours),
        chart("Oldest ready entry (highest seen)", shown,
              [Line("age", lambda p: p.oldest_ready_s, "s4")], "s", start, now_ms, hours),
    ]
