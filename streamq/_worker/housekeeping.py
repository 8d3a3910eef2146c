"""A worker's housekeeping loops: pause flags, heartbeats, gauges, pruning dead workers, and
promoting its queues' due delayed jobs. Each runs supervised on its own, so one failing (a
permission refused, a script error) never stops the others."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis

from .._core.config import WorkerConfig
from .._core.keys import GROUP
from .._core.scripts import SCRIPTS
from .._core.supervise import Outage, Supervised
from .._core.timeseries import SeriesRecorder
from .._ops import metrics as _metrics
from .._ops import search_words as _words
from .state import QState

log = logging.getLogger("streamq.worker")
_BATCH = 1000
SERIES_EVERY_S = 10.0
"""How often a worker adds its outcome counts to the queues' time series."""


class Housekeeper:
    """The background loops of one worker besides fetching and settling."""

    def __init__(self, client: aredis.Redis, config: WorkerConfig, consumer: str,
                 queues: list[QState], outage: Outage | None = None) -> None:
        self.outage = outage
        self.client = client
        self.config = config
        self.consumer = consumer
        self.queues = queues
        self.gauges_read = False
        names = list(dict.fromkeys(q.keys.queue for q in queues))
        self.series = SeriesRecorder(names)
        """Outcome counts and wait/run times for the dashboard's charts (timeseries.lua)."""
        self._keys = {q.keys.queue: q.keys for q in queues if q.keys.shard == 0}
        """The series of a sharded queue are kept on its shard 0."""
        self.loops: dict[str, Supervised] = {}
        self._info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "concurrency": config.concurrency,
                                 "queues": names})

    def tasks(self, running: Callable[[], bool]) -> list[asyncio.Task[None]]:
        """The worker-wide loops (each shard's: ``shard_tasks``)."""
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("pause flags", self._pause_step), ("heartbeat", self._heartbeat_step),
            ("gauges", self._gauges_step), ("pruning", self._prune_step),
            ("charts", self._series_step)]
        return [self._task(name, step, running) for name, step in steps]

    def shard_tasks(self, qs: QState, running: Callable[[], bool]) -> list[asyncio.Task[None]]:
        """The loops of one queue shard (at start, or a shard a reshard added: the
        Worker's layout watch); each ends when ``running()`` turns false or the shard is
        retired (``QState.retired``)."""
        steps: list[tuple[str, Callable[[], Any]]] = []
        if self.config.promote:  # one loop per queue: one queue's failure stalls no other
            steps.append((f"promotion on {qs.keys.tag}", self._promote_step(qs)))
        if qs.groups is not None:
            steps.append((f"groups on {qs.keys.tag}", self._groups_step(qs)))
        if self.config.promote:  # the workflow relay and repair sweep (docs/workflows.md)
            steps.append((f"workflows on {qs.keys.tag}", self._flow_step(qs)))
            # the error-word index of search (docs/search.md#error-text); a queue without
            # search costs one short call per interval
            steps.append((f"error index on {qs.keys.tag}", self._words_step(qs)))
        return [self._task(name, self._if_owned(qs, step), lambda: running() and not qs.retired)
                for name, step in steps]

    def _if_owned(self, qs: QState, step: Callable[[], Any]) -> Callable[[], Any]:
        """``step`` while this worker owns shard ``qs`` (owners.py; always, unless the queue is
        sharded and others share it). These loops are safe to run from any number of workers,
        so a shard's owner alone runs them: W workers over N shards make N loops' calls per
        interval, not W x N. A shard owned by nobody for a moment (views differ for at most
        one refresh) waits at most that long plus one interval."""
        every = self.config.promote_interval_s

        async def run() -> float:
            if not qs.owned:
                return every
            result: float = await step()
            return result

        return run

    def drop(self, qs: QState) -> None:
        """Forget a retired shard: its loops end (``QState.retired``), its names go."""
        self.queues[:] = [q for q in self.queues if q is not qs]
        for name in [n for n in self.loops if n.endswith(f" on {qs.keys.tag}")]:
            del self.loops[name]

    def _task(self, name: str, step: Callable[[], Any], running: Callable[[], bool]
              ) -> asyncio.Task[None]:
        # cheap calls: back off at most a second, so they resume soon after Redis does
        sup = self.loops[name] = Supervised(name, log, outage=self.outage, max_backoff_s=1.0)
        return asyncio.create_task(sup.run(step, running))

    # ------------------------------------------------------------------ steps

    async def _pause_step(self) -> float:
        await self.refresh_paused()
        return min(1.0, self.config.heartbeat_interval_s)

    async def refresh_paused(self) -> None:
        queues = list(self.queues)  # (a reshard may add or drop shards meanwhile)
        pipe = self.client.pipeline(transaction=False)
        for qs in queues:
            pipe.exists(qs.keys.paused)
        for qs, flag in zip(queues, await pipe.execute(), strict=True):
            if qs.paused and not flag:
                qs.own_cursor = "0"  # entries a paused start left pending: look at them again
            qs.paused = bool(flag)

    async def _heartbeat_step(self) -> float:
        await self.beat()
        return self.config.heartbeat_interval_s

    async def beat(self) -> None:
        """One heartbeat on every shard served (heartbeat.lua)."""
        every = self.config.heartbeat_interval_s
        for qs in [q for q in self.queues if not q.retired]:  # (never re-creating its keys)
            await SCRIPTS["heartbeat"].run_async(
                self.client, [qs.keys.workers, qs.keys.worker_info(self.consumer)],
                [self.consumer, self._info, int(every * 3) + 1])

    def gauge_values(self) -> list[tuple[str, dict[str, float]]]:
        self.gauges_read = True  # a metrics reader is collecting: keep the cache fresh
        # a sharded queue's gauges add up over its shards (_metrics.merge_shards)
        return _metrics.merge_shards((qs.keys.queue, qs.gauges) for qs in self.queues)

    async def first_gauges(self) -> None:
        """At start, while metrics are recorded: a heartbeat (so this worker's slots count)
        and the queue gauges read once, so they are there from the first scrape."""
        await self._heartbeat_step()
        await self.refresh_gauges()

    async def _gauges_step(self) -> float:
        if self.gauges_read:
            self.gauges_read = False
            await self.refresh_gauges()
        return self.config.gauges_interval_s

    async def refresh_gauges(self) -> None:
        from .._core.driver import adrive

        for qs in list(self.queues):
            qs.gauges = await adrive(self.client, _metrics.gauges(qs.keys))

    async def _series_step(self) -> float:
        await self.flush_series()
        return SERIES_EVERY_S

    async def flush_series(self) -> None:
        await self.series.flush(self.client, self._keys.__getitem__)

    async def _prune_step(self) -> float:
        for qs in list(self.queues):
            for lane in list(qs.lanes.values()) or [qs]:  # every priority level's stream
                await self.prune(lane)
        return self.config.prune_interval_s

    async def prune(self, qs: QState) -> list[str]:
        """Forget workers whose heartbeat is stale and whose pending list is empty: those
        listed as consumers, and those in the workers ZSET that never became one."""
        keys = qs.keys
        stale_ms = int(self.config.consumer_dead_after_s * 1000)
        try:
            consumers: Any = await self.client.xinfo_consumers(keys.stream, GROUP)
        except Exception as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                raise
            consumers = []
        names: list[str] = []
        for c in consumers[:_BATCH]:
            name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
            if name != self.consumer and int(c["pending"]) == 0 and int(c["idle"]) >= stale_ms:
                names.append(name)
        pruned: Any = await SCRIPTS["prune"].run_async(
            self.client, [keys.stream, keys.workers], [GROUP, stale_ms, *names])
        out = [p.decode() for p in pruned]
        for name in out:
            log.info("pruned dead worker %s from %s", name, keys.queue)
        return out

    def _groups_step(self, qs: QState) -> Callable[[], Any]:
        keeper = qs.groups
        assert keeper is not None
        every = self.config.promote_interval_s

        async def step() -> float:
            return await keeper.step(self.client, every)

        return step

    def _promote_step(self, qs: QState) -> Callable[[], Any]:
        promoter = qs.promoter
        assert promoter is not None
        every = self.config.promote_interval_s

        async def step() -> float:
            _moved, more = await promoter.run_once(self.client)
            return 0.0 if more else promoter.sleep_s(every)

        return step

    def _words_step(self, qs: QState) -> Callable[[], Any]:
        """Index this shard's new dead letters by the words of their errors (ixdead.lua: the
        next 200 each call, at once again while more wait)."""
        call = _words.sync_call(qs.keys)
        script = SCRIPTS[call.script]

        async def step() -> float:
            rep: Any = await script.run_async(self.client, call.keys, call.args)
            return 0.0 if int(rep[3]) else _words.ERROR_INDEX_EVERY_S

        return step

    def _flow_step(self, qs: QState) -> Callable[[], Any]:
        """This shard's workflow relay and repair sweep (relay.py)."""
        from .relay import Relay

        # woken by new outbox entries (relay.py), in reads no longer than the fetch loop's
        keeper = Relay(qs.keys, wait_ms=self.config.block_ms)
        every = self.config.promote_interval_s

        async def step() -> float:
            return await keeper.step(self.client, every)

        return step
