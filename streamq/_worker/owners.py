"""Shard owners: which worker fetches new work from which shard of a sharded queue
(docs/scaling.md#who-reads-which-shard).

Every worker heartbeats into each shard's workers ZSET (housekeeping.py). About every
``OWNERS_EVERY_S`` (and at start, after a first heartbeat) a worker reads the queue's live
workers from the ZSET of the lowest shard it serves (owners.lua: a heartbeat within
``LIVE_BEATS`` heartbeat intervals by the server's clock), counts itself live whatever it
read, and takes its part of the queue's shards (``assign``): the same on every worker that
reads the same view. A shard it does not own fetches no new work (fetch.py's step rests it:
no claim, no blocking read, no hand-off ticket, no reclaim); it still reads its own pending
entries and settles what it runs. Views disagree for at most one refresh: a shard owned twice
is harmless (consumer groups), one owned by nobody waits at most one refresh. A worker that
stops gracefully removes itself from the ZSETs (``_leave_owners``), so the others take its
shards at their next refresh; one that dies ages out after ``LIVE_BEATS`` heartbeat intervals.

Off (every shard owned, as before) for an unsharded queue and with
``WorkerConfig(own_shards=False)``; a worker alone on its queue owns every shard.

The Worker mixes this class in; the state it uses is the Worker's (declared below).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis

from .._core.config import QueueConfig, WorkerConfig
from .._core.keys import DEFAULT_PRIORITY
from .._core.scripts import SCRIPTS
from .._core.supervise import Outage, Supervised
from .slots import Slots
from .state import QState

log = logging.getLogger("streamq.worker")
OWNERS_EVERY_S = 1.0
"""How often a worker reads its sharded queues' live workers (one owners.lua call each)."""
OWNERS_SOON_S = 0.05
"""After its start, and after a read that found the live workers changed, the next read
comes this soon, then twice as late each time up to ``OWNERS_EVERY_S``: workers that start
together (a deploy) agree within a fraction of a second, not one refresh per newcomer."""
LIVE_BEATS = 3
"""A worker is live while its last heartbeat is newer than this many heartbeat intervals."""
MAX_WORKERS = 1000
"""At most this many live workers are read per queue (a capped read: invariant 7)."""


def assign(live: Sequence[str], me: str, shards: Sequence[int]) -> set[int]:
    """The shards (indexes) worker ``me`` owns, from the live workers' names (``me``
    counted live whatever they say) and the shards served: with W workers sorted by name and
    the N shards sorted, the worker of rank r owns the i-th shard when i % W == r (W <= N),
    else the (r % N)-th (W > N: several workers per shard)."""
    order = sorted(set(live) | {me})
    ranked = sorted(shards)
    if not ranked:
        return set()
    w, n, r = len(order), len(ranked), order.index(me)
    if w > n:
        return {ranked[r % n]}
    return {s for i, s in enumerate(ranked) if i % w == r}


class Owning:
    """The part of the Worker that decides which of its shards it fetches new work from."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        consumer: str
        config: WorkerConfig
        queue_config: QueueConfig
        _names: list[str]
        _qs: dict[str, QState]
        _client: aredis.Redis | None
        _running: bool
        _slots: Slots
        _fetchers: int
        _sup: dict[str, Supervised]
        _outage: Outage

        def _serving(self, queue: str) -> list[QState]: ...

    _owner_change: asyncio.Event | None = None
    """Set (and replaced) when this worker's shards change: resting fetch loops look again."""

    def _owning(self) -> bool:
        """Whether this worker splits the shards of its queues with the other live workers
        (``own_shards``). A queue it serves with one shard is always owned whole; one that a
        reshard grows past one shard is split from the next refresh, whatever shard count
        the worker was configured with (it follows the stored layout)."""
        return self.config.own_shards

    def _sharded(self) -> bool:
        """Whether some queue of this worker is served with more than one shard now."""
        return any(len(self._serving(name)) > 1 for name in self._names)

    def _warn_slow_owner_handover(self) -> None:
        """A warning when a dead worker's shards would wait for its heartbeat to age out
        longer than its leases take to lapse (nothing is lost; new work there waits)."""
        aged = LIVE_BEATS * self.config.heartbeat_interval_s
        if aged >= self.config.visibility_timeout_s:
            log.warning(
                "worker %s: a dead worker's shards are handed on after %.1f s (%d heartbeat "
                "intervals), not within visibility_timeout_s=%.1f s; set heartbeat_interval_s "
                "below %.2f s for a faster hand-over", self.consumer, aged, LIVE_BEATS,
                self.config.visibility_timeout_s, self.config.visibility_timeout_s / LIVE_BEATS)

    _left_some: bool = False
    """Whether some refresh read a queue with more than one shard (then a graceful stop
    removes this worker from the workers ZSETs)."""

    _owner_views: dict[str, frozenset[str]] | None = None
    """The live workers each sharded queue's last read found (by queue name)."""

    async def _refresh_owners(self, client: aredis.Redis | None = None) -> bool:
        """Read each sharded queue's live workers and mark the shards this worker owns
        (``QState.owned``); lanes that gain a shard claim at once, those that lose one rest.
        Returns whether the live workers of some queue changed since the last read."""
        client = client or self._client
        assert client is not None
        window = int(LIVE_BEATS * self.config.heartbeat_interval_s * 1000)
        changed = False
        views = self._owner_views = self._owner_views or {}
        moved = False
        for name in list(self._names):
            serving = sorted((qs for qs in self._serving(name) if not qs.retired),
                             key=lambda qs: qs.keys.shard)
            if len(serving) < 2:  # one shard (or a reshard down to one): owned whole
                for qs in serving:
                    if not qs.owned:
                        changed = qs.owned = True
                        qs.idle = False
                views.pop(name, None)
                continue
            self._left_some = True
            reply: Any = await SCRIPTS["owners"].run_async(
                client, [serving[0].keys.workers], [window, MAX_WORKERS])
            live = [v.decode() if isinstance(v, bytes) else str(v) for v in reply[1:]]
            view = frozenset(live) | {self.consumer}
            moved = moved or views.get(name) != view
            views[name] = view
            mine = assign(live, self.consumer, [qs.keys.shard for qs in serving])
            for qs in serving:
                owned = qs.keys.shard in mine
                if owned != qs.owned:
                    changed = True
                    qs.owned = owned
                    if owned:
                        qs.idle = False  # a backlog may wait there: claim at once
                    log.debug("worker %s %s shard %s", self.consumer,
                              "takes" if owned else "leaves", qs.keys.tag)
        self._count_fetchers()
        if changed and self._owner_change is not None:
            self._owner_change.set()
            self._owner_change = asyncio.Event()
        return moved

    def _count_fetchers(self) -> None:
        """The share of an idle read (Slots.take_share): over the fetch loops that fetch."""
        self._slots.loops = max(1, sum(1 for qs in self._qs.values()
                                       if qs.keys.level == DEFAULT_PRIORITY
                                       and qs.owned and not qs.retired))

    def _owners_loop(self) -> asyncio.Task[None] | None:
        """The supervised refresh loop (None with ``own_shards=False``). Its step reads
        nothing while every queue has one shard: it only looks again (a reshard may grow
        one)."""
        if not self._owning():
            return None
        self._count_fetchers()
        self._owner_change = asyncio.Event()
        sup = self._sup["shard owners"] = Supervised("shard owners", log, outage=self._outage,
                                                     max_backoff_s=1.0)
        every = [OWNERS_SOON_S]

        async def step() -> float:
            if await self._refresh_owners():
                every[0] = OWNERS_SOON_S
            pause = every[0]
            every[0] = min(OWNERS_EVERY_S, pause * 2)
            return pause

        return asyncio.create_task(sup.run(step, lambda: self._running))

    async def _rest_unowned(self, qs: QState) -> float:
        """A shard this worker does not own: wait until its shards change (or a refresh
        round passed: its own pending entries may have been marked for reading)."""
        event = self._owner_change
        qs.resting = True
        try:
            if event is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), OWNERS_EVERY_S)
        finally:
            qs.resting = False
        return 0.0

    async def _leave_owners(self) -> None:
        """At a graceful stop: off every served shard's workers ZSET, so that the other
        workers take this one's shards at their next refresh (best effort: else it ages
        out). Only where shards are owned: elsewhere the heartbeat ages as before."""
        client = self._client
        if not self._owning() or not self._left_some or client is None:
            return
        keys = {qs.keys.workers for qs in self._qs.values()}
        try:
            pipe = client.pipeline(transaction=False)
            for k in sorted(keys):
                pipe.zrem(k, self.consumer)
            await asyncio.wait_for(pipe.execute(), 2.0)
        except Exception as exc:  # noqa: BLE001 - stop() never raises for Redis
            log.debug("worker %s not removed from the workers ZSETs (it ages out): %s",
                      self.consumer, exc)
