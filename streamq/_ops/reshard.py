"""Live resharding from the admin side (docs/scaling.md#resharding): begin a reshard, read
where it stands, finish it (``_core/reshard.py`` holds the operations themselves)."""

from __future__ import annotations

from .._core import reshard as _reshard
from .._core.config import QueueConfig
from .._core.driver import Op
from .._core.errors import UnknownQueue
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
