"""Sharded queues over the sans-IO operations: the stored shard count and whole-queue views.

A queue of ``QueueConfig.shards`` = N is N key sets (``keys.shard_keys``); each operation in
``operations.py`` works on one of them. The operations here run those per shard (one step
per shard at a time, so every step stays inside one slot) and add the answers up; the
admin API calls them for the whole queue and the per-shard ones for ``shard=``.

Paged listings over all shards walk the shards in order: the cursor is
``'<shard>:<cursor in that shard>'``, so a page never mixes the order of two shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._core.config import QueueConfig
from .._core.driver import Op
from .._core.errors import InvalidArgument, UnknownQueue
from .._core.keys import Keys, check_job_id, shard_keys
from .._core.locate import locate, locate_many
from .._core.shards import Layout, check_layout
from . import browse as _browse
from . import flows as _flows
from . import operations as _ops
from .operations import DeadEntry, DeadFilter, LevelStats, Page, QueueStats

T = TypeVar("T")
LAYOUT_FRESH_S = 1.0
"""How long a whole-queue call trusts the layout an earlier one read (a reshard adds or
retires shards; workers follow it about as fast)."""
def select(keys: Keys, cfg: QueueConfig, shard: int | None, read: int | None = None
           ) -> list[Keys]:
    """Every shard's keys (``shard`` None), or the one asked for: the ``read`` shards of the
    stored layout (``Layout.read``: every shard that may hold live work, also the old ones
    of a reshard down), by default the configured count."""
    n = cfg.shards if read is None else read
    if shard is None:
        return shard_keys(keys.queue, n, keys.prefix)
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
        raise InvalidArgument(f"shard must be 0..{n - 1} for queue {keys.queue!r}"
                              f" (shards={n}), got {shard!r}")
    return [keys.of_shard(shard)]


def stats(parts: Sequence[Keys]) -> Op[QueueStats]:
    """One shard's stats, or the sum over several (paused if any shard is; the oldest ready
    age is the largest). Shards without keys yet count as empty; UnknownQueue only when
    no shard has any key."""
    found: list[QueueStats] = []
    for k in parts:
        try:
            found.append((yield from _ops.stats(k)))
        except UnknownQueue:
            if len(parts) == 1:
                raise
    if not found:
        raise UnknownQueue(f"queue {parts[0].queue!r} does not exist (no keys under"
                           f" {parts[0].base} or its other shards)")
    if len(found) == 1:
        return found[0]
    counters: dict[str, int] = {}
    for s in found:
        for name, v in s.counters.items():
            counters[name] = counters.get(name, 0) + v
    ages = [s.oldest_ready_age_s for s in found if s.oldest_ready_age_s is not None]
    waits = [s.oldest_waiting_age_s for s in found if s.oldest_waiting_age_s is not None]

    def total(field: str) -> int:
        return sum(int(getattr(s, field)) for s in found)

    return QueueStats(
        queue=parts[0].queue, ready=total("ready"), pending=total("pending"),
        scheduled=total("scheduled"), retrying=total("retrying"), dead=total("dead"),
        consumers=max(s.consumers for s in found),
        workers_alive=max(s.workers_alive for s in found),
        paused=any(s.paused for s in found), oldest_ready_age_s=max(ages) if ages else None,
        counters=counters, group_waiting=total("group_waiting"),
        group_in_flight=total("group_in_flight"), groups=total("groups"),
        levels=_levels(found), waiting=total("waiting"),
        oldest_waiting_age_s=max(waits) if waits else None)


def _levels(found: Sequence[QueueStats]) -> dict[int, LevelStats]:
    """Per-level stats of every shard, added up (the oldest age: the oldest of any shard)."""
    out: dict[int, LevelStats] = {}
    for s in found:
        for p, v in s.levels.items():
            o = out.get(p)
            if o is None:
                out[p] = v
                continue
            ages = [a for a in (o.oldest_ready_age_s, v.oldest_ready_age_s) if a is not None]
            out[p] = LevelStats(ready=o.ready + v.ready, pending=o.pending + v.pending,
                                oldest_ready_age_s=max(ages) if ages else None)
    return dict(sorted(out.items(), reverse=True))


def _cursor(parts: Sequence[Keys], cursor: str | None) -> tuple[int, str | None]:
    if not cursor or len(parts) == 1:
        return 0, cursor or None
    shard, _, inner = cursor.partition(":")
    if not shard.isdigit() or int(shard) >= len(parts):
        raise InvalidArgument(f"invalid cursor {cursor!r} for a queue of {len(parts)} shards")
    return int(shard), inner or None


def paged(parts: Sequence[Keys], cursor: str | None, limit: int,
          one: Any) -> Op[Page]:
    """A listing over shards in order: ``one(keys, cursor, limit)`` is the per-shard Op."""
    if len(parts) == 1:
        page: Page = yield from one(parts[0], cursor, limit)
        return page
    at, inner = _cursor(parts, cursor)
    items: list[Any] = []
    while at < len(parts):
        page = yield from one(parts[at], inner, limit - len(items))
        items.extend(page.items)
        if page.cursor is not None:
            return Page(items, f"{at}:{page.cursor}")
        at, inner = at + 1, None
        if len(items) >= limit:
            return Page(items, f"{at}:" if at < len(parts) else None)
    return Page(items, None)


def check_cursor(cursor: str | None, shards: int) -> str | None:
    """A listing cursor given by a user: a stream id (``1700-0``, or ``p<level>:1700-0`` in
    another priority level's stream), or for a sharded queue ``'<shard>:'`` or
    ``'<shard>:<that>'``; InvalidArgument else."""
    if cursor is None or shards == 1:
        _browse.check_stream_id(_ops.split_cursor(cursor)[1])  # 'p<level>:<id>' at a level
        return cursor
    shard, sep, inner = cursor.partition(":")
    if not sep or not shard.isdigit() or int(shard) >= shards:
        raise InvalidArgument(f"invalid cursor {cursor!r}: expected '<shard>:<stream id>'")
    _browse.check_stream_id(_ops.split_cursor(inner or None)[1])
    return cursor


def pending(parts: Sequence[Keys], *, min_idle_s: float = 0, consumer: str | None = None,
            count: int = 100, cursor: str | None = None) -> Op[Page]:
    def one(k: Keys, c: str | None, n: int) -> Op[Page]:
        return _ops.pending(k, min_idle_s=min_idle_s, consumer=consumer, count=n, cursor=c)
    return (yield from paged(parts, cursor, count, one))


def dead_list(parts: Sequence[Keys], flt: DeadFilter, *, limit: int = 100,
              cursor: str | None = None, oldest_first: bool = False) -> Op[Page]:
    def one(k: Keys, c: str | None, n: int) -> Op[Page]:
        return _ops.dead_list(k, flt, limit=n, cursor=c, oldest_first=oldest_first)
    return (yield from paged(parts, cursor, limit, one))


def redrive(keys: Keys, cfg: QueueConfig, entries: Sequence[DeadEntry], who: str,
            layout: Layout | None = None) -> Op[dict[str, int]]:
    """Each entry re-driven in the shard where it died: the one it was listed from
    (``DeadEntry.shard``), else the one that holds its job's record (``locate``; ``layout``:
    the queue's). A job back from an old shard of a reshard down runs there: workers read
    every live shard (``Layout.live``) until it is drained."""
    by: dict[int, list[DeadEntry]] = {}
    unknown = [e for e in entries if e.shard is None]
    found = yield from locate_many(keys, layout or Layout(cfg.shards),
                                   [e.job_id or "-" for e in unknown])
    at = {id(e): k.shard for e, k in zip(unknown, found, strict=True)}
    for e in entries:
        by.setdefault(e.shard if e.shard is not None else at[id(e)], []).append(e)
    total: dict[str, int] = {}
    for shard, part in sorted(by.items()):
        got = yield from _ops.redrive(keys.of_shard(shard), cfg, part, who)
        for name, v in got.items():
            total[name] = total.get(name, 0) + v
    return total


def purge(parts: Sequence[Keys], cfg: QueueConfig, state: str, max_jobs: int) -> Op[int]:
    n = 0
    for k in parts:
        if n >= max_jobs:
            break
        n += yield from _ops.purge(k, cfg, state, max_jobs=max_jobs - n)
    return n


def set_paused(parts: Sequence[Keys], paused: bool) -> Op[None]:
    """Every shard's paused flag (each shard's start.lua reads its own, in its slot)."""
    for k in parts:
        yield from _ops.set_paused(k, paused)


def exists(parts: Sequence[Keys]) -> Op[bool]:
    for k in parts:
        if (yield from _ops.exists(k)):
            return True
    return False


def _given(parts: list[Keys]) -> Op[list[Keys]]:
    """The keys themselves, as an Op (no command: the guard before it is the point)."""
    if not parts:
        yield []
    return parts


class QueueOps:
    """The admin API's operations over whole (possibly sharded) queues, built once for the
    sync and the async driver: each checks the queue's stored shard count on its first use
    by this object (ShardCountMismatch), then runs over every shard, the one ``shard``
    asked for, or (by job id) the shard that holds the job."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self._layouts: dict[str, tuple[Layout, float]] = {}
        """The layout each queue had when last read, and when (monotonic): read again by a
        call more than ``LAYOUT_FRESH_S`` later (a reshard may have begun since)."""

    def _k(self, queue: str) -> Keys:
        return Keys(queue, self.config.key_prefix)

    def guard(self, queue: str, make: Callable[[Keys], Op[T]]) -> Op[T]:
        k = self._k(queue)
        got = self._layouts.get(queue)
        if got is None or time.monotonic() - got[1] > LAYOUT_FRESH_S:
            lay = yield from check_layout(k, self.config.shards)
            self._layouts[queue] = (lay, time.monotonic())
        return (yield from make(k))

    def layout(self, queue: str) -> Layout:
        """The layout read by the last guarded call on ``queue``."""
        got = self._layouts.get(queue)
        return got[0] if got is not None else Layout(self.config.shards)

    def parts(self, queue: str, shard: int | None, make: Callable[[list[Keys]], Op[T]]
              ) -> Op[T]:
        return self.guard(queue, lambda k: make(select(k, self.config, shard,
                                                       self.layout(queue).read)))

    def by_id(self, queue: str, job_id: str, make: Callable[[Keys], Op[T]]) -> Op[T]:
        """``make`` over the keys of the shard that holds the job: after a reshard, its home
        under an earlier count when it was written before (``locate``: no command for an id
        that never moved)."""
        check_job_id(job_id)

        def run(k: Keys) -> Op[T]:
            at = yield from locate(k, self.layout(queue), job_id)
            return (yield from make(at))
        return self.guard(queue, run)

    def flow(self, k: Keys, job_id: str, cursor: str | None, limit: int) -> Op[_flows.FlowView]:
        """A job's flow view (``k``: its shard, located), with its queue's layout at hand."""
        return _flows.flow(k, self.config.shards, job_id, cursor, limit,
                           {k.queue: self.layout(k.queue)})

    def shard_keys(self, queue: str) -> Op[list[Keys]]:
        """Every shard's keys, after the stored shard count was checked."""
        return self.parts(queue, None, _given)

    def stats(self, queue: str, shard: int | None) -> Op[QueueStats]:
        return self.parts(queue, shard, stats)

    def pending(self, queue: str, shard: int | None, **kw: Any) -> Op[Page]:
        return self.parts(queue, shard, lambda ps: pending(ps, **kw))

    def dead(self, queue: str, shard: int | None, flt: DeadFilter, **kw: Any) -> Op[Page]:
        return self.parts(queue, shard, lambda ps: dead_list(ps, flt, **kw))

    def redrive(self, queue: str, entries: Sequence[DeadEntry], who: str
                ) -> Op[dict[str, int]]:
        return self.guard(queue, lambda k: redrive(k, self.config, entries, who,
                                                   self.layout(queue)))

    def purge(self, queue: str, shard: int | None, state: str, max_jobs: int) -> Op[int]:
        return self.parts(queue, shard, lambda ps: purge(ps, self.config, state, max_jobs))

    def set_paused(self, queue: str, paused: bool) -> Op[None]:
        return self.parts(queue, None, lambda ps: set_paused(ps, paused))

    def listing(self, queue: str, shard: int | None, cursor: str | None, limit: int,
                one: Callable[[Keys, str | None, int], Op[Page]]) -> Op[Page]:
        return self.parts(queue, shard, lambda ps: paged(ps, cursor, limit, one))

    def concat(self, queue: str, shard: int | None, one: Callable[[Keys], Op[list[T]]]
               ) -> Op[list[T]]:
        def run(ps: list[Keys]) -> Op[list[T]]:
            out: list[T] = []
            for k in ps:
                out.extend((yield from one(k)))
            return out
        return self.parts(queue, shard, run)

    def count_dead(self, queue: str, shard: int | None, flt: DeadFilter
                   ) -> Op[tuple[int, bool]]:
        def run(ps: list[Keys]) -> Op[tuple[int, bool]]:
            n, exact = 0, True
            for k in ps:
                c, e = yield from _browse.count_dead(k, flt)
                n, exact = n + c, exact and e
            return n, exact
        return self.parts(queue, shard, run)
