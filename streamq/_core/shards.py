"""The shard layout stored with a queue, read and checked by every part that opens one
(producer, worker, scheduler, spark, the admin API) before it writes (docs/scaling.md).

Shard 0's ``meta`` HASH holds the layout:

- ``shards``: the count new jobs are routed by (``shard_of(id, shards)``). A queue with keys
  and no stored count has 1 shard (the layout before sharding); a 1-shard queue that was
  never resharded never writes the key.
- ``next``: a reshard to that count has begun and is not published yet (its old shards are
  being frozen). Anyone who meets it may finish it (``reshard.begin`` is safe to repeat).
- ``prev``: the counts before the last reshards, newest first (``'6,3'``), while records
  written under them may still be read by id: a job's record may be in its home under any of
  them (``Layout.homes``), so dedup by id and calls by id look there too.
- ``prev_until``: server time (ms) after which every record written under ``prev`` has
  expired (the reshard's time plus the longest record retention): ``prev`` is dropped then.
- ``live``: shards 0 .. live-1 may hold live work (ready, in flight, delayed, waiting, dead
  letters): workers read them all. Above ``shards`` while the old shards of a reshard down
  drain; set back to ``shards`` when they are empty and deleted.
- ``epoch``: how many reshards the queue has had.

Each shard's ``stats`` HASH holds ``lay``: the shard count this shard takes new jobs for
(written by a reshard on every shard of both layouts). ``enqueue.lua`` refuses a write that
names another count with the error ``STREAMQ_LAYOUT <count>`` and writes nothing: a producer
that still routes by the old count re-reads the layout and sends the job to its new home.
That freeze is what keeps dedup by id exact during a reshard.
"""

from __future__ import annotations

import attrs

from .driver import Cmd, Op, ok
from .errors import ShardCountMismatch
from .keys import Keys, shard_of

SHARDS_FIELD = "shards"
NEXT_FIELD = "next"
PREV_FIELD = "prev"
PREV_UNTIL_FIELD = "prev_until"
LIVE_FIELD = "live"
EPOCH_FIELD = "epoch"
LAYOUT_FIELDS = (SHARDS_FIELD, NEXT_FIELD, PREV_FIELD, PREV_UNTIL_FIELD, LIVE_FIELD,
                 EPOCH_FIELD)
FROZEN_FIELD = "lay"
"""Field of each shard's ``stats`` HASH: the shard count the shard takes new jobs for."""


@attrs.frozen
class Layout:
    """A queue's shard layout (see the module docstring for the stored fields)."""

    shards: int
    """The count new jobs are routed by."""
    prev: tuple[int, ...] = ()
    """Earlier counts whose homes may still hold records, newest first."""
    prev_until_ms: int = 0
    live: int = 0
    """Shards 0 .. live-1 may hold live work (0: the same as ``shards``)."""
    next: int | None = None
    """A reshard to this count has begun and is not published yet."""
    epoch: int = 0

    @property
    def read(self) -> int:
        """Workers read shards 0 .. read-1: every shard that may hold live work, and the
        shards of a reshard being published (so the first job there is read at once)."""
        return max(self.shards, self.live, self.next or 0)

    @property
    def stored(self) -> bool:
        """Whether the queue has been resharded (or is being): more than a fixed count."""
        return self.epoch > 0 or self.next is not None

    def home(self, job_id: str) -> int:
        """The shard a new job with this id goes to."""
        return shard_of(job_id, self.shards)

    def homes(self, job_id: str) -> tuple[int, ...]:
        """The shards a record of ``job_id`` may be in, its current home first (each once)."""
        out = [shard_of(job_id, self.shards)]
        for n in self.prev:
            s = shard_of(job_id, n)
            if s not in out:
                out.append(s)
        return tuple(out)

    def old_homes(self, job_id: str) -> tuple[int, ...]:
        """``homes`` without the current one: where a producer must look before it writes a
        new job whose id moved shard in a reshard (empty for an id that never moved)."""
        return self.homes(job_id)[1:]


def _int(v: object, default: int = 0) -> int:
    if v is None or isinstance(v, Exception):
        return default
    try:
        return int(v.decode() if isinstance(v, bytes) else str(v))
    except ValueError:
        return default


def parse(reply: list[object], default_shards: int = 1) -> Layout:
    """A Layout from an HMGET of ``LAYOUT_FIELDS`` (None for a queue without a stored count:
    ``default_shards``)."""
    shards, nxt, prev, until, live, epoch = reply
    raw_prev = prev.decode() if isinstance(prev, bytes) else (prev or "")
    counts = tuple(int(x) for x in str(raw_prev).split(",") if x.strip().isdigit())
    n = _int(shards, default_shards)
    return Layout(shards=n, prev=counts, prev_until_ms=_int(until), live=_int(live) or n,
                  next=_int(nxt) or None, epoch=_int(epoch))


def read(keys: Keys) -> Op[Layout | None]:
    """The stored layout, or None for a queue without a stored count (1 shard if it has keys,
    or a new queue)."""
    (r,) = yield [Cmd.of("HMGET", keys.of_shard(0).meta, *LAYOUT_FIELDS)]
    r = ok(r)
    if r[0] is None:
        return None
    return parse(r)


def check_layout(keys: Keys, shards: int) -> Op[Layout]:
    """The queue's layout, checked against ``QueueConfig.shards``, storing ``shards`` when the
    queue has no count yet. A count that names the current layout, or one before a reshard
    (a process configured before ``streamq reshard`` ran, or one that has not been given the
    new count yet), follows the stored layout; any other count raises ShardCountMismatch and
    writes nothing.

    Safe to repeat: HSETNX writes only the first count; a second caller reads it back. The
    unsharded count is never written (an N = 1 queue keeps exactly its old keys). Two first
    users at once agree: keys found after an empty read send the reader back to the count
    (the other one stored it before its first key)."""
    k0 = keys.of_shard(0)
    got = yield from read(keys)
    if got is None:
        if shards == 1:
            return Layout(1)
        (present,) = yield [Cmd.of("EXISTS", k0.stream, k0.delayed, k0.dead, k0.stats)]
        if ok(present):
            # another first user may have stored its count and created keys since the HGET
            # (it stores the count before it writes a key): read the count again
            got = yield from read(keys)
            if got is None:
                raise ShardCountMismatch(keys.queue, shards, 1)
        else:
            (wrote,) = yield [Cmd.of("HSETNX", k0.meta, SHARDS_FIELD, shards)]
            if ok(wrote):
                return Layout(shards)
            got = yield from read(keys)
            if got is None:  # (deleted again since: a `streamq forget` in between)
                return Layout(shards)
    if shards != got.shards and shards not in got.prev and shards != got.next:
        raise ShardCountMismatch(keys.queue, shards, got.shards)
    return got


def check(keys: Keys, shards: int) -> Op[int]:
    """``check_layout``, answering the count new jobs are routed by."""
    got = yield from check_layout(keys, shards)
    return got.shards
