"""The scheduler daemon: promotion on time, cron firing exactly once per tick, recovery sweeps.

No leadership: every transition is a Lua script, so several schedulers can run side by side;
the second one only costs some wasted round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

import attrs
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError

from streamq import InvalidArgument, QueueConfig
from streamq._core.config import _positive_seconds, start_wait_seconds
from streamq._core.conn import async_client, averify
from streamq._core.keys import DEFAULT_PRIORITY, GROUP, PRIORITIES, Keys, queues_key, shard_keys
from streamq._core.retry import acall
from streamq._core.scripts import SCRIPTS
from streamq._core.shards import Layout
from streamq._core.shards import check_layout as _check_layout
from streamq._core.shards import read as _read_layout
from streamq._core.supervise import (
    LoopHealth,
    Outage,
    Supervised,
    start_unless_stopped,
    start_waiting,
)
from streamq._worker.promote import Promoter
from streamq._worker.relay import Relay

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
    start_wait_s: float = attrs.field(default=0.0, validator=start_wait_seconds)
    """How long ``start()`` keeps trying again while Redis is not usable yet (as
    ``WorkerConfig.start_wait_s``); 0 = each set-up call's own few retries (about 3 s)."""


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
        self.consumer = f"scheduler:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._client_kwargs = client_kwargs
        self._client: aredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self.shards = {q: shard_keys(q, self.queue_config.shards, prefix) for q in self.queues}
        """Every shard's keys of each queue (shard 0 holds the cron state)."""
        self._promoters = {k.tag: Promoter(k, self.queue_config)
                           for ks in self.shards.values() for k in ks}
        """One per shard, by tag (a queue's name is its shard 0's tag)."""
        self._cursors = {t: "0-0" for t in self._promoters}
        self.promoted = 0
        self.fired = 0
        self.requeued = 0
        self._outage = Outage(log, f"scheduler {self.consumer}")
        self.loops = {name: Supervised(name, log, outage=self._outage, max_backoff_s=1.0)
                      for name in ("promotion", "cron", "sweep", "workflows")}
        self._relays = [Relay(k) for ks in self.shards.values() for k in ks]
        """The workflow relay and repair sweep of every shard (docs/workflows.md)."""
        self._cron_published = False
        self._layouts_due = 0.0
        self._resubscribe = False
        """The shards changed (a reshard): the wake-up subscription is made again."""

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
        """Connect, check the queues' layouts and start the loops; while Redis is not usable
        yet, tried again for up to ``SchedulerConfig.start_wait_s``."""
        if self._running:
            return
        await start_waiting(self._start_once, self.config.start_wait_s, log,
                            f"scheduler {self.consumer}")

    async def _start_once(self) -> None:
        client = async_client(self.url, **self._client_kwargs)
        try:  # idempotent calls, retried over transient errors; nothing left behind on failure
            # a URL of the wrong form (redis:// at a cluster node, …): one clear error
            await acall(lambda _retried: averify(client, self.url))
            await acall(lambda _retried: self._register(client))
            for k in self.queues.values():  # the stored layout: ShardCountMismatch
                lay = await acall(functools.partial(_shards_ok, client, k,
                                                    self.queue_config.shards))
                self._use_layout(k.queue, lay)  # every shard that may hold work
            for p in self._promoters.values():
                await acall(functools.partial(_sync, p, client))
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._running = True
        running = lambda: self._running  # noqa: E731
        self._tasks = [asyncio.create_task(self._promote_loop()),
                       asyncio.create_task(self.loops["sweep"].run(self._sweep_step, running)),
                       asyncio.create_task(self.loops["workflows"].run(self._flow_step,
                                                                       running))]
        if self.cron:
            self._tasks.append(asyncio.create_task(
                self.loops["cron"].run(self._cron_step_all, running)))
        log.info("scheduler %s started on %s with %d cron entries", self.consumer,
                 ", ".join(self.queues), len(self.cron))

    async def _register(self, client: aredis.Redis) -> None:
        try:
            await client.sadd(queues_key(self.queue_config.key_prefix), *self.queues)
        except NoPermissionError:  # an ACL user confined to its own queues' keys
            log.info("queue names not registered (no ACL permission)")

    def health(self) -> dict[str, LoopHealth]:
        """Each loop's consecutive failures and seconds since its last good round."""
        return {name: sup.health() for name, sup in self.loops.items()}

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []
        assert self._client is not None
        try:
            await self._client.aclose()
        except Exception as exc:  # noqa: BLE001 - closing a broken connection
            log.debug("closing the client: %s", exc)

    async def run(self) -> None:
        """Run until cancelled, SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                loop.add_signal_handler(sig, stop.set)
        if not await start_unless_stopped(self.start(), stop):  # a signal while it waited
            log.info("scheduler %s: stopped before it started", self.consumer)
            return
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ------------------------------------------------------------------ promotion

    async def _promote_loop(self) -> None:
        """Promote due jobs, sleeping until the next due time or a wake-up message. The
        wake-up subscription is optional: while it cannot be made (Redis restarting), the step
        polls every second, and resubscribes at the top of each round. One queue's failure
        does not stall the others; the supervisor logs and backs off whatever a round raises."""
        assert self._client is not None
        client = self._client
        pubsub: list[Any] = [None]
        errors: dict[str, Supervised] = {}

        async def step() -> float:
            sleep = self.config.poll_interval_s
            if self._resubscribe and pubsub[0] is not None:  # shards added or retired
                old, pubsub[0] = pubsub[0], None
                await _close(old)
            self._resubscribe = False
            if pubsub[0] is None:
                ps: Any = None
                try:  # pubsub() itself raises on clients without it (async cluster, redis-py < 8)
                    ps = client.pubsub(ignore_subscribe_messages=True)
                    await ps.subscribe(*(k.wake_channel for ks in self.shards.values()
                                         for k in ks))
                    pubsub[0] = ps
                except Exception as exc:  # noqa: BLE001 - optional: poll meanwhile
                    log.warning("wake-up channel unavailable (%s); polling", exc)
                    if ps is not None:
                        await _close(ps)
            for q, promoter in list(self._promoters.items()):
                if q not in errors:
                    errors[q] = Supervised(f"promotion on {q}", log, outage=self._outage)
                try:
                    more = True
                    while more and self._running:
                        moved, more = await promoter.run_once(client)
                        self.promoted += moved
                except Exception as exc:  # noqa: BLE001 - this queue only; others go on
                    await asyncio.sleep(min(errors[q].failed(exc), 1.0))
                    sleep = min(sleep, 1.0)
                    continue
                errors[q].ok()
                sleep = min(sleep, promoter.sleep_s(sleep))
            if pubsub[0] is None:
                return min(sleep, 1.0)
            try:
                await pubsub[0].get_message(timeout=sleep)  # a wake-up ends the sleep early
            except Exception as exc:  # noqa: BLE001
                log.warning("wake-up channel lost (%s); resubscribing", exc)
                ps, pubsub[0] = pubsub[0], None
                await _close(ps)
            return 0.0

        try:
            await self.loops["promotion"].run(step, lambda: self._running)
        finally:
            if pubsub[0] is not None:
                await _close(pubsub[0])

    async def _flow_step(self) -> float:
        """Every shard's workflow relay (one shard's error is the loop's: logged, retried)."""
        assert self._client is not None
        every = min(1.0, self.config.poll_interval_s)
        if time.monotonic() >= self._layouts_due:  # (about once a second)
            self._layouts_due = time.monotonic() + 1.0
            await self._follow_layouts()
        return min([await r.step(self._client, every) for r in list(self._relays)] or [every])

    async def _follow_layouts(self) -> None:
        """Serve the shards each queue's stored layout reads (a reshard adds shards, and its
        old ones are retired once drained): promotion, sweeps and relays follow."""
        from streamq._core.driver import adrive

        assert self._client is not None
        for q, k in self.queues.items():
            lay = await adrive(self._client, _read_layout(k))
            if lay is not None and len(self.shards[q]) != lay.read:
                self._use_layout(q, lay)
                for p in self._promoters.values():
                    if p.keys.queue == q:
                        await p.sync_clock(self._client)

    def _use_layout(self, queue: str, lay: Layout) -> None:
        """Serve shards 0 .. lay.read-1 of ``queue``."""
        n = lay.read
        if len(self.shards[queue]) == n:
            return
        old = {k.tag for k in self.shards[queue]}
        self.shards[queue] = shard_keys(queue, n, self.queue_config.key_prefix)
        new = {k.tag for k in self.shards[queue]}
        for tag in old - new:
            self._promoters.pop(tag, None)
            self._cursors.pop(tag, None)
        for k in self.shards[queue]:
            if k.tag not in self._promoters:
                self._promoters[k.tag] = Promoter(k, self.queue_config)
                self._cursors[k.tag] = "0-0"
        have = {r.keys.tag: r for r in self._relays}
        self._relays = [have.get(k.tag) or Relay(k) for ks in self.shards.values() for k in ks]
        self._resubscribe = True
        log.info("scheduler %s: %s now has %d shards to serve", self.consumer, queue, n)

    # ------------------------------------------------------------------ cron

    def _server_now_ms(self) -> int:
        """The server's clock, estimated from this host's monotonic clock (no host clock step
        moves it); fire.lua checks every tick against the server's own TIME."""
        return int(next(iter(self._promoters.values())).server_now_ms())

    async def _cron_step_all(self) -> float:
        """One round of cron: fire what is due, then sleep until the soonest next tick."""
        if not self._cron_published:
            await self._publish_cron_info()
            self._cron_published = True
        now = self._server_now_ms()
        soonest = now + int(self.config.poll_interval_s * 1000)
        failed: Exception | None = None
        for entry in self.cron:
            try:
                next_tick = await self._cron_step(entry, now)
            except Exception as exc:  # noqa: BLE001 - one entry's failure stalls no other
                failed = exc
                next_tick = now + 1000
            soonest = min(soonest, next_tick)
        if failed is not None:
            raise failed  # logged (rate-limited) and backed off by the supervisor
        return max(0.0, (soonest - self._server_now_ms()) / 1000)

    async def _cron_step(self, entry: Cron, now: int) -> int:
        """Fire the entry's due tick if any; return when to look at the entry again."""
        assert self._client is not None
        keys = self.queues[entry.queue]
        raw: Any = await self._client.hget(keys.cron, f"{entry.name}:last")
        latest = entry.latest_at_or_before(now)
        if raw is None:
            # never fired: start from now (the first tick after the entry appeared)
            if latest is not None and latest >= now - 1000:
                return await self._fire(entry, latest, "fire")
            await self._client.hsetnx(keys.cron, f"{entry.name}:last", now)
            return entry.next_after(now)
        last = int(raw)
        if latest is not None and latest > last:
            late_ms = now - latest
            if entry.catch_up == "once" or late_ms <= self.config.on_time_s * 1000:
                return await self._fire(entry, latest, "fire")
            log.info("cron %s: skipping missed tick %d", entry.name, latest)
            return await self._fire(entry, latest, "skip")
        return entry.next_after(now)

    async def _fire(self, entry: Cron, tick: int, mode: str) -> int:
        """Fire (or, mode 'skip', only mark) one tick; return when to look at the entry again:
        the next tick, or this one again soon when the server says it is still to come (this
        host's clock runs ahead of the server's)."""
        from streamq._core.driver import adrive
        from streamq._producer import relayout

        assert self._client is not None
        client = self._client
        home = self.queues[entry.queue]
        # routed by the stored layout, read for each tick (a reshard's frozen shard refuses
        # another count: STREAMQ_LAYOUT, this round fails and the next reads it again)
        lay = await acall(lambda _r: adrive(client, relayout.opened(home, self.queue_config)))
        cfg = self.queue_config if lay.shards == self.queue_config.shards else attrs.evolve(
            self.queue_config, shards=lay.shards)
        p = entry.prepare(home, cfg, tick)
        if mode == "fire" and lay.prev:  # fired before the reshard, into its old home?
            found = await acall(lambda _r: adrive(client, relayout.look(home, cfg, lay, [p],
                                                                        False)))
            mode = "skip" if found else mode
        keys = home.of_shard(p.shard)  # the tick's job id decides its shard (and cron hash)
        info = json.dumps({**entry.describe(), "last_tick_ms": tick, "last_job": p.job_id,
                           "next_tick_ms": entry.next_after(tick)})
        reply = await SCRIPTS["fire"].run_async(
            self._client,
            [keys.stream, keys.delayed, keys.stats, keys.events, p.key, keys.cron],
            [self.queue_config.events_arg, keys.wake_channel, entry.name, tick, info,
             *p.args, mode, lay.shards])
        status = reply[0].decode()
        if status in ("queued", "scheduled"):  # counted before the mirror's await: a stop
            # there must not leave a fired tick uncounted
            self.fired += 1
            log.info("cron %s fired tick %d as job %s", entry.name, tick, p.job_id)
        if p.shard != 0 and status != "future":
            await self._mirror_cron(home, entry.name, tick, info if status in (
                "queued", "scheduled", "duplicate") else None)
        if status == "future":
            promoter = self._promoters[entry.queue]
            await promoter.sync_clock(self._client)  # our estimate ran ahead: read it again
            return tick + 50
        return entry.next_after(tick)

    async def _mirror_cron(self, home: Keys, name: str, tick: int, info: str | None) -> None:
        """A sharded queue's tick fired (exactly once, by fire.lua) in the cron hash of its
        job's shard; shard 0's cron hash, which decides the next tick to try and which ops
        read, learns it here. Not atomic with the firing, and need not be: a tick tried
        again meets its own shard's record and is 'stale' (nothing written)."""
        assert self._client is not None
        raw: Any = await self._client.hget(home.cron, f"{name}:last")
        if raw is not None and int(raw) >= tick:
            return
        fields: Any = {f"{name}:last": tick}
        if info is not None:
            fields[name] = info
        await self._client.hset(home.cron, mapping=fields)

    async def _publish_cron_info(self) -> None:
        """Make every entry visible to ops before its first firing (next tick, definition).
        Raises what Redis raises: the cron round is then retried as a whole."""
        assert self._client is not None
        now = self._server_now_ms()
        for entry in self.cron:
            keys = self.queues[entry.queue]
            info = {**entry.describe(), "next_tick_ms": entry.next_after(now)}
            old: Any = await self._client.hget(keys.cron, entry.name)
            try:
                prior = json.loads(old) if old else {}
            except ValueError:  # damaged by hand: written anew below
                prior = {}
            if isinstance(prior, dict):
                info.update({k: prior[k] for k in ("last_tick_ms", "last_job") if k in prior})
            await self._client.hset(keys.cron, entry.name, json.dumps(info))

    # ------------------------------------------------------------------ recovery sweeps

    async def _sweep_step(self) -> float:
        await asyncio.sleep(self.config.sweep_interval_s)
        failed: Exception | None = None
        for q in self.queues:
            try:
                await self.sweep(q)
            except Exception as exc:  # noqa: BLE001 - one queue's failure stalls no other
                if "NOGROUP" not in str(exc):  # no worker made the group yet: nothing pending
                    failed = exc
        if failed is not None:
            raise failed
        return 0.0

    async def sweep(self, queue: str) -> int:
        """Hand back lapsed entries of a queue (every shard) that has no live worker;
        returns how many."""
        handed = 0
        for keys in self.shards[queue]:
            try:
                handed += await self._sweep_shard(keys)
            except Exception as exc:
                if "NOGROUP" not in str(exc) or len(self.shards[queue]) == 1:
                    raise
        return handed

    async def _sweep_shard(self, shard: Keys) -> int:
        """Every priority level's stream of one shard (docs/fairness.md#priorities)."""
        assert self._client is not None
        now = self._server_now_ms()
        alive = await self._client.zcount(
            shard.workers, now - int(self.config.workers_gone_after_s * 1000), "+inf")
        if alive:
            return 0  # live workers reclaim lapsed leases themselves
        handed = await self._sweep_level(shard)
        for p in sorted({int(v) for v in await self._client.smembers(shard.levels)
                         if v.isdigit() and int(v) in PRIORITIES} - {DEFAULT_PRIORITY}):
            try:
                handed += await self._sweep_level(shard.at_level(p))
            except Exception as exc:  # a level no worker has read yet has no group
                if "NOGROUP" not in str(exc):
                    raise
        return handed

    async def _sweep_level(self, keys: Keys) -> int:
        assert self._client is not None
        queue = keys.tag
        self._cursors.setdefault(queue, "0-0")
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
                args: list[Any] = [GROUP, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                                   self.consumer, cfg.group_arg]
                for eid, jid in pairs:
                    args += [eid, jid]
                res = await SCRIPTS["requeue"].run_async(
                    self._client,
                    [keys.stream, keys.dead, keys.stats, keys.events,
                     *(keys.job(j) if j else keys.job("-") for _, j in pairs),
                     *keys.group_keys], args)
                handed += sum(1 for x in res if x == b"requeued")
            if self._cursors[queue] == "0-0":
                break
        if handed:
            log.info("swept %s: handed back %d lapsed entries", queue, handed)
        self.requeued += handed
        return handed


async def _sync(promoter: Promoter, client: aredis.Redis, _retried: bool) -> None:
    await promoter.sync_clock(client)


async def _close(pubsub: Any) -> None:
    try:
        await pubsub.aclose()
    except Exception as exc:  # noqa: BLE001 - closing a broken subscription
        log.debug("closing the wake-up subscription: %s", exc)


async def _shards_ok(client: aredis.Redis, keys: Keys, shards: int, _retried: bool
                    ) -> Layout:
    from streamq._core.driver import adrive

    return await adrive(client, _check_layout(keys, shards))
