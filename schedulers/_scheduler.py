"""The scheduler daemon: promotion on time, cron firing exactly once per tick, recovery sweeps.

No leadership: every transition is a Lua script, so several schedulers can run side by side;
the second one only costs some wasted round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Sequence
from typing import Any

import attrs
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError, ResponseError

from streamq import InvalidArgument, QueueConfig, ScriptError
from streamq._config import _positive_seconds
from streamq._conn import async_client
from streamq._keys import GROUP, Keys, queues_key
from streamq._promote import Promoter
from streamq._retry import TRANSIENT
from streamq._scripts import SCRIPTS

from ._entries import Cron

log = logging.getLogger("streamq.scheduler")
_SWEEP_BATCH = 100
_SWEEP_ROUNDS = 10  # batches per queue per sweep (loops are capped)


@attrs.frozen
class SchedulerConfig:
    poll_interval_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    """Longest sleep when nothing is due; a wake-up message ends it sooner."""
    sweep_interval_s: float = attrs.field(default=10.0, validator=_positive_seconds)
    visibility_timeout_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    """Pending entries idle this long are handed back by a sweep (queues with no live worker)."""
    workers_gone_after_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    """A queue whose workers have not sent a heartbeat for this long has no live worker."""
    on_time_s: float = attrs.field(default=60.0, validator=_positive_seconds)
    """With catch_up='skip', a tick this late still fires (it is late, not missed)."""


class Scheduler:
    """Promotes delayed/retry jobs, fires cron entries and sweeps for lapsed leases."""

    def __init__(self, url: str, queues: Sequence[str], cron: Sequence[Cron] = (),
                 config: SchedulerConfig | None = None, queue_config: QueueConfig | None = None,
                 **client_kwargs: Any) -> None:
        self.url = url
        self.config = config or SchedulerConfig()
        self.queue_config = queue_config or QueueConfig()
        prefix = self.queue_config.key_prefix
        self.queues = {q: Keys(q, prefix) for q in queues}
        names = [c.name for c in cron]
        if len(set(names)) != len(names):
            raise InvalidArgument("cron entry names must be unique")
        self.cron = list(cron)
        for c in self.cron:
            self.queues.setdefault(c.queue, Keys(c.queue, prefix))
        self.consumer = f"scheduler:{socket.gethostname()}:{os.getpid()}"
        self._client_kwargs = client_kwargs
        self._client: aredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self._promoters = {q: Promoter(k, self.queue_config) for q, k in self.queues.items()}
        self._cursors = {q: "0-0" for q in self.queues}
        self.promoted = 0
        self.fired = 0
        self.requeued = 0

    @classmethod
    def from_url(cls, url: str, *, queues: Sequence[str], cron: Sequence[Cron] = (),
                 config: SchedulerConfig | None = None,
                 queue_config: QueueConfig | None = None, **kwargs: Any) -> Scheduler:
        return cls(url, queues, cron, config, queue_config, **kwargs)

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._running:
            return
        self._client = async_client(self.url, **self._client_kwargs)
        try:
            await self._client.sadd(queues_key(self.queue_config.key_prefix), *self.queues)
        except NoPermissionError:  # an ACL user confined to its own queues' keys
            log.info("queue names not registered (no ACL permission)")
        for p in self._promoters.values():
            await p.sync_clock(self._client)
        self._running = True
        self._tasks = [asyncio.create_task(self._promote_loop()),
                       asyncio.create_task(self._sweep_loop())]
        if self.cron:
            self._tasks.append(asyncio.create_task(self._cron_loop()))
        log.info("scheduler %s started on %s with %d cron entries", self.consumer,
                 ", ".join(self.queues), len(self.cron))

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []
        assert self._client is not None
        await self._client.aclose()

    async def run(self) -> None:
        """Run until cancelled, SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ------------------------------------------------------------------ promotion

    async def _promote_loop(self) -> None:
        """Promote due jobs, sleeping until the next due time or a wake-up message. The
        wake-up subscription is optional: while it cannot be made (Redis restarting), the loop
        polls every second, and resubscribes at the top of each round."""
        assert self._client is not None
        pubsub: Any = None
        try:
            while self._running:
                sleep = self.config.poll_interval_s
                if pubsub is None:
                    try:
                        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                        await pubsub.subscribe(*(k.wake_channel for k in self.queues.values()))
                    except TRANSIENT as exc:
                        log.warning("wake-up channel unavailable (%s); polling", exc)
                        await pubsub.aclose()
                        pubsub = None
                for q, promoter in self._promoters.items():
                    try:
                        more = True
                        while more and self._running:
                            moved, more = await promoter.run_once(self._client)
                            self.promoted += moved
                    except TRANSIENT as exc:
                        log.warning("promotion on %s failed: %s", q, exc)
                        sleep = min(sleep, 1.0)
                        continue
                    except (ScriptError, ResponseError):
                        log.exception("promotion on %s failed", q)
                        sleep = min(sleep, 1.0)
                        continue
                    sleep = min(sleep, promoter.sleep_s(sleep))
                if pubsub is None:
                    await asyncio.sleep(min(sleep, 1.0))
                    continue
                try:
                    await pubsub.get_message(timeout=sleep)  # a wake-up ends the sleep early
                except TRANSIENT as exc:
                    log.warning("wake-up channel lost (%s); resubscribing", exc)
                    await pubsub.aclose()
                    pubsub = None
        finally:
            if pubsub is not None:
                await pubsub.aclose()

    # ------------------------------------------------------------------ cron

    def _server_now_ms(self) -> int:
        return int(next(iter(self._promoters.values())).server_now_ms())

    async def _cron_loop(self) -> None:
        assert self._client is not None
        await self._publish_cron_info()
        while self._running:
            now = self._server_now_ms()
            soonest = now + int(self.config.poll_interval_s * 1000)
            for entry in self.cron:
                try:
                    next_tick = await self._cron_step(entry, now)
                except TRANSIENT as exc:
                    log.warning("cron %s: %s", entry.name, exc)
                    next_tick = now + 1000
                except Exception:  # e.g. OOM or READONLY during a failover: try again soon
                    log.exception("cron %s failed", entry.name)
                    next_tick = now + 1000
                soonest = min(soonest, next_tick)
            await asyncio.sleep(max(0.0, (soonest - self._server_now_ms()) / 1000))

    async def _cron_step(self, entry: Cron, now: int) -> int:
        """Fire the entry's due tick if any; return the time of its next tick."""
        assert self._client is not None
        keys = self.queues[entry.queue]
        raw: Any = await self._client.hget(keys.cron, f"{entry.name}:last")
        latest = entry.latest_at_or_before(now)
        if raw is None:
            # never fired: start from now (the first tick after the entry appeared)
            if latest is not None and latest >= now - 1000:
                await self._fire(entry, latest)
            else:
                await self._client.hsetnx(keys.cron, f"{entry.name}:last", now)
            return entry.next_after(now)
        last = int(raw)
        if latest is not None and latest > last:
            late_ms = now - latest
            if entry.catch_up == "once" or late_ms <= self.config.on_time_s * 1000:
                await self._fire(entry, latest)
            else:
                log.info("cron %s: skipping missed tick %d", entry.name, latest)
                await self._client.hset(keys.cron, f"{entry.name}:last", latest)
        return entry.next_after(now)

    async def _fire(self, entry: Cron, tick: int) -> None:
        assert self._client is not None
        keys = self.queues[entry.queue]
        p = entry.prepare(keys, self.queue_config, tick)
        info = json.dumps({**entry.describe(), "last_tick_ms": tick, "last_job": p.job_id,
                           "next_tick_ms": entry.next_after(tick)})
        reply = await SCRIPTS["fire"].run_async(
            self._client,
            [keys.stream, keys.delayed, keys.stats, keys.events, p.key, keys.cron],
            [self.queue_config.events_maxlen, keys.wake_channel, entry.name, tick, info,
             *p.args])
        status = reply[0].decode()
        if status in ("queued", "scheduled"):
            self.fired += 1
            log.info("cron %s fired tick %d as job %s", entry.name, tick, p.job_id)

    async def _publish_cron_info(self) -> None:
        """Make every entry visible to ops before its first firing (next tick, definition)."""
        assert self._client is not None
        now = self._server_now_ms()
        for entry in self.cron:
            keys = self.queues[entry.queue]
            info = {**entry.describe(), "next_tick_ms": entry.next_after(now)}
            try:
                old: Any = await self._client.hget(keys.cron, entry.name)
                if old:
                    prior = json.loads(old)
                    info.update({k: prior[k] for k in ("last_tick_ms", "last_job") if k in prior})
                await self._client.hset(keys.cron, entry.name, json.dumps(info))
            except TRANSIENT as exc:
                log.warning("cron %s: could not publish its info: %s", entry.name, exc)

    # ------------------------------------------------------------------ recovery sweeps

    async def _sweep_loop(self) -> None:
        while self._running:
            await asyncio.sleep(self.config.sweep_interval_s)
            for q in self.queues:
                try:
                    await self.sweep(q)
                except TRANSIENT as exc:
                    log.warning("sweep of %s failed: %s", q, exc)
                except (ScriptError, ResponseError) as exc:
                    if "NOGROUP" not in str(exc):
                        log.exception("sweep of %s failed", q)

    async def sweep(self, queue: str) -> int:
        """Hand back lapsed entries of a queue that has no live worker; returns how many."""
        assert self._client is not None
        keys = self.queues[queue]
        now = self._server_now_ms()
        alive = await self._client.zcount(
            keys.workers, now - int(self.config.workers_gone_after_s * 1000), "+inf")
        if alive:
            return 0  # live workers reclaim lapsed leases themselves
        min_idle = int(self.config.visibility_timeout_s * 1000)
        handed = 0
        cfg = self.queue_config
        for _ in range(_SWEEP_ROUNDS):
            reply: Any = await self._client.xautoclaim(
                keys.stream, GROUP, self.consumer, min_idle, self._cursors[queue],
                count=_SWEEP_BATCH)
            self._cursors[queue] = reply[0].decode()
            pairs: list[tuple[str, str]] = []
            for eid, fields in reply[1]:
                jid = (fields or {}).get(b"id", b"")
                pairs.append((eid.decode(), jid.decode(errors="replace")))
            if pairs:
                args: list[Any] = [GROUP, cfg.events_maxlen, cfg.dead_ttl_s, cfg.dead_maxlen,
                                   self.consumer]
                for eid, jid in pairs:
                    args += [eid, jid]
                res = await SCRIPTS["requeue"].run_async(
                    self._client,
                    [keys.stream, keys.dead, keys.stats, keys.events,
                     *(keys.job(j) if j else keys.job("-") for _, j in pairs)], args)
                handed += sum(1 for x in res if x == b"requeued")
            if self._cursors[queue] == "0-0":
                break
        if handed:
            log.info("swept %s: handed back %d lapsed entries", queue, handed)
        self.requeued += handed
        return handed
