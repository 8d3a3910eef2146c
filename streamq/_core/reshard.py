"""Live resharding: change a queue's shard count while producers and workers run
(docs/scaling.md#resharding). Sans-IO operations (driver.py), safe to repeat at any point:

``begin(keys, n, window_s)``
    1. stores ``next = n`` in shard 0's ``meta`` (refused with ReshardInProgress when another
       count has begun);
    2. freezes every shard of both layouts: each shard's ``stats`` gets ``lay = n``, so
       ``enqueue.lua`` refuses a job routed by any other count (``STREAMQ_LAYOUT n``) and
       a producer that still routes by the old count re-reads the layout and resends;
    3. publishes the layout in one HSET: ``shards = n``, the old count pushed onto ``prev``,
       ``prev_until`` = now + ``window_s`` (the longest retention of a record),
       ``live`` = every shard that may hold work, ``epoch`` + 1; then drops ``next``.

    Repeated after it died at any step it finishes the same reshard; repeated after it
    finished it writes nothing. Workers read the shards of ``next`` as soon as it is stored
    (``Layout.read``), so jobs routed by the new count are read at once.

``finish(keys)``
    1. retires each old-only shard (``shards <= i < live``, and the shards of earlier
       counts above ``shards`` while ``prev`` is kept: a repeat deletes what a late writer
       left) that holds no live work, with ``retire.lua``: the check and the delete of one
       shard in one script, so a job that arrives meanwhile is never deleted; job records
       stay until they expire, and the shard's ``lay`` stays (stale producers are refused);
    2. when every old-only shard is retired, sets ``live = shards`` (``relayout.lua``, only
       on the layout it read: a reshard begun meanwhile keeps its live shards);
    3. when server time has passed ``prev_until``, drops ``prev`` and ``prev_until``.

    Safe to repeat at any point; answers the layout. Workers run it about every 5 s while
    ``Layout.read > shards`` or ``prev`` is kept; ``streamq reshard --wait`` runs it too.

Jobs and records are not moved: a job runs in the shard it was written to, and a record
stays there until it expires. Calls by id look in each of ``Layout.homes(id)``; an enqueue
whose id moved home first looks in its old homes (dedup by id stays exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .driver import Call, Cmd, Op, ok
from .errors import InvalidArgument, ReshardInProgress
from .keys import GROUP, MAX_SHARDS, PRIORITIES, Keys
from .shards import (
    EPOCH_FIELD,
    FROZEN_FIELD,
    LIVE_FIELD,
    NEXT_FIELD,
    PREV_FIELD,
    PREV_UNTIL_FIELD,
    SHARDS_FIELD,
    Layout,
    read,
)


def check_count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SHARDS:
        raise InvalidArgument(f"a shard count must be an integer 1..{MAX_SHARDS}, got {n!r}")
    return n


def server_ms() -> Op[int]:
    """The server's time in ms (invariant 8: never a host clock)."""
    (t,) = yield [Cmd.of("TIME")]
    sec, usec = ok(t)
    return int(sec) * 1000 + int(usec) // 1000


def begin(keys: Keys, n: int, window_s: int) -> Op[Layout]:
    """Reshard the queue to ``n`` shards (see the module docstring); answers the layout
    published. Raises ReshardInProgress when a reshard to another count has begun."""
    check_count(n)
    k0 = keys.of_shard(0)
    got = yield from read(keys)
    cur = got or Layout(1)
    if cur.next is not None and cur.next == cur.shards:
        # published; only the drop of 'next' was lost (the publishing HSET is one command)
        (r,) = yield [Cmd.of("HDEL", k0.meta, NEXT_FIELD)]
        ok(r)
        return (yield from begin(keys, n, window_s))
    if cur.next is None and cur.shards == n:
        return cur  # done before (or nothing to do)
    if cur.next is not None and cur.next != n:
        raise ReshardInProgress(keys.queue, n, cur.next)
    if cur.next is None:
        (wrote,) = yield [Cmd.of("HSETNX", k0.meta, NEXT_FIELD, n)]
        if not ok(wrote):  # another driver began meanwhile: its count decides
            return (yield from begin(keys, n, window_s))
        if got is None:  # an unsharded queue: store its count first (as check_layout does)
            (_,) = yield [Cmd.of("HSETNX", k0.meta, SHARDS_FIELD, 1)]
    # 2. freeze every shard of both layouts (and of older ones still live)
    top = max(cur.read, n)
    yield [Cmd.of("HSET", keys.of_shard(i).stats, FROZEN_FIELD, n) for i in range(top)]
    # 3. publish in one HSET, then drop 'next' (a reader that sees next == shards knows)
    now = yield from server_ms()
    prev = (cur.shards, *(p for p in cur.prev if p != cur.shards and p != n))
    (r,) = yield [Cmd.of("HSET", k0.meta, SHARDS_FIELD, n,
                         PREV_FIELD, ",".join(str(p) for p in prev),
                         PREV_UNTIL_FIELD, now + window_s * 1000,
                         LIVE_FIELD, top, EPOCH_FIELD, cur.epoch + 1)]
    ok(r)
    (r,) = yield [Cmd.of("HDEL", k0.meta, NEXT_FIELD)]
    ok(r)
    done = yield from read(keys)
    assert done is not None
    return done


@attrs.frozen
class Retired:
    """What ``finish`` found on one old-only shard."""

    shard: int
    retired: bool
    """Deleted (now or before): it held no live work."""
    busy_key: str = ""
    """The first live-work key found non-empty (while not retired)."""
    busy_size: int = 0


def live_work_keys(k: Keys) -> list[str]:
    """The keys of one shard that hold live work (retire.lua's check): every level's ready
    stream (ready and in-flight entries, its group's pending list), delayed jobs, dead
    letters, group wait lists and in-flight slots, workflow jobs waiting and their outbox."""
    return [k.stream_level(p) for p in PRIORITIES] + [
        k.delayed, k.dead, k.group_wait, k.group_inflight, k.waiting, k.outbox]


def other_keys(k: Keys, consumers: list[str], types: list[str], inboxes: Sequence[str] = ()
               ) -> list[str]:
    """The shard's other non-record keys (deleted by retire.lua besides ``live_work_keys``
    and ``stats``): its workers' per-consumer keys, the hand-off inboxes its tickets name
    (by token prefix; an inbox without a ticket expires within a minute) and its job types'
    search index too."""
    out = [k.tickets, k.rate, k.levels, k.events, k.lease_seq, k.paused, k.workers, k.types,
           k.series_minutes, k.series_hours, k.group_index, k.group_config, k.group_tat,
           k.group_parked, k.recent, k.ix_all, k.ix_ids, k.ix_ew, k.ix_ewl]
    for c in consumers:
        out.append(k.worker_info(c))
        out.extend(k.at_level(p).finished(c) for p in PRIORITIES)
    out.extend(k.ix_type(t) for t in types)
    out.extend(k.inbox(p) for p in inboxes)
    return out


def old_only(lay: Layout) -> range:
    """The shards ``finish`` retires: above ``shards`` up to ``live`` (old shards of a
    reshard down), and up to the largest count still in ``prev`` (retired ones, swept
    again)."""
    return range(lay.shards, max(lay.live, *lay.prev, lay.shards))


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def retire(keys: Keys, shards: range, count: int) -> Op[list[Retired]]:
    """Retire each of ``shards`` that holds no live work (retire.lua), one step for all;
    ``count``: the layout's shard count (a shard frozen for another count is kept)."""
    if not shards:
        return []
    parts = [keys.of_shard(i) for i in shards]
    # the job types published by workers (shard 0's types HASH) name the type indexes
    reads = yield [Cmd.of("HKEYS", keys.of_shard(0).types), *(
        c for k in parts for c in (Cmd.of("ZRANGE", k.workers, 0, -1),
                                   Cmd.of("ZRANGE", k.tickets, 0, -1)))]
    types = sorted(_s(t) for t in ok(reads[0]))
    calls: list[Cmd | Call] = []
    for n, k in enumerate(parts):
        consumers = sorted(_s(c) for c in ok(reads[1 + 2 * n]))
        # a ticket: '<record key prefix>|<inbox key>|<token prefix>|...' (ticket.lua)
        tickets = [_s(t).split("|") for t in ok(reads[2 + 2 * n])]
        inboxes = sorted({t[2] for t in tickets if len(t) > 2 and t[2].isalnum()})
        live = live_work_keys(k)
        calls.append(Call("retire", [*live, k.stats,
                                     *other_keys(k, consumers, types, inboxes)],
                          [GROUP, len(live), count]))
    replies = yield calls
    out = []
    for k, r in zip(parts, replies, strict=True):
        r = ok(r)
        if _s(r[0]) == "retired":
            out.append(Retired(k.shard, True))
        elif _s(r[0]) == "moved":  # a reshard begun since froze it: not ours to delete
            out.append(Retired(k.shard, False, k.stats, 0))
        else:
            live = live_work_keys(k)
            out.append(Retired(k.shard, False, live[int(r[1]) - 1], int(r[2])))
    return out


def finish(keys: Keys) -> Op[Layout]:
    """Retire the old-only shards that hold no live work, then set ``live = shards`` when
    all are gone and drop ``prev`` when its time has passed (see the module docstring).
    Answers the layout after it; a reshard not yet published (``next``) is left to
    ``begin`` (nothing is done)."""
    lay = yield from read(keys)
    if lay is None or lay.next is not None or not lay.stored:
        return lay or Layout(1)
    done = yield from retire(keys, old_only(lay), lay.shards)
    all_gone = all(r.retired for r in done if r.shard < lay.live)
    if lay.live == lay.shards and not lay.prev:
        return lay
    (r,) = yield [Call("relayout", [keys.of_shard(0).meta],
                       [lay.epoch, "1" if all_gone and lay.live > lay.shards else "0"])]
    ok(r)
    after = yield from read(keys)
    assert after is not None
    return after


@attrs.frozen
class OldShard:
    """Live work left on one old-only shard of a reshard down (it is deleted when all of it
    is gone: dead letters must be re-driven or purged first)."""

    shard: int
    ready: int
    in_flight: int
    delayed: int
    waiting: int
    """Workflow jobs waiting for their dependencies, and grouped jobs waiting for a slot."""
    dead: int

    @property
    def total(self) -> int:
        return self.ready + self.in_flight + self.delayed + self.waiting + self.dead


@attrs.frozen
class ReshardStatus:
    """Where a queue's reshard stands (``Admin.reshard_status``)."""

    queue: str
    shards: int
    """The count new jobs are routed by."""
    live: int
    """Shards 0 .. live-1 may hold live work (old shards of a reshard down until deleted)."""
    next: int | None
    """A reshard to this count has begun and is not published yet."""
    prev: tuple[int, ...]
    """Earlier counts whose homes may still hold records (calls by id look there)."""
    prev_until_ms: int
    """Server time (ms) when ``prev`` is forgotten (0: none kept)."""
    epoch: int
    """How many reshards the queue has had."""
    old: tuple[OldShard, ...] = ()
    """The old-only shards (``shards`` .. ``live``-1) and what each still holds."""

    @property
    def done(self) -> bool:
        """The reshard is published and its old shards are drained and deleted."""
        return self.next is None and self.live == self.shards

    def lines(self) -> list[str]:
        """The status as text (the CLI prints it)."""
        out = [f"queue {self.queue}: {self.shards} shards (epoch {self.epoch})"]
        if self.next is not None:
            out.append(f"  reshard to {self.next} begun, not published yet")
        if self.live > self.shards:
            out.append(f"  old shards {self.shards}..{self.live - 1} draining:")
            for o in self.old:
                out.append(f"    shard {o.shard}: ready {o.ready}, in flight {o.in_flight},"
                           f" delayed {o.delayed}, waiting {o.waiting}, dead {o.dead}"
                           + ("  (deleted at the next finish)" if not o.total else ""))
            if any(o.dead for o in self.old):
                out.append("    dead letters keep an old shard: re-drive or purge them")
        elif self.next is None:
            out.append("  no old shards left")
        if self.prev:
            out.append(f"  earlier counts {','.join(map(str, self.prev))} kept for calls by"
                       f" id until server time {self.prev_until_ms} ms")
        return out
