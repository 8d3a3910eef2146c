"""Live resharding from the admin side (docs/scaling.md#resharding): begin a reshard, read
where it stands, finish it (``_core/reshard.py`` holds the operations themselves)."""

from __future__ import annotations

from typing import Any

from .._core import durable
from .._core import reshard as _reshard
from .._core.config import QueueConfig
from .._core.driver import Op
from .._core.errors import ReplicationTimeout, UnknownQueue
from .._core.keys import Keys
from .._core.reshard import OldShard, ReshardStatus
from .._core.shards import Layout, read
from . import operations as _ops


def window_s(cfg: QueueConfig) -> int:
    """How long ``prev`` is kept: the longest a record of the queue is kept."""
    return max(cfg.default_result_ttl_s, cfg.dead_ttl_s)


def old_shard(k: Keys) -> Op[OldShard]:
    try:
        st = yield from _ops.stats(k)
    except UnknownQueue:  # no key left: deleted
        return OldShard(k.shard, 0, 0, 0, 0, 0)
    return OldShard(k.shard, ready=st.ready, in_flight=st.pending,
                    delayed=st.scheduled + st.retrying, waiting=st.waiting + st.group_waiting,
                    dead=st.dead)


def status_of(keys: Keys, lay: Layout) -> Op[ReshardStatus]:
    old = []
    for i in range(lay.shards, lay.live):
        old.append((yield from old_shard(keys.of_shard(i))))
    return ReshardStatus(keys.queue, lay.shards, lay.live, lay.next, lay.prev,
                         lay.prev_until_ms, lay.epoch, tuple(old))


def status(keys: Keys, cfg: QueueConfig) -> Op[ReshardStatus]:
    lay = yield from read(keys)
    return (yield from status_of(keys, lay or Layout(cfg.shards)))


def begin(keys: Keys, cfg: QueueConfig, n: int) -> Op[ReshardStatus]:
    lay = yield from _reshard.begin(keys, n, window_s(cfg))
    return (yield from status_of(keys, lay))


def finish(keys: Keys) -> Op[ReshardStatus]:
    lay = yield from _reshard.finish(keys)
    return (yield from status_of(keys, lay))


def written(keys: Keys, st: ReshardStatus) -> list[str]:
    """A key in each slot a reshard's begin or finish may have written to (the layout in
    shard 0's ``meta``; each shard's ``stats``, frozen or retired, of every count it names):
    the barrier of its WAIT goes there (``durable.replicated``)."""
    top = max(st.shards, st.live, *st.prev, st.next or 0)
    return [keys.of_shard(0).meta, *(keys.of_shard(i).stats for i in range(top))]


def _confirmed(cfg: QueueConfig, st: ReshardStatus, acked: int) -> ReshardStatus:
    if acked < cfg.min_replicas:
        raise ReplicationTimeout([], acked, cfg.min_replicas, cfg.min_replicas_timeout_ms,
                                 what=f"the reshard of queue {st.queue!r} to {st.shards}"
                                      " shards (its layout and frozen or retired shards)")
    return st


def replicated(client: Any, cfg: QueueConfig, keys: Keys, st: ReshardStatus
               ) -> ReshardStatus:
    """After ``begin`` or ``finish`` answered ``st``: with ``cfg.min_replicas``, a barrier and
    WAIT as a producer's after an enqueue (``durable.replicated``: it covers every write the
    primaries had made by then, a repeat's that wrote nothing included); ``st``, or
    ReplicationTimeout when fewer replicas confirmed them in time. Without: ``st``, no WAIT."""
    if not cfg.min_replicas:
        return st
    return _confirmed(cfg, st, durable.replicated(client, cfg, written(keys, st),
                                                  keys.waiter_channel(durable.BARRIER_TAG)))


async def areplicated(client: Any, cfg: QueueConfig, keys: Keys, st: ReshardStatus
                      ) -> ReshardStatus:
    """:func:`replicated` for an asyncio client."""
    if not cfg.min_replicas:
        return st
    return _confirmed(cfg, st, await durable.areplicated(
        client, cfg, written(keys, st), keys.waiter_channel(durable.BARRIER_TAG)))
