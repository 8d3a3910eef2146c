"""Charts as server-rendered SVG: no chart library, no script, fine under a strict CSP.

Every number placed in the markup is formatted here; labels are escaped. A chart covers one
window (15 minutes up to 30 days, ``WINDOWS``) bucket by bucket: a bucket the workers wrote
nothing into (an idle minute) is drawn as zero, never bridged by a line."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence

import attrs
from markupsafe import Markup, escape

from .._core.errors import InvalidArgument
from .._core.timeseries import Point

W, H, PAD_L, PAD_B, PAD_T = 720, 150, 56, 18, 8
MINUTE, HOUR = 60_000, 3_600_000


@attrs.frozen
class Window:
    name: str
    label: str
    buckets: int
    width_ms: int

    @property
    def hours(self) -> bool:
        """Read from the hour buckets (else the minute buckets)."""
        return self.width_ms == HOUR


WINDOWS = (Window("15m", "15 min", 15, MINUTE), Window("1h", "1 hour", 60, MINUTE),
           Window("6h", "6 hours", 360, MINUTE), Window("1d", "1 day", 24, HOUR),
           Window("7d", "7 days", 168, HOUR), Window("30d", "30 days", 720, HOUR))
"""The chart windows: minute buckets up to 6 hours (as long as they are kept), hour buckets
beyond."""
BY_NAME = {w.name: w for w in WINDOWS}


def window(name: str | None) -> Window | None:
    """The window named ``name`` (None: none given, pick one with :func:`auto_window`)."""
    if name is None:
        return None
    if name not in BY_NAME:
        raise InvalidArgument(f"unknown chart range {name!r}; ranges: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def auto_window(points: Sequence[Point], now_ms: int) -> Window:
    """The shortest minute window that holds every minute bucket written: a new queue fills
    its chart instead of showing as a sliver at the right edge."""
    oldest = min((p.t_ms for p in points), default=now_ms)
    for w in WINDOWS:
        if not w.hours and now_ms - oldest < w.buckets * w.width_ms:
            return w
    return BY_NAME["6h"]


@attrs.frozen
class Line:
    label: str
    value: Callable[[Point], float | None]
    css: str


def compact(v: float) -> str:
    """145000 -> '145k', 1500000 -> '1.5M', 12 -> '12': three significant digits at most."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def fmt_value(v: float, unit: str) -> str:
    """An axis label: a count as :func:`compact`, a duration in the unit that reads best."""
    if unit == "ms":
        if v >= 60_000:
            return f"{compact(v / 60_000)} min"
        return f"{compact(v / 1000)} s" if v >= 1000 else f"{compact(v)} ms"
    if unit == "s":
        if v >= 7200:
            return f"{compact(v / 3600)} h"
        return f"{compact(v / 60)} min" if v >= 120 else f"{compact(v)} s"
    return compact(v)


def nice_top(v: float) -> float:
    """The axis top: the smallest 1, 2 or 5 times a power of ten at or above ``v``."""
    if v <= 0:
        return 1
    mag = 10.0 ** math.floor(math.log10(v))
    for m in (1, 2, 5):
        if m * mag >= v * (1 - 1e-9):
            return m * mag
    return 10 * mag


def _time(ms: int, w: Window) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%H:%M" if w.buckets * w.width_ms <= 6 * HOUR else "%m-%d %H:%M")


def filled(points: Sequence[Point], now_ms: int, w: Window) -> list[Point]:
    """One point per bucket of the window, oldest first, up to the current one: a bucket
    nobody wrote is a zero point."""
    by_t = {p.t_ms: p for p in points}
    last = now_ms // w.width_ms * w.width_ms
    first = last - (w.buckets - 1) * w.width_ms
    return [by_t.get(t) or Point(t, 0, 0, None, None, None, None, 0.0)
            for t in range(first, last + 1, w.width_ms)]


def chart(title: str, points: Sequence[Point], lines: Sequence[Line], unit: str,
          start_ms: int, end_ms: int, w: Window) -> Markup:
    """One SVG line chart over [start_ms, end_ms]; a value missing from a bucket is 0."""
    span = max(1, end_ms - start_ms)
    values = [v or 0 for p in points for ln in lines if (v := ln.value(p)) is not None]
    top = nice_top(max(values, default=0))
    plot_w, plot_h = W - PAD_L - 4, H - PAD_B - PAD_T

    def xy(p: Point, v: float) -> str:
        x = PAD_L + max(0, p.t_ms - start_ms) / span * plot_w
        y = PAD_T + plot_h - v / top * plot_h
        return f"{x:.1f},{y:.1f}"

    mid_ms = start_ms + span // 2
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<line class="axis" x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{W - 4}" '
             f'y2="{PAD_T + plot_h}"/>',
             f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + plot_h}"/>',
             f'<line class="grid" x1="{PAD_L}" y1="{PAD_T + plot_h / 2:.1f}" x2="{W - 4}" '
             f'y2="{PAD_T + plot_h / 2:.1f}"/>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + 8}" text-anchor="end">'
             f'{escape(fmt_value(top, unit))}</text>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + plot_h / 2 + 4:.1f}" '
             f'text-anchor="end">{escape(fmt_value(top / 2, unit))}</text>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + plot_h}" text-anchor="end">0</text>',
             f'<text class="tick" x="{PAD_L}" y="{H - 4}">{escape(_time(start_ms, w))}</text>',
             f'<text class="tick" x="{PAD_L + plot_w / 2:.1f}" y="{H - 4}" text-anchor="middle">'
             f'{escape(_time(mid_ms, w))}</text>',
             f'<text class="tick" x="{W - 4}" y="{H - 4}" text-anchor="end">'
             f'{escape(_time(end_ms, w))}</text>']
    for ln in lines:
        seg = [xy(p, ln.value(p) or 0) for p in points]
        if len(seg) == 1:
            x, y = seg[0].split(",")
            parts.append(f'<circle class="{ln.css}" cx="{x}" cy="{y}" r="2"/>')
        elif seg:
            parts.append(f'<polyline class="{ln.css}" points="{" ".join(seg)}"/>')
    parts.append("</svg>")
    legend = " ".join(f'<span class="key {ln.css}">{escape(ln.label)}</span>' for ln in lines)
    return Markup(f'<figure><figcaption>{escape(title)} {legend}</figcaption>'
                  f'{"".join(parts)}</figure>')


def charts(points: Sequence[Point], now_ms: int, w: Window) -> list[Markup]:
    shown = filled(points, now_ms, w)
    start, end = shown[0].t_ms, shown[-1].t_ms  # (the current bucket at the right edge)
    per = "hour" if w.hours else "min"
    return [
        chart(f"Throughput per {per}", shown,
              [Line("completed", lambda p: p.completed, "s1"),
               Line("failed", lambda p: p.failed, "s2")], "", start, end, w),
        chart("Wait time (enqueued to started)", shown,
              [Line("p50", lambda p: p.wait_p50_ms, "s1"),
               Line("p95", lambda p: p.wait_p95_ms, "s3")], "ms", start, end, w),
        chart("Run time", shown,
              [Line("p50", lambda p: p.run_p50_ms, "s1"),
               Line("p95", lambda p: p.run_p95_ms, "s3")], "ms", start, end, w),
        chart("Oldest ready entry (highest seen)", shown,
              [Line("age", lambda p: p.oldest_ready_s, "s4")], "s", start, end, w),
    ]
