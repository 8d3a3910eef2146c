"""Settling: outcomes written with finish.lua in batches, counted when Redis confirms them,
and unfinished work handed back when a worker stops."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import attrs
import redis.asyncio as aredis

from .._core import durable
from .._core import telemetry as tel
from .._core.config import QueueConfig
from .._core.keys import GROUP, RECENT_KEEP, Keys
from .._core.retry import transient
from .._core.scripts import SCRIPTS, pack_run, pack_strs
from .._core.supervise import Outage, Supervised
from .lease import LeaseKeeper
from .state import Finish, QState, WorkerStats

_ENTRY, _TOKEN = itemgetter(1), itemgetter(2)  # a Finish's entry and token
log = logging.getLogger("streamq.worker")
_BATCH = 1000
_PERMANENT_TRIES = 3
_HANDED_ROW = 10
"""Values per job finish.lua handed to its caller (after the outcomes)."""
_HAND_BACK_S = 5.0
"""How long a stopping worker keeps trying to hand its jobs back through transient errors."""
"""A batch that meets a permanent (non-transient) error this many times in a row is dropped
from this worker: its entries stay pending and are taken over after the visibility timeout."""


@attrs.frozen
class _FinishCall:
    """The fixed part of one lane's finish.lua calls (its keys and config arguments)."""

    keys: list[str]
    group_keys: list[str]
    args: list[Any]
    group_arg: str
    job: str
    """The job record key without the id (``Keys.job('')``)."""
    marker: str
    """This worker's finish marker on the lane (``Keys.finished``): a repeated call still
    answers 'completed' for a fire-and-forget job whose record its first run deleted."""
    recent: str
    """The recent completions list of the lane's shard (``Keys.recent``, dashboard)."""
    p_keys: bytes = b""
    """``keys`` packed once (``scripts.pack_run``): the fixed runs of a packed call."""
    p_keys2: bytes = b""
    """The keys after the jobs' (``group_keys``, ``marker``, ``recent``), packed."""
    p_args: bytes = b""
    """``args`` packed."""
    p_tail: bytes = b""
    """``group_arg`` and ``RECENT_KEEP`` packed."""

    @classmethod
    def make(cls, keys: list[str], group_keys: list[str], args: list[Any], group_arg: str,
             job: str, marker: str, recent: str) -> _FinishCall:
        return cls(keys, group_keys, args, group_arg, job, marker, recent, pack_run(keys),
                   pack_run([*group_keys, marker, recent]), pack_run(args),
                   pack_run((group_arg, RECENT_KEEP)))


class Settler:
    """Settles one worker's outcomes. finish.lua is safe to repeat, so a batch that meets a
    transient error (a dropped connection, OOM, READONLY, BUSY, LOADING) is sent again, the
    same, until Redis takes it: an outcome is never given up while the worker runs."""

    def __init__(self, client: aredis.Redis, config: QueueConfig, leases: LeaseKeeper,
                 stats: WorkerStats, consumer: str, on_settled: Callable[[int], None],
                 outage: Outage | None = None) -> None:
        self.client = client
        self.config = config
        self.leases = leases
        self.stats = stats
        self.consumer = consumer
        self.on_settled = on_settled
        self.loops: dict[str, Supervised] = {}
        self.outage = outage
        self.unreplicated = durable.Unreplicated(log)
        self._calls: dict[str, _FinishCall] = {}
        """Each lane's fixed part of a finish.lua call, by lane tag."""
        self.hand_args: Callable[[QState], list[Any]] | None = None
        """finish.lua's hand-off arguments for a lane ([] = none): the worker takes the jobs
        a call releases (docs/workflows.md#hand-off)."""
        self.on_handed: Callable[[QState, list[Sequence[Any]], float, int], None] | None = None
        """Runs the jobs a call with hand_args released and started for the worker: the
        lane, their rows (finish.lua's; none when the call failed), when (time.monotonic)
        the call was sent, and how many slots hand_args reserved for them."""

    async def flush_loop(self, qs: QState, settling: Callable[[], bool]) -> None:
        """Settle the outcomes buffered for ``qs``, a batch per call, until the worker stops
        settling and the buffer is empty (the worker's stop() bounds that wait)."""
        name = f"settling on {qs.keys.tag}"
        sup = self.loops[name] = Supervised(name, log, max_backoff_s=2.0, outage=self.outage)
        permanent = [0]

        async def step() -> float:
            if not qs.buf or qs.sending:  # (a lone job's own call in flight: settle_now)
                qs.settle_idle = True
                try:
                    await qs.flush.wait()
                finally:
                    qs.settle_idle = False
                qs.flush.clear()
                return 0.0
            try:
                await self.settle_batch(qs)
            except Exception as exc:
                if transient(exc):
                    raise
                permanent[0] += 1
                if permanent[0] < _PERMANENT_TRIES:
                    raise
                permanent[0] = 0
                self.drop_batch(qs, exc)
                return 0.0
            permanent[0] = 0
            return 0.0

        await sup.run(step, lambda: settling() or bool(qs.buf))

    async def settle_now(self, qs: QState) -> None:
        """Settle the buffered outcome(s) at once, from the caller's task: a lone job whose
        settling loop is idle sends its own outcome, two event-loop turns sooner than the
        loop would (woken, then its supervisor's yield). Whatever fails is left buffered for
        the settling loop, which logs it, backs off and sends it again."""
        try:
            await self.settle_batch(qs, lone=True)
        except Exception as exc:  # noqa: BLE001 - the settling loop retries (and logs it)
            log.debug("settling on %s from a job's task failed (%s); the settling loop"
                      " retries", qs.keys.tag, exc)
        finally:
            if qs.buf:
                qs.flush.set()

    async def settle_batch(self, qs: QState, lone: bool = False) -> None:
        """One finish.lua call for the head of the buffer (one call at a time per lane).
        ``lone``: a lone job's own call, behind a PING so that Redis writes its waiter's
        message before this reply (``Script.run_async``'s ping_first)."""
        k = qs.keys
        cfg = self.config
        batch = qs.buf[:_BATCH]
        call = self._calls.get(k.tag)
        if call is None:  # the lane's fixed keys and arguments, built once
            call = self._calls[k.tag] = _FinishCall.make(
                [k.stream, k.delayed, k.dead, k.stats, k.events], k.group_keys,
                [GROUP, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen, k.wake_channel],
                cfg.group_arg, k.job(""), k.finished(self.consumer), k.recent)
        job = call.job
        jobs = [job + b[0] for b in batch]
        _, _, _, o, _, x, e = batch[0] if batch else ("", "", "", "", b"", 0, "")
        n = len(batch)
        shared = n > 1
        empty = True  # (every result b'': None, not sent)
        if shared:
            for b in batch:
                if b[3] != o or b[5] != x or b[6] != e:
                    shared = False
                    break
                if b[4]:
                    empty = False
        var: list[Any]
        per: list[str] = []  # (the compact form's per-job values, when all are str)
        if shared:
            # finish.lua's compact form: the outcome, delay or reason and error type every
            # attempt shares, once, and each job's id read from its key (a batch of
            # successes: 3 arguments per job, not 7; 2 when every handler returned None)
            var = [-n, o, x, e, len(job.encode())]
            if empty:
                var.append(0)
                per = [""] * (2 * n)  # entry, token, entry, token, ... (C loops: no
                per[0::2] = map(_ENTRY, batch)  # bytecode per job)
                per[1::2] = map(_TOKEN, batch)
            else:
                var.append(1)
                add = var.extend
                for b in batch:
                    add((b[1], b[2], b[4]))
        else:
            var = [len(batch)]
            for b in batch:
                var.extend(b)
        hand = self.hand_args(qs) if self.hand_args is not None else []
        script = SCRIPTS["finish"]
        packed = b""
        if not cfg.min_replicas and script.packable(self.client):
            # the lane's fixed keys and arguments packed once, the rest now (same bytes)
            nkeys = len(call.keys) + len(jobs) + len(call.group_keys) + 2
            packed = script.packed(
                nkeys, nkeys + len(call.args) + len(var) + len(per) + 2 + len(hand), (
                    call.p_keys, pack_strs(jobs), call.p_keys2, call.p_args, pack_run(var),
                    pack_strs(per), call.p_tail, pack_run(hand)))
            keys: list[str] = []
            args: list[Any] = []
        else:
            # (a settled grouped job frees its group's slot: the group keys)
            keys = [*call.keys, *jobs, *call.group_keys, call.marker, call.recent]
            args = [*call.args, *var, *per, call.group_arg, RECENT_KEEP, *hand]
        qs.settle_calls += 1
        qs.sending = True
        sent = time.monotonic()
        try:
            if cfg.min_replicas:  # each call followed by a WAIT
                (reply,), (acked,) = await durable.arun(SCRIPTS["finish"], self.client,
                                                        [(keys, args)], cfg)
            elif packed:  # on the lane's own connection (one call at a time: qs.sending)
                reply = await script.run_packed_async(self.client, packed, kept=qs.settles,
                                                      ping_first=lone)
                acked = 0
            else:
                reply = await script.run_async(self.client, keys, args, kept=qs.settles,
                                               ping_first=lone)
                acked = 0
        except BaseException:
            if hand:  # a lost reply may have handed this worker a job: its own entries
                qs.own_cursor = "0"
                if self.on_handed is not None:
                    self.on_handed(qs, [], sent, int(hand[3]))  # (its slots back)
            raise
        finally:
            qs.sending = False
            qs.settled.set()
        if hand and self.on_handed is not None:  # jobs it released and started for this
            # worker: run them first (the bookkeeping below can wait)
            handed = reply[len(batch):]
            reply = reply[:len(batch)]
            self.on_handed(qs, [handed[i:i + _HANDED_ROW]
                                for i in range(0, len(handed), _HANDED_ROW)], sent,
                           int(hand[3]))
        del qs.buf[:len(batch)]
        self.leases.remove_settled(k.tag, batch)
        completed = 0
        types = qs.job_types
        by_type: dict[str, int] = {}
        if not types and len(reply) == n and reply.count(b"completed") == n:
            completed = n  # every one completed, and no types to count: no loop
        else:
            for b, state in zip(batch, reply, strict=True):
                if state == b"completed":  # counted once per batch (and type)
                    completed += 1
                    if types:  # (metrics recorded: by job type)
                        jtype = types.pop(b[1], "?")
                        by_type[jtype] = by_type.get(jtype, 0) + 1
                else:
                    self.count(qs, b, state)
        if completed:
            self.stats.completed += completed
            for jtype, count in (by_type or {"?": completed}).items():
                tel.COMPLETED.add(count, tel.job_attrs(k.queue, jtype))
        self.on_settled(len(batch))
        if cfg.min_replicas:
            self.unreplicated.note(k.queue, len(batch), acked, cfg)

    def drop_batch(self, qs: QState, exc: BaseException) -> None:
        """Never expected (finish.lua guards its reads): give the batch up on this worker."""
        batch = qs.buf[:_BATCH]
        log.error("settling %d jobs of %s failed for good (%s); they recover by reclaim after"
                  " the visibility timeout", len(batch), qs.keys.queue, exc)
        del qs.buf[:len(batch)]
        self.leases.remove_many(qs.keys.tag, [(b[1], b[2]) for b in batch])
        for b in batch:
            self.count(qs, b, b"lost")
        self.on_settled(len(batch))

    def count(self, qs: QState, item: Finish, state: bytes) -> None:
        job_id = item[0]
        extra = {"job_id": job_id, "queue": qs.keys.queue}
        jtype = qs.job_types.pop(item[1], "?") if qs.job_types else "?"
        labels = tel.job_attrs(qs.keys.queue, jtype)
        if state == b"completed":
            self.stats.completed += 1
            tel.COMPLETED.add(1, labels)
        elif state == b"retrying" and item[3] == "children":  # WaitForChildren: no counter
            pass
        elif state == b"retrying" and item[3] in ("later", "later_group"):  # RateLimited
            self.stats.rate_limited += 1
            tel.RATE_LIMITED.add(1, labels)
        elif state == b"retrying":
            self.stats.retried += 1
            tel.RETRIED.add(1, labels)
        elif state == b"cancelled":  # a cancel requested while it ran (cancel.py)
            self.stats.cancelled += 1
            tel.CANCELLED.add(1, labels)
        elif state == b"failed":  # (the attempt's failure is logged where it happened)
            self.stats.failed += 1
            tel.FAILED.add(1, labels)
        else:
            self.stats.lost += 1
            tel.LEASE_LOST.add(1, labels)
            log.warning("job %s: lease lost before settling; result discarded", job_id,
                        extra=extra)

    async def hand_back(self, queues: list[QState], token_prefix: str,
                        unleased_only: bool = False) -> None:
        """Release jobs this worker started but did not finish, and entries it never started
        (its whole pending list, page by page), without consuming an attempt (release.lua:
        token_prefix marks the starts of this run of the worker). unleased_only: only the
        pending entries of no lease this worker holds (delivered, or started without the
        worker reading the reply: nothing renews them, so they go back before the grace
        period, not after it). A transient error is tried again for a few seconds
        (release.lua is safe to repeat): a hand-back that does not happen leaves the job to
        lapse, and a lapsed lease counts its attempt. Never raises: what cannot be handed
        back recovers after the visibility timeout."""
        for qs in queues:
            k = qs.keys
            items: dict[str, tuple[str, str]] = {}
            leased: set[str] = set()
            for lease in self.leases.snapshot():
                if lease.keys.tag == k.tag:
                    if unleased_only:
                        leased.add(lease.entry)
                    else:
                        items[lease.entry] = (lease.job_id, lease.token)
            sup = Supervised(f"hand-back on {k.tag}", log, max_backoff_s=0.5)
            deadline = asyncio.get_running_loop().time() + _HAND_BACK_S
            while True:
                try:
                    await self._hand_back(k, items, token_prefix, leased)
                    break
                except Exception as exc:  # noqa: BLE001 - stop() must end whatever Redis says
                    if (not transient(exc)
                            or asyncio.get_running_loop().time() >= deadline):
                        log.warning("could not hand back jobs of %s (%s: %s); they recover"
                                    " after the visibility timeout", k.queue,
                                    type(exc).__name__, exc)
                        break
                    await asyncio.sleep(sup.failed(exc))
            for eid in items:
                self.leases.remove(k.tag, eid)

    async def _hand_back(self, k: Keys, items: dict[str, tuple[str, str]],
                         token_prefix: str, leased: set[str]) -> None:
        """One try of hand_back for one lane: its pending list read (but the entries in
        leased), then released."""
        after = "0"
        while True:
            reply: Any = await self.client.xreadgroup(
                GROUP, self.consumer, {k.stream: after}, count=_BATCH)
            page = reply[0][1] if reply else []
            for eid, fields in page:
                jid = (fields or {}).get(b"id")
                e = eid.decode()
                if jid and e not in items and e not in leased:
                    items[e] = (jid.decode(errors="replace"), "")
            if len(page) < _BATCH:
                break
            after = page[-1][0].decode()
        todo = list(items.items())
        for i in range(0, len(todo), _BATCH):
            part = todo[i:i + _BATCH]
            keys = [k.stream, k.stats, k.events, *(k.job(j) for _, (j, _t) in part)]
            args: list[Any] = [GROUP, self.config.events_arg, self.consumer, token_prefix]
            for eid, (jid, token) in part:
                args += [jid, eid, token]
            released = await SCRIPTS["release"].run_async(self.client, keys, args)
            self.stats.released += sum(released)
