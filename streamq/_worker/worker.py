"""The worker: fetch (fetch.py), start, run handlers, settle outcomes in batches, recover.

Every background loop (fetch per queue, settle per queue, heartbeat, pause flags, promotion,
pruning, lease renewal) runs supervised (``_supervise``): any error is logged, backed off and
retried; only ``stop()`` ends them. ``health()`` says how long ago each last made progress.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import logging
import os
import secrets
import signal
import socket
from collections.abc import Sequence
from types import CodeType
from typing import Any

import attrs
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError

from .._core import telemetry as tel
from .._core.args import check_queue_list
from .._core.config import QueueConfig, WorkerConfig
from .._core.conn import async_client, averify, server_address, sync_client
from .._core.errors import StartupFailed
from .._core.keys import DEFAULT_PRIORITY, queues_key, shard_keys
from .._core.queues import publish_types
from .._core.retry import acall
from .._core.sends import Kept, inline_sends
from .._core.supervise import (
    LoopHealth,
    Outage,
    Supervised,
    start_unless_stopped,
    start_waiting,
)
from .attempt import Attempts
from .cancel import CancelWatch
from .eager import Carrier
from .fetch import Fetching
from .housekeeping import Housekeeper
from .invoke import SyncRunner
from .lease import Lease, LeaseKeeper
from .owners import Owning
from .pool import ProcessPool, registry_spec
from .progress import Progress
from .registry import Registry
from .reshard import Resharding
from .running import Running
from .settle import Settler
from .slots import Slots
from .state import Finish, QState, WorkerStats
from .watchdog import LoopWatchdog

log = logging.getLogger("streamq.worker")
_instance = itertools.count()
__all__ = ["Finish", "Worker", "WorkerStats"]


class Worker(Owning, Resharding, Fetching, Running):
    """Runs registered handlers for jobs of one or more queues.

    ``worker.run()`` blocks until SIGTERM/SIGINT; inside a running service use
    ``async with worker:`` or ``await worker.start()`` / ``await worker.stop()``.
    """

    def __init__(self, url: str, queues: Sequence[str], registry: Registry,
                 config: WorkerConfig | None = None, queue_config: QueueConfig | None = None,
                 *, consumer: str | None = None, pool: str | None = None,
                 **client_kwargs: Any) -> None:
        check_queue_list(queues)  # a str would iterate into one-letter queues
        self.config = config or WorkerConfig()
        if pool is not None:  # (the same as WorkerConfig(pool=...))
            self.config = attrs.evolve(self.config, pool=pool)
        self.queue_config = queue_config or QueueConfig()
        self.registry = registry
        self.url = url
        if not queues:
            raise ValueError("a worker needs at least one queue")
        # the random part keeps names apart for containers that share a hostname and a pid
        self.consumer = consumer or (f"{socket.gethostname()}:{os.getpid()}:{next(_instance)}"
                                     f":{secrets.token_hex(3)}")
        self._client_kwargs = client_kwargs
        self._names = list(dict.fromkeys(queues))
        # one QState (fetch loop, settling, promotion, ...) per shard of each queue, by tag
        self._qs = {k.tag: QState(k, labels=tel.attrs_for(q)) for q in self._names
                    for k in shard_keys(q, self.queue_config.shards,
                                        self.queue_config.key_prefix)}
        self._fetchers = len(self._qs)
        """Fetch loops (one per shard of each queue); lanes of other levels join _qs later."""
        self._slots = Slots(self.config.concurrency, self._fetchers)
        """The free slots, and the fetch loops' turns at them (slots.py)."""
        self.stats = WorkerStats()
        self._attempts = Attempts(self.config, self.queue_config, registry, self.stats)
        self._unsettled = 0
        """Outcomes handed to the flush loops and not settled yet, over all queues."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._jobs: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Running handler tasks by (queue, entry), for stop() to cancel the leftovers."""
        self._to_start: list[tuple[QState, Lease, int, bytes, tuple[int, int, int]]] = []
        """Jobs launched (their leases held) whose first step has not run yet (_start_jobs)."""
        self._later = 0
        """Jobs of the batch being started whose first step runs after this one's."""
        self._carrier: Carrier | None = None
        """The parked task the next job that has to wait runs in (eager.py)."""
        self._job_ctx = contextvars.copy_context()
        """What each job's context is a copy of: the context ``start()`` ran in, so that
        nothing a handler sets reaches another job (one started from its settling call)."""
        self._loops: list[asyncio.Task[None]] = []
        self._flushers: list[asyncio.Task[None]] = []
        self._running = False
        self._settling = False
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()
        self._watchdog: LoopWatchdog | None = None
        self._progress: Progress | None = None
        self._client: aredis.Redis | None = None
        self._runner: SyncRunner | None = None
        self.pool: ProcessPool | None = None
        """The process pool of isolated handlers while running (None without one)."""
        self._settler: Settler | None = None
        self._hk: Housekeeper | None = None
        self._cancels: CancelWatch | None = None
        self._sup: dict[str, Supervised] = {}
        self._token_prefix = secrets.token_hex(5)
        self._no_handoff = False
        """ticket.lua was refused for good: no hand-offs for this worker (fetch.py)."""
        self._next_token = 1
        self._outage = Outage(log, f"worker {self.consumer}")
        self._init_resharding()
        self._leases = LeaseKeeper(self._sync_client, self.consumer, self.config.renew_every_s,
                                   self._outage)

    @classmethod
    def from_url(cls, url: str, *, queues: Sequence[str], registry: Registry,
                 concurrency: int | None = None, visibility_timeout: float | None = None,
                 config: WorkerConfig | None = None, queue_config: QueueConfig | None = None,
                 **kwargs: Any) -> Worker:
        cfg = config or WorkerConfig()
        if concurrency is not None:
            cfg = attrs.evolve(cfg, concurrency=concurrency)
        if visibility_timeout is not None:
            cfg = attrs.evolve(cfg, visibility_timeout_s=visibility_timeout)
        return cls(url, queues, registry, cfg, queue_config, **kwargs)

    def _handler_codes(self) -> dict[CodeType, str]:
        """Code objects of the registered async handlers (the watchdog names a blocking job)."""
        out: dict[CodeType, str] = {}
        for spec in self.registry.specs():
            code = getattr(inspect.unwrap(spec.fn), "__code__", None)
            if isinstance(code, CodeType) and spec.is_async:
                out[code] = spec.name
        return out

    def _sync_client(self) -> Any:
        return sync_client(self.url, **self._client_kwargs)

    @property
    def queues(self) -> list[str]:
        """The queues this worker serves."""
        return list(self._names)

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._running

    def health(self) -> dict[str, LoopHealth]:
        """Each background loop's consecutive failures and seconds since its last good round
        (a loop waiting for work also shows its wait); the errors themselves are logged."""
        loops = dict(self._sup)
        if self._hk is not None:
            loops.update(self._hk.loops)
        if self._settler is not None:
            loops.update(self._settler.loops)
        if self._progress is not None:
            loops["progress reports"] = self._progress.loop_state
        loops["lease renewal"] = self._leases.loop
        return {name: sup.health() for name, sup in loops.items()}

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect, create the consumer groups, and start fetching in background tasks.

        Safe to repeat: the set-up calls are idempotent and retried over transient errors;
        while Redis is not usable yet, the whole start is tried again for up to
        ``WorkerConfig.start_wait_s``; when it fails anyway, nothing is left behind and
        ``start()`` may be called again."""
        if self._running:
            return
        await start_waiting(self._start_once, self.config.start_wait_s, log,
                            f"worker {self.consumer}")

    async def _start_once(self) -> None:
        timeout = self.config.block_ms / 1000 + 10
        client = async_client(self.url, socket_timeout_s=timeout, **self._client_kwargs)
        inline_sends(client)  # every command's write goes out at once (no task per write)
        hk: Housekeeper | None = None
        try:
            # a URL of the wrong form (redis:// at a cluster node, …): one clear error
            await acall(lambda _retried: averify(client, self.url))
            await acall(lambda _retried: self._register(client))
            # the queue's stored layout (ShardCountMismatch): serve every shard it reads
            await self._check_layouts(client)
            queues = self._shards()
            hk = Housekeeper(client, self.config, self.consumer, queues, self._outage)
            for qs in queues:
                await acall(functools.partial(self._ensure_group_retried, client, qs.keys))
                # every priority level in use gets its group and lane before anything runs
                await acall(functools.partial(self._refresh_levels_retried, client, qs))
            # producers with require_handler refuse types that no worker has registered
            await acall(lambda _retried: publish_types(
                client, [q.keys for q in queues if q.keys.shard == 0], self.registry.names()))
            # never fetch from a queue that is already paused
            await acall(lambda _retried: hk.refresh_paused())
            if self._owning() and self._sharded():  # seen live before the first fetch,
                # and our shards known
                self._warn_slow_owner_handover()
                await acall(lambda _retried: hk.beat())
                await acall(lambda _retried: self._refresh_owners(client))
            if tel.metering():  # every counter and gauge there from the first scrape
                tel.zero_counters(self._names, self.registry.names())
                self._attempts.started.zero(self._names, self.registry.names())
                await self._first_gauges(hk)
            self.pool = await self._start_pool()
            if self.config.pool != "process":  # (with every handler in children: theirs only)
                await self.registry.lifecycle.start()  # startup hooks (once per process)
        except BaseException:
            if self.pool is not None:
                await self.pool.close()
                self.pool = None
            await client.aclose()
            raise
        self._attempts.pool = self.pool
        self._client, self._hk = client, hk
        self._settler = Settler(client, self.queue_config, self._leases, self.stats,
                                self.consumer, self._settled_n, self._outage)
        # a job a settling call releases (a workflow step) is handed to this worker
        self._settler.hand_args = self._finish_hand_args
        self._settler.on_handed = self._finish_handed
        threads = self.config.sync_threads or self.config.concurrency
        self._runner = SyncRunner(threads, self.config.max_abandoned_threads or threads, log)
        self._attempts.runner = self._runner
        self._attempts.server = server_address(self.url)
        self._attempts.known_types = frozenset(self.registry.names())
        self._attempts.series = hk.series
        self._attempts.deps_client = client
        self._progress = self._attempts.progress = Progress(client, self.queue_config,
                                                            self._outage)
        self._token_prefix = secrets.token_hex(5)  # a start of an earlier run is not ours
        self._job_ctx = contextvars.copy_context()
        for qs in queues:
            self._prepare(qs)
        for qs in self._qs.values():
            qs.settles = Kept()
        self._running = True
        self._settling = True
        self._stopped.clear()
        self._hurry.clear()
        self._jobs.clear()
        self._unsettled = sum(len(qs.buf) for qs in self._qs.values())
        self._slots = Slots(self.config.concurrency - self._owed(), self._fetchers)
        self._leases = LeaseKeeper(self._sync_client, self.consumer, self.config.renew_every_s,
                                   self._outage)
        self._leases.start()
        self._settler.leases = self._leases
        self._cancels = CancelWatch(client, queues, self._leases, self._outage,
                                    [qs.keys.inbox(self._token_prefix) for qs in queues])
        hk.loops["cancel requests"] = self._cancels.loop
        self._loops.append(self._cancels.task(lambda: self._running))
        for qs in self._qs.values():  # one settling loop per lane (shard and level)
            self._flushers.append(asyncio.create_task(
                self._settler.flush_loop(qs, self._settling_on(qs))))
        tel.register_gauges(self, hk.gauge_values)
        self._loops.extend(hk.tasks(lambda: self._running))
        for qs in queues:  # each shard's fetch and housekeeping loops
            self._shard_loops(qs)
        self._loops.append(self._layout_loop())  # shards a reshard adds or retires
        owners = self._owners_loop()  # which shards this worker fetches new work from
        if owners is not None:
            self._loops.append(owners)
        self._loops.append(asyncio.create_task(self._progress.run(lambda: self._running)))
        if self.config.loop_stall_warn_s is not None:
            self._watchdog = LoopWatchdog(asyncio.get_running_loop(),
                                          self.config.loop_stall_warn_s, self._handler_codes, log)
            self._watchdog.start()
        log.info("worker %s started on %s (concurrency %d)", self.consumer,
                 ", ".join(self._names), self.config.concurrency)

    async def _first_gauges(self, hk: Housekeeper) -> None:
        try:
            await hk.first_gauges()
        except Exception as exc:  # noqa: BLE001 - the gauges loop reads them again soon
            log.warning("queue gauges not read at start: %s: %s", type(exc).__name__, exc)
            hk.gauges_read = True

    async def _start_pool(self) -> ProcessPool | None:
        """The process pool, started, when some handler runs isolated; else None."""
        if self.config.pool != "process" and not any(
                s.isolation == "process" for s in self.registry.specs()):
            return None
        spec = self.config.pool_registry or registry_spec(self.registry)
        if spec is None:
            raise StartupFailed("of the process pool", LookupError(
                "the pool's children import the registry by module path, and none of the"
                " handlers' modules holds it as a global: pass"
                " WorkerConfig(pool_registry='myapp.tasks:registry')"))
        size = self.config.pool_size or os.cpu_count() or 1
        pool = ProcessPool(size, spec, self.queue_config.serde,
                           max_jobs_per_child=self.config.max_jobs_per_child,
                           max_memory_per_child_mb=self.config.max_memory_per_child_mb,
                           start_timeout_s=self.config.pool_start_timeout_s,
                           names=self.registry.names())
        await pool.start()
        return pool

    async def _register(self, client: aredis.Redis) -> None:
        try:
            await client.sadd(queues_key(self.queue_config.key_prefix), *self._names)
        except NoPermissionError:  # an ACL user confined to its own queues' keys
            log.info("queue names not registered in %s (no ACL permission): `streamq stats`"
                     " needs them named", queues_key(self.queue_config.key_prefix))

    async def stop(self) -> None:
        """Stop fetching, let in-flight jobs finish within the grace period, hand back the rest.
        Never raises for what Redis says: what cannot be settled or handed back now recovers
        after the visibility timeout."""
        if not self._running:
            return
        self._running = False  # every loop also ends on its own (a cancellation racing a
        for t in self._loops:  # client timeout can surface as TimeoutError on Python 3.11)
            t.cancel()
        await asyncio.wait(self._loops, timeout=5)
        await self._leave_owners()  # the other workers take this one's shards now
        if self._client is not None and all(t.done() for t in self._loops):
            for qs in self._qs.values():  # the fetch loops' reading connections
                await qs.reads.release(self._client)
        self._loops.clear()
        for qs in self._qs.values():  # no hand-off to a stopping worker
            if qs.ticket:
                try:  # what was handed over meanwhile runs in the grace period
                    self._settle_slots(0, await asyncio.wait_for(self._ticket(qs, 0), 2.0))
                except Exception as exc:  # noqa: BLE001 - stop() never raises for Redis
                    log.debug("hand-off ticket not withdrawn at stop (it lapses): %s", exc)
        starting = {t for qs in self._qs.values() for t in qs.starting}
        if starting:  # a batch being started: let its jobs launch (they get the grace period)
            await asyncio.wait(starting, timeout=5)
            for t in starting:
                t.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
        if self._settler is not None:  # nothing renews what runs no handler: back at once
            await self._settler.hand_back(list(self._qs.values()), self._token_prefix,
                                          unleased_only=True)
        if self._tasks and not self._hurry.is_set():
            log.info("worker %s stopping: waiting up to %g s for %d running jobs (a second"
                     " SIGINT/SIGTERM stops at once and hands them back)", self.consumer,
                     self.config.grace_period_s, len(self._tasks))
            await self._grace()
        leftover = [task for task in self._jobs.values() if not task.done()]
        if leftover:
            log.info("worker %s: handing back %d jobs that did not finish", self.consumer,
                     len(leftover))
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        self._sweep_tasks()
        self._settling = False  # flushers settle what is buffered, then end
        for qs in self._qs.values():
            qs.flush.set()
        await asyncio.wait(self._flushers, timeout=self.config.grace_period_s)
        for t in self._flushers:
            t.cancel()
        await asyncio.gather(*self._flushers, return_exceptions=True)
        self._flushers.clear()
        if self._carrier is not None:  # (after the last settling call: nothing starts now)
            self._carrier.drop()  # the parked carrier carries nothing
            self._carrier = None
        for qs in self._qs.values():  # the settling connections
            await qs.settles.release(self._client)
        tel.unregister_gauges(self)
        assert self._settler is not None and self._runner is not None
        if self._hk is not None:
            try:  # the last counts for the charts, best effort
                await asyncio.wait_for(self._hk.flush_series(), 2.0)
            except Exception as exc:  # noqa: BLE001 - stop() never raises for Redis
                log.debug("charts not flushed at stop: %s", exc)
        try:
            await self._settler.hand_back(list(self._qs.values()), self._token_prefix)
        finally:
            self._leases.stop()
            if self._watchdog is not None:
                self._watchdog.stop()
                self._watchdog = None
            self._runner.shutdown()
            if self.pool is not None:  # what still runs was handed back: no child outlives us
                await self.pool.close()
                self.pool = self._attempts.pool = None
            assert self._client is not None
            try:
                await self._client.aclose()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                log.debug("closing the client: %s", exc)
            try:  # shutdown hooks, after the last job was settled or handed back
                if self.config.pool != "process":
                    await self.registry.lifecycle.stop()
            finally:
                self._stopped.set()
        log.info("worker %s stopped: %s", self.consumer, self.stats.summary(),
                 extra={"stats": self.stats.fields()})

    async def _grace(self) -> None:
        """Wait for the running jobs, at most the grace period or until ``hurry()``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.config.grace_period_s
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            while not self._hurry.is_set() and loop.time() < end:
                self._sweep_tasks()
                if not self._tasks:
                    break
                await asyncio.wait({*self._tasks, hurry}, timeout=end - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()

    def hurry(self) -> None:
        """Cut a graceful stop short: running jobs are cancelled and handed back now."""
        self._hurry.set()

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully; a second signal stops at once
        (running jobs are handed back, nothing is lost)."""
        asyncio.run(self._run_until_signal())

    async def _run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            if not stop.is_set():
                log.info("worker %s: %s received, stopping gracefully", self.consumer,
                         sig.name)
                stop.set()
            elif not self._hurry.is_set():
                log.warning("worker %s: second %s: stopping now; running jobs are handed back",
                            self.consumer, sig.name)
                self.hurry()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        if not await start_unless_stopped(self.start(), stop):  # a signal while it waited
            log.info("worker %s: stopped before it started", self.consumer)
            return
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ----------------------------------------------------------------- fetching

    def _shards(self) -> list[QState]:
        """The state of each shard of each queue (one fetch loop each; not its other lanes)."""
        return [qs for qs in self._qs.values() if qs.keys.level == DEFAULT_PRIORITY]

    def _lane_added(self, lane: QState) -> None:
        self._qs[lane.keys.tag] = lane
        if self._settling and self._settler is not None:
            self._flushers.append(asyncio.create_task(
                self._settler.flush_loop(lane, self._settling_on(lane))))

    def _release(self, n: int) -> None:
        self._slots.release(n)

    def _owed(self) -> int:
        """Slots kept by finished handlers whose outcomes wait to be settled: none while at
        most ``concurrency`` outcomes wait, so a slot is free again as soon as its handler
        returns, and a worker holds at most twice ``concurrency`` leases."""
        return max(0, self._unsettled - self.config.concurrency)

    def _settled_n(self, n: int) -> None:
        before = self._owed()
        self._unsettled -= n
        self._release(before - self._owed())
