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

Jobs and records are not moved: a job runs in the shard it was written to, and a record
stays there until it expires. Calls by id look in each of ``Layout.homes(id)``; an enqueue
whose id moved home first looks in its old homes (dedup by id stays exact).
"""

from __future__ import annotations

from .driver import Cmd, Op, ok
from .errors import InvalidArgument, ReshardInProgress
from .keys import MAX_SHARDS, Keys
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
