"""A worker serving a live reshard (docs/scaling.md#resharding).

At start the worker reads each queue's stored layout (``shards.check_layout``) and serves
``Layout.read`` shards: every shard that may hold live work, and those of a reshard being
published. The layout watch (a supervised loop, about every ``LAYOUT_EVERY_S``) reads it
again with one HMGET per queue:

- when ``read`` grows, the new shards are served at once: their state, consumer group and
  priority lanes, fetch loop, settling loops, promotion, group upkeep, workflow relay, error
  index, cancel channel and hand-off inbox, a share of the slots, gauges and heartbeats;
- when a shard's index is >= ``read`` (the reshard's ``finish`` retired and deleted it), its
  loops stop and its state goes; nothing of this worker writes to it again (a fetch loop that
  meets NOGROUP reads the layout before it would make the group again);
- while ``read > shards`` or ``prev`` is kept, it runs ``reshard.finish`` about every
  ``FINISH_EVERY_S``: old shards are deleted as soon as they are drained, by whichever worker
  gets there first (the step is safe to repeat and to run from many workers at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis

from .._core import reshard as _reshard
from .._core import shards as _shards
from .._core import telemetry as tel
from .._core.config import QueueConfig, WorkerConfig
from .._core.driver import adrive
from .._core.keys import DEFAULT_PRIORITY, PRIORITIES, Keys
from .._core.retry import acall
from .._core.sends import Kept
from .._core.supervise import Outage, Supervised
from .groups import GroupKeeper
from .promote import Promoter
from .slots import Slots
from .state import QState

if TYPE_CHECKING:
    from .cancel import CancelWatch
    from .housekeeping import Housekeeper
    from .settle import Settler

log = logging.getLogger("streamq.worker")
LAYOUT_EVERY_S = 1.0
"""How often the worker reads each queue's layout (one HMGET per queue)."""
FINISH_EVERY_S = 5.0
"""How often, while a reshard's old shards remain, it runs ``reshard.finish``."""
FORGET_EVERY_S = 60.0
"""How often it runs it while only ``prev`` remains (to drop it when its time has come)."""


class Resharding:
    """The part of the Worker that follows each queue's stored shard layout."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        config: WorkerConfig
        queue_config: QueueConfig
        _names: list[str]
        _qs: dict[str, QState]
        _client: aredis.Redis | None
        _running: bool
        _settling: bool
        _slots: Slots
        _fetchers: int
        _loops: list[asyncio.Task[None]]
        _flushers: list[asyncio.Task[None]]
        _sup: dict[str, Supervised]
        _outage: Outage
        _hk: Housekeeper | None
        _cancels: CancelWatch | None
        _settler: Settler | None
        _token_prefix: str

        async def _ensure_group_retried(self, client: aredis.Redis, keys: Keys,
                                        _retried: bool) -> None: ...
        async def _refresh_levels_retried(self, client: aredis.Redis, qs: QState,
                                          _retried: bool) -> None: ...
        def _fetch_step(self, qs: QState) -> Any: ...

    _layouts: dict[str, _shards.Layout]
    _shard_tasks: dict[str, list[asyncio.Task[None]]]
    _finish_due: float = 0.0

    def _init_resharding(self) -> None:
        self._layouts = {}
        self._shard_tasks = {}
        self._finish_due = 0.0

    def _serving(self, queue: str) -> list[QState]:
        """The shards of ``queue`` this worker serves (their default-level state)."""
        return [qs for qs in self._qs.values() if qs.keys.queue == queue
                and qs.keys.level == DEFAULT_PRIORITY]

    async def _check_layouts(self, client: aredis.Redis) -> None:
        """At start: each queue's layout (ShardCountMismatch for a count it cannot follow),
        and the state of every shard it reads (none beyond it)."""
        self._shard_tasks = {}  # (an earlier run's loops are over)
        for name in self._names:
            keys = Keys(name, self.queue_config.key_prefix)

            async def check(_retried: bool, keys: Keys = keys) -> _shards.Layout:
                return await adrive(client, _shards.check_layout(
                    keys, self.queue_config.shards))

            lay = self._layouts[name] = await acall(check)
            have = {qs.keys.shard: qs for qs in self._serving(name)}
            for i in range(lay.read):
                if i in have and have[i].retired:  # retired in an earlier run, used again
                    for lane in list(have[i].lanes.values()) or [have[i]]:
                        lane.retired = False
                if i not in have:
                    k = keys.of_shard(i)
                    self._qs[k.tag] = QState(k, labels=tel.attrs_for(name))
            for i, qs in have.items():
                if i >= lay.read:  # a count configured before a reshard down finished
                    for lane in list(qs.lanes.values()) or [qs]:
                        self._qs.pop(lane.keys.tag, None)
        self._fetchers = sum(len(self._serving(n)) for n in self._names)
        self._slots.loops = self._fetchers

    def _prepare(self, qs: QState) -> None:
        """A shard's per-run parts (start, or a shard added while running)."""
        qs.promoter = Promoter(qs.keys, self.queue_config) if self.config.promote else None
        qs.groups = GroupKeeper(qs.keys, self.queue_config,
                                self.config.group_reconcile_interval_s)
        qs.own_cursor = "0"
        qs.reads = Kept()  # (connections of this run's client)
        qs.settles = Kept()

    def _settling_on(self, lane: QState) -> Callable[[], bool]:
        """A lane's settling loop goes on while the worker settles and the shard is served
        (and, in any case, until its buffer is empty: Settler.flush_loop)."""
        return lambda: self._settling and not lane.retired

    def _shard_loops(self, qs: QState) -> None:
        """Start a shard's fetch loop and housekeeping loops (each ends when the worker
        stops or the shard is retired)."""
        name = f"fetch from {qs.keys.tag}"
        fetch = self._sup[name] = Supervised(name, log, outage=self._outage)
        tasks = [asyncio.create_task(fetch.run(
            self._fetch_step(qs), lambda: self._running and not qs.retired))]
        if self._hk is not None:
            tasks.extend(self._hk.shard_tasks(qs, lambda: self._running))
        self._shard_tasks[qs.keys.tag] = tasks
        self._loops.extend(tasks)

    def _layout_loop(self) -> asyncio.Task[None]:
        sup = self._sup["layout watch"] = Supervised("layout watch", log, outage=self._outage,
                                                     max_backoff_s=2.0)
        return asyncio.create_task(sup.run(self._layout_step, lambda: self._running))

    async def _layout_step(self) -> float:
        client = self._client
        assert client is not None
        finish = time.monotonic() >= self._finish_due
        every = FORGET_EVERY_S
        for name in list(self._names):
            keys = Keys(name, self.queue_config.key_prefix)
            lay = await adrive(client, _shards.read(keys))
            if lay is None:
                continue
            if finish and (lay.read > lay.shards or lay.prev):
                try:  # (its failure never keeps this worker from following the layout)
                    lay = await adrive(client, _reshard.finish(keys))
                except Exception as exc:  # noqa: BLE001 - tried again at the next round
                    log.warning("reshard finish of %s failed (tried again in %g s): %s: %s",
                                name, FINISH_EVERY_S, type(exc).__name__, exc)
            if lay.read > lay.shards:  # old shards to delete: look again soon
                every = FINISH_EVERY_S
                self._finish_due = min(self._finish_due, time.monotonic() + FINISH_EVERY_S)
            self._layouts[name] = lay
            await self._follow(name, lay)
        if finish:
            self._finish_due = time.monotonic() + every
        return LAYOUT_EVERY_S

    async def _follow(self, name: str, lay: _shards.Layout) -> None:
        """Serve exactly shards 0 .. lay.read-1 of queue ``name``."""
        serving = {qs.keys.shard: qs for qs in self._serving(name)}
        for i, qs in serving.items():
            if i >= lay.read:
                await self._drop_shard(qs)
        for i in range(lay.read):
            if (i not in serving or serving[i].retired) and self._running:
                await self._add_shard(Keys(name, self.queue_config.key_prefix).of_shard(i))

    async def _add_shard(self, k: Keys) -> None:
        """Serve one more shard of a queue while running (a reshard up was published)."""
        client = self._client
        assert client is not None
        qs = QState(k, labels=tel.attrs_for(k.queue))
        await acall(lambda r: self._ensure_group_retried(client, k, r))
        await acall(lambda r: self._refresh_levels_retried(client, qs, r))
        self._prepare(qs)
        self._qs[k.tag] = qs
        for lane in qs.lanes.values():
            lane.settles = Kept()
            self._qs[lane.keys.tag] = lane
            if self._settler is not None and self._settling:
                self._flushers.append(asyncio.create_task(self._settler.flush_loop(
                    lane, self._settling_on(lane))))
        self._fetchers += 1
        self._slots.loops = self._fetchers
        if self._hk is not None:
            self._hk.queues.append(qs)
        if self._cancels is not None:
            self._cancels.add(qs, k.inbox(self._token_prefix))
        self._shard_loops(qs)
        log.info("now serving shard %s (reshard)", k.tag)

    async def _drop_shard(self, qs: QState) -> None:
        """Stop serving a shard a reshard retired (its keys are deleted: it holds nothing)."""
        if qs.keys.tag not in self._shard_tasks:
            return  # dropped before
        lanes = list(qs.lanes.values()) or [qs]
        for lane in lanes:
            lane.retired = True
            lane.flush.set()  # its settling loop ends once its buffer is empty
        tasks = self._shard_tasks.pop(qs.keys.tag, [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops[:] = [t for t in self._loops if t not in tasks]
        self._slots.rest(qs.keys.tag)
        self._fetchers = max(1, self._fetchers - 1)
        self._slots.loops = self._fetchers
        if self._hk is not None:
            self._hk.drop(qs)
        if self._cancels is not None:
            self._cancels.remove(qs, qs.keys.inbox(self._token_prefix))
        for lane in lanes:
            if not lane.buf:
                self._qs.pop(lane.keys.tag, None)
            if self._client is not None:
                await lane.reads.release(self._client)
        if self._client is not None:  # this run's hand-off inbox there (it would expire)
            try:
                await self._client.delete(qs.keys.inbox(self._token_prefix))
            except Exception as exc:  # noqa: BLE001 - it expires within a minute anyway
                log.debug("inbox of retired shard %s not deleted: %s", qs.keys.tag, exc)
        for n in [n for n in self._sup if n.endswith(f" {qs.keys.tag}")]:
            del self._sup[n]
        log.info("no longer serving shard %s (retired by a reshard)", qs.keys.tag)

    async def _retired(self, qs: QState) -> bool:
        """Whether this shard was retired (its group is gone because its keys were deleted,
        not deleted under us): read the layout first, never make a retired shard's group."""
        client = self._client
        assert client is not None
        lay = await adrive(client, _shards.read(qs.keys))
        if lay is None or qs.keys.shard < lay.shards:
            return False  # a current shard: its group is made again
        if lay.next is not None and qs.keys.shard < lay.next:
            return False  # a shard of a reshard being published: its group is made now
        if qs.keys.shard < lay.read:
            # an old shard of a reshard down, still listed as live: finish deletes a drained
            # one (retire.lua) before it sets 'live' (shard 0's meta, another slot), so a
            # shard with none of its live-work keys left is retired; being frozen, it takes
            # no new job (and one with any of them left is not: its group is made again)
            k = qs.keys
            left = await client.exists(*(k.stream_level(p) for p in PRIORITIES), k.delayed,
                                       k.dead, k.group_wait, k.group_inflight, k.waiting,
                                       k.outbox)
            if left:
                return False
        qs.retired = True  # this loop ends; the layout watch drops the rest
        for lane in qs.lanes.values():
            lane.retired = True
        return True
