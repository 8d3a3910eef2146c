"""A bounded per-queue time series, written by the workers, read by the dashboard's charts.

Workers count outcomes in memory (``SeriesRecorder.observe``: no I/O) and add them to Redis
with one ``timeseries.lua`` call per queue every ``flush`` (every 10 s or so): completed and
failed counts, wait time (enqueued -> started) and run time (started -> finished) histograms,
and the oldest ready entry's age, which the script reads itself. Minute buckets are kept for
6 hours and rolled up into hour buckets kept for 30 days: at most 360 + 720 hash fields per
queue, each at most about 550 bytes (every histogram bucket in use): under 600 KB per queue
in the worst case, measured by tests/test_timeseries.py; a queue with steady, similar jobs
uses a fraction of that. Nothing lives in the
dashboard's memory, so charts survive its restarts; several workers add to the same buckets.

Percentiles come from the histograms: an upper bucket bound (1, 2, 5, 10, 20, 50 ... ms), so
within a factor of 2-2.5 of the true value.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import attrs
import redis.asyncio as aredis

from .keys import GROUP, Keys
from .scripts import Script

BOUNDS_MS: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000,
                              10_000, 30_000, 60_000, 120_000, 300_000, 600_000)
"""Histogram bucket upper bounds; bucket len(BOUNDS_MS) holds everything slower."""
KEEP_MINUTES = 360
KEEP_HOURS = 720


def _load() -> Script:
    pkg = resources.files("streamq") / "lua"
    return Script("timeseries", (pkg / "_lib.lua").read_text() + "\n"
                  + (pkg / "timeseries.lua").read_text())


SCRIPT = _load()


_bisect_left = bisect.bisect_left
_EDGES: tuple[tuple[float, float], ...] = tuple(
    (float(BOUNDS_MS[b - 1]) if b else -1.0,
     float(BOUNDS_MS[b]) if b < len(BOUNDS_MS) else float("inf"))
    for b in range(len(BOUNDS_MS) + 1))
"""Each bucket's range of values (lo, hi] (bucket 0 from -1: every value >= 0 observed)."""
_NO_COUNTS: list[int] = []


def bucket(ms: float) -> int:
    return bisect.bisect_left(BOUNDS_MS, ms)


@attrs.define
class _Acc:
    completed: int = 0
    failed: int = 0
    wait: dict[int, int] = attrs.Factory(dict)
    run: dict[int, int] = attrs.Factory(dict)

    def args(self) -> list[str | int]:
        def h(d: dict[int, int]) -> str:
            return ",".join(f"{k}:{v}" for k, v in sorted(d.items()))

        return [self.completed, self.failed, h(self.wait), h(self.run)]

    def add(self, other: _Acc) -> None:
        self.completed += other.completed
        self.failed += other.failed
        for mine, theirs in ((self.wait, other.wait), (self.run, other.run)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v


class SeriesRecorder:
    """Per-queue outcome counts in a worker's memory, added to Redis by :meth:`flush`.

    The worker calls ``observe`` once per settled job and ``await flush(client, keys_of)``
    on a timer (and once when it stops). A flush that fails keeps its counts for the next
    one; a flush whose reply is lost after the script ran counts twice (these are charts)."""

    def __init__(self, queues: Sequence[str] = ()) -> None:
        self._acc: dict[str, _Acc] = {q: _Acc() for q in queues}

    def observe(self, queue: str, completed: bool, wait_ms: float | None = None,
                run_ms: float | None = None) -> None:
        """One job settled: completed, or dead-lettered (``completed=False``). (Positional
        arguments too: a worker calls it once per job.)"""
        acc = self._acc.get(queue)
        if acc is None:  # (setdefault would build an _Acc per call)
            acc = self._acc[queue] = _Acc()
        if completed:
            acc.completed += 1
        else:
            acc.failed += 1
        if wait_ms is not None and wait_ms >= 0:
            b = _bisect_left(BOUNDS_MS, wait_ms)  # (bucket(), inline: once per job)
            acc.wait[b] = acc.wait.get(b, 0) + 1
        if run_ms is not None and run_ms >= 0:
            b = _bisect_left(BOUNDS_MS, run_ms)
            acc.run[b] = acc.run.get(b, 0) + 1

    def observe_many(self, seen: Sequence[tuple[str, bool, float | None, float | None]]
                     ) -> None:
        """``observe`` for each (queue, completed, wait_ms, run_ms), in one call (a worker's
        batch of attempts): counted in lists first, a bucket looked up only when a value
        leaves the last one's range (a batch's values mostly share their buckets)."""
        accs = self._acc
        bl, bounds, top = _bisect_left, BOUNDS_MS, len(BOUNDS_MS)
        edges = _EDGES
        by_queue: dict[str, tuple[list[int], list[int], list[int]]] = {}
        last_q: str | None = None
        counts = waits = runs = _NO_COUNTS  # (rebound at the first queue)
        w_lo = w_hi = r_lo = r_hi = 0.0  # the last buckets' ranges (lo, hi]: none yet
        wb = rb = 0
        for queue, completed, wait_ms, run_ms in seen:
            if queue != last_q:
                got = by_queue.get(queue)
                if got is None:
                    got = by_queue[queue] = ([0, 0], [0] * (top + 1), [0] * (top + 1))
                counts, waits, runs = got
                last_q = queue
            counts[completed] += 1  # [failed, completed]
            if wait_ms is not None and wait_ms >= 0:
                if not w_lo < wait_ms <= w_hi:
                    wb = bl(bounds, wait_ms)
                    w_lo, w_hi = edges[wb]
                waits[wb] += 1
            if run_ms is not None and run_ms >= 0:
                if not r_lo < run_ms <= r_hi:
                    rb = bl(bounds, run_ms)
                    r_lo, r_hi = edges[rb]
                runs[rb] += 1
        for queue, (counts, waits, runs) in by_queue.items():
            acc = accs.get(queue)
            if acc is None:
                acc = accs[queue] = _Acc()
            acc.completed += counts[1]
            acc.failed += counts[0]
            for hist, got_n in ((acc.wait, waits), (acc.run, runs)):
                for b, n in enumerate(got_n):
                    if n:
                        hist[b] = hist.get(b, 0) + n

    def take(self, keys_of: Callable[[str], Keys]
             ) -> list[tuple[str, list[str], list[Any], _Acc]]:
        """The script calls a flush makes, one per queue (also with nothing observed: the
        oldest-ready age is sampled each time). Sans-IO: the counts move out of the
        recorder; :meth:`give_back` returns those of a call that failed."""
        out = []
        for queue in list(self._acc):
            acc, self._acc[queue] = self._acc[queue], _Acc()
            k = keys_of(queue)
            out.append((queue, [k.series_minutes, k.series_hours, k.stream],
                        [GROUP, KEEP_MINUTES, KEEP_HOURS, *acc.args()], acc))
        return out

    def give_back(self, queue: str, acc: _Acc) -> None:
        self._acc.setdefault(queue, _Acc()).add(acc)

    async def flush(self, client: aredis.Redis, keys_of: Callable[[str], Keys]) -> None:
        """Add every queue's counts since the last flush (one script call per queue); on an
        error the counts not written stay for the next flush and the error is raised."""
        calls = self.take(keys_of)
        for n, (_queue, keys, args, _acc) in enumerate(calls):
            try:
                await SCRIPT.run_async(client, keys, args)
            except BaseException:
                for q, _k, _a, a in calls[n:]:
                    self.give_back(q, a)
                raise


def bucket_json(completed: int, failed: int, wait: Mapping[int, int], run: Mapping[int, int],
                oldest_ms: int = 0) -> str:
    """One bucket in the form timeseries.lua writes (``wait``/``run``: histogram bucket index
    -> count): what ``streamq demo --web`` writes as its simulated history."""
    b: dict[str, Any] = {"c": completed, "f": failed, "o": oldest_ms}
    for name, hist in (("w", wait), ("r", run)):
        if hist:
            b[name] = {str(k): v for k, v in sorted(hist.items())}
    return json.dumps(b, separators=(",", ":"))


# ------------------------------------------------------------------ reading


@attrs.frozen
class Point:
    t_ms: int
    """Start of the bucket (minute or hour)."""
    completed: int
    failed: int
    wait_p50_ms: int | None
    wait_p95_ms: int | None
    run_p50_ms: int | None
    run_p95_ms: int | None
    oldest_ready_s: float


def percentile(hist: dict[str, Any], q: float) -> int | None:
    """The upper bound of the bucket holding the q-quantile (None without samples)."""
    counts = sorted((int(k), int(v)) for k, v in hist.items()
                    if str(k).isdigit() and isinstance(v, int | float))
    total = sum(v for _, v in counts)
    if total <= 0:
        return None
    seen = 0
    for idx, v in counts:
        seen += v
        if seen >= q * total:
            return BOUNDS_MS[idx] if idx < len(BOUNDS_MS) else BOUNDS_MS[-1] * 2
    return None


def decode(field: Any, raw: Any, width_ms: int) -> Point | None:
    try:
        start = int(field) * width_ms
        b = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if not isinstance(b, dict):
        return None
    w: dict[str, Any] = b["w"] if isinstance(b.get("w"), dict) else {}
    r: dict[str, Any] = b["r"] if isinstance(b.get("r"), dict) else {}
    return Point(start, int(b.get("c") or 0), int(b.get("f") or 0), percentile(w, 0.5),
                 percentile(w, 0.95), percentile(r, 0.5), percentile(r, 0.95),
                 float(b.get("o") or 0) / 1000)
