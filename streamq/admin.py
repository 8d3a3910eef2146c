"""Admin API: stats, pending, job records, dead letters, re-drive, requeue, pause, purge.

``Admin`` (blocking) and ``AsyncAdmin`` (asyncio) run the same operations (``_ops/operations.py``);
everything reads XINFO/XPENDING, counters and indexes, never the keyspace.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis

from ._core.cancel import await_cancel, check_cancel_wait, wait_cancel
from ._core.config import GroupRate, QueueConfig
from ._core.conn import (
    as_cluster_url,
    async_client,
    averify,
    sync_client,
    verify,
)
from ._core.driver import Op, adrive, drive
from ._core.errors import JobNotFound, ServerTooOld
from ._core.keys import Keys, queues_key
from ._core.model import CancelResult, JobInfo
from ._core.reshard import ReshardStatus
from ._core.serverinfo import ServerInfo, adetect, detect
from ._core.timeseries import Point
from ._ops import browse as _browse
from ._ops import groups as _groups
from ._ops import operations as _ops
from ._ops import reshard as _rs
from ._ops import search as _search
from ._ops import shards as _sh
from ._ops.browse import CronInfo, Event, JobRow, Lease, ListFilter, Timeline, WorkerInfo
from ._ops.flows import FlowEdge, FlowView
from ._ops.groups import GroupInfo, GroupPage
from ._ops.operations import (
    ConsumerInfo,
    DeadEntry,
    DeadFilter,
    Page,
    PendingEntry,
    QueueStats,
)
from ._ops.search import Hit, SearchPage, SearchQuery
from ._ops.slots import ShardSlot, ashard_slots, shard_slots

T = TypeVar("T")
MIN_VERSION = (6, 2)

__all__ = ["Admin", "AsyncAdmin", "ConsumerInfo", "CronInfo", "DeadEntry", "DeadFilter", "Event",
           "FlowEdge", "FlowView", "Hit", "JobRow", "Lease", "ListFilter", "Page", "PendingEntry",
           "Point", "QueueStats", "ReshardStatus", "SearchPage", "ServerInfo", "ShardSlot",
           "Timeline", "WorkerInfo"]


def _who() -> str:
    return f"admin:{socket.gethostname()}:{os.getpid()}"


def _check_version(version: tuple[int, ...]) -> None:
    if version[:2] < MIN_VERSION:
        raise ServerTooOld(
            f"Redis {'.'.join(map(str, version))} is too old: streamq needs 6.2 or newer"
            " (XAUTOCLAIM, XPENDING IDLE)")


class Admin:
    """Operations on queues, from blocking code (scripts, the CLI)."""

    def __init__(self, client: redis.Redis, config: QueueConfig | None = None) -> None:
        self.client = client
        self.config = config or QueueConfig()
        self.url: str | None = None
        """The URL the client was built from (None for a client given as is)."""
        self.ops = _sh.QueueOps(self.config)
        """Whole-queue operations (every shard of a sharded queue; _ops/shards.py)."""

    @classmethod
    def from_url(cls, url: str, config: QueueConfig | None = None, **kwargs: Any) -> Admin:
        """Over any URL form (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
        ``redis+sentinel://``); nothing connects until the first call."""
        admin = cls(sync_client(url, **kwargs), config)
        admin.url = url
        return admin

    def close(self) -> None:
        self.client.close()

    def _k(self, queue: str) -> Keys:
        return Keys(queue, self.config.key_prefix)

    def check_server(self) -> tuple[int, ...]:
        """The server's version; raises ServerTooOld below 6.2, and ConnectionSetupError when
        the URL's form does not match the server (e.g. ``redis://`` at a cluster node)."""
        verify(self.client, self.url)
        version = drive(self.client, _ops.server_version())
        _check_version(version)
        return version

    def queues(self) -> list[str]:
        """Queues that workers or schedulers have served (a SET kept by them; no scan)."""
        names: Any = self.client.smembers(queues_key(self.config.key_prefix))
        return sorted(n.decode() for n in names)

    def stats(self, queue: str, *, shard: int | None = None) -> QueueStats:
        """Summed over every shard, or of one ``shard`` (0..shards-1)."""
        return drive(self.client, self.ops.stats(queue, shard))

    def pending(self, queue: str, *, min_idle_s: float = 0, consumer: str | None = None,
                count: int = 100, cursor: str | None = None, shard: int | None = None
                ) -> Page:
        return drive(self.client, self.ops.pending(queue, shard, min_idle_s=min_idle_s,
                                                  consumer=consumer, count=count,
                                                  cursor=cursor))

    def job(self, queue: str, job_id: str) -> JobInfo:
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _ops.job(
            k, self.config, job_id)))

    def find(self, queue: str | None = None, *, id: str | None = None,
             id_prefix: str | None = None, type: str | None = None, state: str | None = None,
             group: str | None = None, error: str | None = None, error_type: str | None = None,
             since_ms: int | None = None, until_ms: int | None = None,
             fields: Mapping[str, str] | None = None, limit: int = 50,
             cursor: str | None = None, max_scan: int = _search.SCAN_DEFAULT) -> SearchPage:
        """Jobs matching every filter given, newest first, in ``queue`` or every queue of the
        registry, every shard (docs/search.md). Answered from the indexes of queues with
        ``QueueConfig(search=...)`` (an exact ``id`` and error filters work on any queue);
        reads at most ``max_scan`` candidates, then says so (``bound_hit``) with a cursor.
        Raises InvalidSearch for a bad filter (unknown state, undeclared field, ...)."""
        q = SearchQuery(queue, id, id_prefix, type, state, group, error, error_type, since_ms,
                        until_ms, dict(fields or {}))
        return drive(self.client, _search.find(q, prefix=self.config.key_prefix, limit=limit,
                                               cursor=cursor, max_scan=max_scan,
                                               serde=self.config.serde))

    def flow(self, queue: str, job_id: str, *, cursor: str | None = None, limit: int = 100
             ) -> FlowView:
        """One page of a job's flow: its dependencies (each with its state; ``blocked_by``:
        the pending ones) and the jobs waiting for it. Pass ``cursor`` back for the next page
        ('' on the last one). docs/workflows.md#looking-at-a-flow"""
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: self.ops.flow(
            k, job_id, cursor, limit)))

    def requeue(self, queue: str, job_id: str, *, who: str | None = None) -> str:
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _ops.requeue(
            k, self.config, job_id, who or _who())))

    def dead(self, queue: str, flt: DeadFilter | None = None, *, limit: int = 100,
             cursor: str | None = None, oldest_first: bool = False,
             shard: int | None = None) -> Page:
        """Dead entries of every shard (shard by shard: oldest_first orders each shard), or
        of one ``shard``."""
        return drive(self.client, self.ops.dead(queue, shard, flt or DeadFilter(), limit=limit,
                                               cursor=cursor, oldest_first=oldest_first))

    def redrive(self, queue: str, entries: Sequence[DeadEntry], *, who: str | None = None
                ) -> dict[str, int]:
        """Re-drive these dead entries (from :meth:`dead`); safe to re-run."""
        return drive(self.client, self.ops.redrive(queue, entries, who or _who()))

    def redrive_matching(self, queue: str, flt: DeadFilter | None = None,
                         max_jobs: int = 100_000) -> dict[str, int]:
        """Re-drive every dead job matching the filter, oldest first, page by page."""
        total: dict[str, int] = {}
        cursor: str | None = None
        while sum(total.values()) < max_jobs:
            page = self.dead(queue, flt, limit=min(1000, max_jobs - sum(total.values())),
                             cursor=cursor, oldest_first=True)
            if page.items:
                for k, v in self.redrive(queue, page.items).items():
                    total[k] = total.get(k, 0) + v
            if page.cursor is None:
                break
            cursor = page.cursor
        return total

    def purge(self, queue: str, state: str, max_jobs: int = 100_000, *,
              shard: int | None = None) -> int:
        return drive(self.client, self.ops.purge(queue, shard, state, max_jobs))

    def pause(self, queue: str) -> None:
        drive(self.client, self.ops.set_paused(queue, True))  # every shard

    def resume(self, queue: str) -> None:
        drive(self.client, self.ops.set_paused(queue, False))

    def groups(self, queue: str, *, cursor: str | None = None, limit: int = 100,
               shard: int | None = None) -> GroupPage:
        """Groups with waiting or in-flight jobs, by name, ``limit`` (<= 1000) a page; counts
        summed over the shards (docs/fairness.md#groups)."""
        return drive(self.client, self.ops.parts(queue, shard, lambda ps: _groups.groups(
            ps, self.config, cursor=cursor, limit=limit)))

    def group(self, queue: str, group: str) -> GroupInfo:
        return drive(self.client, self.ops.parts(queue, None, lambda ps: _groups.group(
            ps, self.config, group)))

    def set_group_limit(self, queue: str, group: str, limit: int | None) -> None:
        """Override a group's in-flight limit (None: back to QueueConfig.group_concurrency);
        a raised limit admits waiting jobs at once, a lowered one pre-empts nothing."""
        drive(self.client, self._set(queue, "limit", group, _groups.limit_arg(limit)))

    def set_group_rate(self, queue: str, group: str, rate: GroupRate | None) -> None:
        """Override a group's start rate (None: back to QueueConfig.group_rate)."""
        drive(self.client, self._set(queue, "rate", group, _groups.rate_arg(rate)))

    def pause_group(self, queue: str, group: str) -> None:
        """Nothing of the group is admitted or started until resume_group; running jobs end."""
        drive(self.client, self._set(queue, "pause", group, ""))

    def resume_group(self, queue: str, group: str) -> None:
        drive(self.client, self._set(queue, "resume", group, ""))

    def _set(self, queue: str, op: str, group: str, value: str) -> Op[tuple[int, int, int]]:
        return self.ops.parts(queue, None, lambda ps: _groups.set_group(
            ps, self.config, op, group, value))

    def consumers(self, queue: str, *, shard: int | None = None) -> list[ConsumerInfo]:
        """Each shard's consumers (a worker is one consumer in every shard)."""
        return drive(self.client, self.ops.concat(queue, shard, _ops.consumers))

    def server(self) -> ServerInfo:
        """The server's name and version and the newer paths it offers (asked once per
        client; docs/scaling.md#server-versions)."""
        return detect(self.client)

    def shard_slots(self, queue: str) -> list[ShardSlot]:
        """On a Redis Cluster, each shard's slot, its primary and its key count (and CPU µs
        and network bytes where CLUSTER SLOT-STATS has them); ``[]`` on one server."""
        return shard_slots(self.client, drive(self.client, self.ops.shard_keys(queue)))

    def reshard(self, queue: str, shards: int) -> ReshardStatus:
        """Change the queue's shard count while producers and workers run (safe to repeat:
        a repeat after a lost reply or a dead driver finishes the same reshard; raises
        ReshardInProgress while another count is being published). Old shards drain and
        are deleted by the workers (``reshard_finish``; docs/scaling.md#resharding)."""
        k = self._k(queue)
        return _rs.replicated(self.client, self.config, k, drive(self.client, _rs.begin(
            k, self.config, shards)))

    def reshard_status(self, queue: str) -> ReshardStatus:
        """The layout, and what each old shard of a reshard down still holds."""
        return drive(self.client, _rs.status(self._k(queue), self.config))

    def reshard_finish(self, queue: str) -> ReshardStatus:
        """Delete the drained old shards now (workers do it about every 5 s); safe to repeat."""
        k = self._k(queue)  # (with min_replicas: a barrier and WAIT, as after an enqueue)
        return _rs.replicated(self.client, self.config, k, drive(self.client, _rs.finish(k)))

    def prune(self, queue: str, dead_after_s: float = 600.0) -> list[str]:
        return drive(self.client, self.ops.concat(queue, None, lambda k: _ops.prune(
            k, dead_after_s)))

    def ready(self, queue: str, flt: ListFilter | None = None, *, limit: int = 50,
              cursor: str | None = None, shard: int | None = None) -> Page:
        """Ready jobs not yet delivered, oldest first in each shard (:class:`JobRow`)."""
        return drive(self.client, self.ops.listing(queue, shard, cursor, limit, lambda k, c, n:
                                                  _browse.ready(k, flt, limit=n, cursor=c)))

    def delayed(self, queue: str, state: str | None = None, flt: ListFilter | None = None, *,
                limit: int = 50, cursor: str | None = None, shard: int | None = None) -> Page:
        """Scheduled and retrying jobs by due time in each shard (``state`` keeps one)."""
        return drive(self.client, self.ops.listing(queue, shard, cursor, limit, lambda k, c, n:
                                                  _browse.delayed(k, state, flt, limit=n,
                                                                  cursor=c)))

    def recent(self, queue: str, event: str, flt: ListFilter | None = None, *,
               limit: int = 50, cursor: str | None = None, shard: int | None = None) -> Page:
        """Jobs with a recent ``event`` (completed, cancelled, ...) from the events streams."""
        return drive(self.client, self.ops.listing(queue, shard, cursor, limit, lambda k, c, n:
                                                  _browse.recent(k, event, flt, limit=n,
                                                                 cursor=c)))

    def timeline(self, queue: str, job_id: str, since_ms: int = 0,
                 at_ms: Sequence[int] = ()) -> Timeline:
        """The job's events: those at the times ``at_ms`` and the newest 1,000 since
        ``since_ms`` (see :class:`Timeline`)."""
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _browse.timeline(
            k, job_id, since_ms, at_ms)))

    def count_dead(self, queue: str, flt: DeadFilter | None = None, *,
                   shard: int | None = None) -> tuple[int, bool]:
        """Dead jobs matching ``flt``, reading at most 100,000 entries per shard."""
        return drive(self.client, self.ops.count_dead(queue, shard, flt or DeadFilter()))

    def last_minute(self, queue: str) -> tuple[int, int] | None:
        """Completed and failed in the last full minute, from the time series."""
        return drive(self.client, _browse.last_minute(self._k(queue)))

    def per_minute(self, queue: str) -> tuple[float, float] | None:
        """Completed and failed per minute over the last 60 s, from the time series."""
        return drive(self.client, _browse.per_minute(self._k(queue)))

    def series(self, queue: str, hours: bool = False) -> list[Point]:
        """The queue's time series: minute buckets (6 hours) or hour buckets (30 days)."""
        return drive(self.client, _browse.series(self._k(queue), hours))

    def lease(self, queue: str, job_id: str) -> Lease | None:
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _browse.lease(
            k, job_id)))

    def find_dead(self, queue: str, job_id: str, around_ms: int) -> DeadEntry | None:
        """A failed job's dead entry, looked up near its finish time (for :meth:`redrive`)."""
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _browse.find_dead(
            k, job_id, around_ms)))

    def workers(self, queue: str) -> list[WorkerInfo]:
        return drive(self.client, _browse.workers(self._k(queue)))

    def cron(self, queue: str) -> list[CronInfo]:
        return drive(self.client, _browse.cron_entries(self._k(queue)))

    def run_now(self, queue: str, job_id: str, *, who: str | None = None) -> str:
        """Make a scheduled or retrying job due now ('due now' or 'not run: job is ...')."""
        return drive(self.client, self.ops.by_id(queue, job_id, lambda k: _browse.run_now(
            k, self.config, job_id, who or _who())))

    def cancel(self, queue: str, job_id: str, *, who: str | None = None,
               wait_s: float | None = None) -> CancelResult:
        """Cancel a job (``Queue.cancel``: a running one is stopped by its worker; with
        ``wait_s``, wait for it to settle)."""
        check_cancel_wait(wait_s)
        res = drive(self.client, self.ops.by_id(queue, job_id, lambda k: _browse.cancel(
            k, self.config, job_id, who or _who())))

        def state() -> str:
            try:
                return self.job(queue, job_id).state
            except JobNotFound:
                return ""

        return wait_cancel(res, wait_s, state)

    def audit(self, queue: str, action: str, *, job_id: str = "", outcome: str = "",
              who: str | None = None) -> None:
        """Record an operator action in the queue's events stream (``ev`` = ``admin``)."""
        drive(self.client, _browse.audit(self._k(queue), self.config, who or _who(), action,
                                         job_id, outcome))


class AsyncAdmin:
    """The same operations as :class:`Admin`, awaitable."""

    def __init__(self, client: aredis.Redis, config: QueueConfig | None = None) -> None:
        self.client = client
        self.config = config or QueueConfig()
        self.url: str | None = None
        """The URL the client was built from (None for a client given as is)."""
        self.ops = _sh.QueueOps(self.config)
        """Whole-queue operations (every shard of a sharded queue; _ops/shards.py)."""

    @classmethod
    def from_url(cls, url: str, config: QueueConfig | None = None, **kwargs: Any
                 ) -> AsyncAdmin:
        """Over any URL form, as :meth:`Admin.from_url`."""
        admin = cls(async_client(url, **kwargs), config)
        admin.url = url
        return admin

    @classmethod
    def for_cluster(cls, url: str, config: QueueConfig | None = None, **kwargs: Any
                    ) -> AsyncAdmin:
        """Over a Redis Cluster given by one node's ``redis://`` URL; the same as
        ``from_url`` with the ``redis+cluster://`` form of the URL, which is the way to say
        it now."""
        return cls.from_url(as_cluster_url(url), config, **kwargs)

    async def client_for(self, queue: str) -> aredis.Redis:
        """The client that runs ``queue``'s operations (on a cluster the client itself routes
        each call to the node that owns the queue's slot)."""
        del queue
        return self.client

    async def _run(self, queue: str, op: Op[T]) -> T:
        return await adrive(self.client, op)

    async def close(self) -> None:
        await self.client.aclose()

    def _k(self, queue: str) -> Keys:
        return Keys(queue, self.config.key_prefix)

    async def check_server(self) -> tuple[int, ...]:
        """As :meth:`Admin.check_server`."""
        await averify(self.client, self.url)
        version = await adrive(self.client, _ops.server_version())
        _check_version(version)
        return version

    async def stats(self, queue: str, *, shard: int | None = None) -> QueueStats:
        return await self._run(queue, self.ops.stats(queue, shard))

    async def pending(self, queue: str, *, min_idle_s: float = 0, consumer: str | None = None,
                      count: int = 100, cursor: str | None = None, shard: int | None = None
                      ) -> Page:
        return await self._run(queue, self.ops.pending(
            queue, shard, min_idle_s=min_idle_s, consumer=consumer, count=count, cursor=cursor))

    async def job(self, queue: str, job_id: str) -> JobInfo:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _ops.job(
            k, self.config, job_id)))

    async def flow(self, queue: str, job_id: str, *, cursor: str | None = None,
                   limit: int = 100) -> FlowView:
        """As :meth:`Admin.flow`."""
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: self.ops.flow(
            k, job_id, cursor, limit)))

    async def requeue(self, queue: str, job_id: str, *, who: str | None = None) -> str:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _ops.requeue(
            k, self.config, job_id, who or _who())))

    async def find(self, queue: str | None = None, *, id: str | None = None,
             id_prefix: str | None = None, type: str | None = None, state: str | None = None,
             group: str | None = None, error: str | None = None, error_type: str | None = None,
             since_ms: int | None = None, until_ms: int | None = None,
             fields: Mapping[str, str] | None = None, limit: int = 50,
             cursor: str | None = None, max_scan: int = _search.SCAN_DEFAULT) -> SearchPage:
        """As :meth:`Admin.find`."""
        q = SearchQuery(queue, id, id_prefix, type, state, group, error, error_type, since_ms,
                        until_ms, dict(fields or {}))
        return await adrive(self.client, _search.find(
            q, prefix=self.config.key_prefix, limit=limit, cursor=cursor, max_scan=max_scan,
            serde=self.config.serde))

    async def dead(self, queue: str, flt: DeadFilter | None = None, *, limit: int = 100,
                   cursor: str | None = None, oldest_first: bool = False,
                   shard: int | None = None) -> Page:
        return await self._run(queue, self.ops.dead(
            queue, shard, flt or DeadFilter(), limit=limit, cursor=cursor,
            oldest_first=oldest_first))

    async def redrive(self, queue: str, entries: Sequence[DeadEntry], *, who: str | None = None
                      ) -> dict[str, int]:
        return await self._run(queue, self.ops.redrive(queue, entries, who or _who()))

    async def queues(self) -> list[str]:
        names: Any = await self.client.smembers(queues_key(self.config.key_prefix))
        return sorted(n.decode() for n in names)

    async def redrive_matching(self, queue: str, flt: DeadFilter | None = None,
                               max_jobs: int = 100_000) -> dict[str, int]:
        total: dict[str, int] = {}
        cursor: str | None = None
        while sum(total.values()) < max_jobs:
            page = await self.dead(queue, flt, limit=min(1000, max_jobs - sum(total.values())),
                                   cursor=cursor, oldest_first=True)
            if page.items:
                for k, v in (await self.redrive(queue, page.items)).items():
                    total[k] = total.get(k, 0) + v
            if page.cursor is None:
                break
            cursor = page.cursor
        return total

    async def purge(self, queue: str, state: str, max_jobs: int = 100_000, *,
                    shard: int | None = None) -> int:
        return await self._run(queue, self.ops.purge(queue, shard, state, max_jobs))

    async def pause(self, queue: str) -> None:
        await self._run(queue, self.ops.set_paused(queue, True))  # every shard

    async def resume(self, queue: str) -> None:
        await self._run(queue, self.ops.set_paused(queue, False))

    async def groups(self, queue: str, *, cursor: str | None = None, limit: int = 100,
                     shard: int | None = None) -> GroupPage:
        """As :meth:`Admin.groups`."""
        return await self._run(queue, self.ops.parts(queue, shard, lambda ps: _groups.groups(
            ps, self.config, cursor=cursor, limit=limit)))

    async def group(self, queue: str, group: str) -> GroupInfo:
        return await self._run(queue, self.ops.parts(queue, None, lambda ps: _groups.group(
            ps, self.config, group)))

    async def set_group_limit(self, queue: str, group: str, limit: int | None) -> None:
        await self._run(queue, self._set(queue, "limit", group, _groups.limit_arg(limit)))

    async def set_group_rate(self, queue: str, group: str, rate: GroupRate | None) -> None:
        await self._run(queue, self._set(queue, "rate", group, _groups.rate_arg(rate)))

    async def pause_group(self, queue: str, group: str) -> None:
        await self._run(queue, self._set(queue, "pause", group, ""))

    async def resume_group(self, queue: str, group: str) -> None:
        await self._run(queue, self._set(queue, "resume", group, ""))

    def _set(self, queue: str, op: str, group: str, value: str) -> Op[tuple[int, int, int]]:
        return self.ops.parts(queue, None, lambda ps: _groups.set_group(
            ps, self.config, op, group, value))

    async def consumers(self, queue: str, *, shard: int | None = None) -> list[ConsumerInfo]:
        return await self._run(queue, self.ops.concat(queue, shard, _ops.consumers))

    async def server(self) -> ServerInfo:
        """As :meth:`Admin.server`."""
        return await adetect(self.client)

    async def shard_slots(self, queue: str) -> list[ShardSlot]:
        """As :meth:`Admin.shard_slots`."""
        client = await self.client_for(queue)
        return await ashard_slots(client, await adrive(client, self.ops.shard_keys(queue)))

    async def reshard(self, queue: str, shards: int) -> ReshardStatus:
        """``Admin.reshard`` (docs/scaling.md#resharding)."""
        k = self._k(queue)
        return await _rs.areplicated(await self.client_for(queue), self.config, k,
                                     await self._run(queue, _rs.begin(k, self.config, shards)))

    async def reshard_status(self, queue: str) -> ReshardStatus:
        return await self._run(queue, _rs.status(self._k(queue), self.config))

    async def reshard_finish(self, queue: str) -> ReshardStatus:
        k = self._k(queue)
        return await _rs.areplicated(await self.client_for(queue), self.config, k,
                                     await self._run(queue, _rs.finish(k)))

    async def prune(self, queue: str, dead_after_s: float = 600.0) -> list[str]:
        return await self._run(queue, self.ops.concat(queue, None, lambda k: _ops.prune(
            k, dead_after_s)))

    async def ready(self, queue: str, flt: ListFilter | None = None, *, limit: int = 50,
                    cursor: str | None = None, shard: int | None = None) -> Page:
        return await self._run(queue, self.ops.listing(
            queue, shard, cursor, limit, lambda k, c, n: _browse.ready(k, flt, limit=n,
                                                                       cursor=c)))

    async def delayed(self, queue: str, state: str | None = None,
                      flt: ListFilter | None = None, *, limit: int = 50,
                      cursor: str | None = None, shard: int | None = None) -> Page:
        return await self._run(queue, self.ops.listing(
            queue, shard, cursor, limit, lambda k, c, n: _browse.delayed(
                k, state, flt, limit=n, cursor=c)))

    async def recent(self, queue: str, event: str, flt: ListFilter | None = None, *,
                     limit: int = 50, cursor: str | None = None, shard: int | None = None
                     ) -> Page:
        return await self._run(queue, self.ops.listing(
            queue, shard, cursor, limit, lambda k, c, n: _browse.recent(
                k, event, flt, limit=n, cursor=c)))

    async def timeline(self, queue: str, job_id: str, since_ms: int = 0,
                       at_ms: Sequence[int] = ()) -> Timeline:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _browse.timeline(
            k, job_id, since_ms, at_ms)))

    async def count_dead(self, queue: str, flt: DeadFilter | None = None, *,
                         shard: int | None = None) -> tuple[int, bool]:
        return await self._run(queue, self.ops.count_dead(queue, shard, flt or DeadFilter()))

    async def last_minute(self, queue: str) -> tuple[int, int] | None:
        return await self._run(queue, _browse.last_minute(self._k(queue)))

    async def per_minute(self, queue: str) -> tuple[float, float] | None:
        return await self._run(queue, _browse.per_minute(self._k(queue)))

    async def series(self, queue: str, hours: bool = False) -> list[Point]:
        return await self._run(queue, _browse.series(self._k(queue), hours))

    async def lease(self, queue: str, job_id: str) -> Lease | None:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _browse.lease(
            k, job_id)))

    async def find_dead(self, queue: str, job_id: str, around_ms: int) -> DeadEntry | None:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _browse.find_dead(
            k, job_id, around_ms)))

    async def workers(self, queue: str) -> list[WorkerInfo]:
        return await self._run(queue, _browse.workers(self._k(queue)))

    async def cron(self, queue: str) -> list[CronInfo]:
        return await self._run(queue, _browse.cron_entries(self._k(queue)))

    async def run_now(self, queue: str, job_id: str, *, who: str | None = None) -> str:
        return await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _browse.run_now(
            k, self.config, job_id, who or _who())))

    async def cancel(self, queue: str, job_id: str, *, who: str | None = None,
                     wait_s: float | None = None) -> CancelResult:
        check_cancel_wait(wait_s)
        res = await self._run(queue, self.ops.by_id(queue, job_id, lambda k: _browse.cancel(
            k, self.config, job_id, who or _who())))

        async def state() -> str:
            try:
                return (await self.job(queue, job_id)).state
            except JobNotFound:
                return ""

        return await await_cancel(res, wait_s, state)

    async def audit(self, queue: str, action: str, *, job_id: str = "", outcome: str = "",
                    who: str | None = None) -> None:
        await self._run(queue, _browse.audit(self._k(queue), self.config, who or _who(),
                                                action, job_id, outcome))
