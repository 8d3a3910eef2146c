"""The worker's fetch path: claim.lua under a backlog, a blocking read when idle, recovery.

One fetch loop per queue shard (``Fetching._fetch_step``), in this order of preference:

1. this consumer's own pending entries (at start, and after any error that may have lost a
   reply: they are started with start.lua, which answers a start already made by this worker
   as the same start, so a lost claim.lua reply burns no attempt);
2. lapsed leases of any consumer when a reclaim is due (XAUTOCLAIM, cursor kept);
3. new work: claim.lua reads and starts a batch in one script (one round trip per batch, no
   ownership check per entry). When a claim returns fewer entries than asked, the streams
   are drained: the loop then waits with a blocking ``XREADGROUP COUNT 1`` (one entry per
   stream at most, never a burst), starts what it got with start.lua, and claims again.

The Worker mixes this class in; the state it uses is the Worker's (declared below).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from .._core import telemetry as tel
from .._core.config import QueueConfig, WorkerConfig
from .._core.keys import GROUP, Keys
from .._core.retry import transient
from .._core.scripts import SCRIPTS
from .._core.supervise import Outage, Supervised
from .lease import LeaseKeeper
from .state import QState, WorkerStats

log = logging.getLogger("streamq.worker")
_BATCH = 1000
_CLAIM_WIDTH = 10
"""Values per entry in claim.lua's reply."""


class Fetching:
    """Fetch, claim and start: the part of the Worker that turns stream entries into leases."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        consumer: str
        config: WorkerConfig
        queue_config: QueueConfig
        stats: WorkerStats
        _client: aredis.Redis | None
        _running: bool
        _capacity: asyncio.Event
        _sup: dict[str, Supervised]
        _outage: Outage
        _leases: LeaseKeeper
        _token_prefix: str
        _next_token: int

        def _reserve(self, want: int) -> int: ...
        def _release(self, n: int) -> None: ...
        def _launch(self, qs: QState, entry: str, job_id: str, token: str, attempt: int,
                    data: bytes, times: tuple[int, int, int]) -> None: ...

    @classmethod
    async def _ensure_group_retried(cls, client: aredis.Redis, keys: Keys, _retried: bool
                                    ) -> None:
        await cls._ensure_group(client, keys)

    @staticmethod
    async def _ensure_group(client: aredis.Redis, keys: Keys) -> None:
        try:
            await client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _busy(self, qs: QState, entry: str) -> bool:
        """This worker runs the entry under a live lease (or its outcome awaits settling)."""
        return self._leases.holds(qs.keys.tag, entry)

    def _take_tokens(self, n: int) -> int:
        """Reserve n lease tokens (numbers); returns the first."""
        first = self._next_token
        self._next_token += n
        return first

    def _fetch_step(self, qs: QState) -> Any:
        """One round of fetching for one queue: own pending entries first, lapsed leases when
        a reclaim is due, new entries otherwise (claim.lua, or a blocking read when the
        stream was found drained). The step alone owns the capacity it reserves; whatever it
        raises, the supervisor logs and retries."""
        loop = asyncio.get_running_loop()

        async def step() -> float:
            client = self._client
            assert client is not None
            if qs.paused:
                return 0.2
            await self._capacity.wait()
            # at most half the slots per fetch: one batch starts while another settles
            n = self._reserve(min(self.config.fetch_batch,
                                  max(1, self.config.concurrency // 2)))
            if n == 0:
                return 0.0
            mode = "new"
            try:
                if qs.starting and (qs.own_cursor is not None or loop.time() >= qs.next_reclaim):
                    # reading own entries or reclaiming must not meet a batch still starting
                    await asyncio.wait(set(qs.starting))
                if qs.own_cursor is not None:  # entries delivered to this consumer name earlier
                    entries = await self._read_own(qs, n)
                    mode = "own"
                elif loop.time() >= qs.next_reclaim:
                    entries = await self._reclaim(qs, n)
                    mode = "reclaim"
                    if qs.cursor == "0-0":  # a full sweep is done; the next one when due
                        qs.next_reclaim = loop.time() + self.config.reclaim_every_s
                elif not qs.idle:
                    await self._claim(qs, n)
                    return 0.0
                else:  # the stream was drained: wait for one entry, then claim again
                    reply: Any = await client.xreadgroup(
                        GROUP, self.consumer, {qs.keys.stream: ">"}, count=1,
                        block=min(self.config.block_ms,
                                  max(1, int((qs.next_reclaim - loop.time()) * 1000))))
                    entries = reply[0][1] if reply else []
                    if entries:
                        qs.idle = False
            except BaseException as exc:
                self._release(n)
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    await self._ensure_group(client, qs.keys)  # deleted under us: make it again
                    return 0.0
                if isinstance(exc, Exception):
                    qs.own_cursor = "0"  # a lost reply may have delivered entries: read them
                raise
            self._release(n - len(entries))
            if entries:  # start in the background: the next read overlaps this round trip
                task = asyncio.create_task(self._start_batch(qs, entries, mode))
                qs.starting.add(task)
                task.add_done_callback(qs.starting.discard)
                if len(entries) < n:  # no backlog: let the start go out before the next read
                    await asyncio.sleep(0)
            return 0.0

        return step

    async def _claim(self, qs: QState, n: int) -> None:
        """Read and start up to n new entries with claim.lua (n slots are reserved; this
        frees what it does not use, and on an error all n: the caller reads its own pending
        entries next, which finds the entries of a call whose reply was lost)."""
        client = self._client
        assert client is not None
        k = qs.keys
        first = self._take_tokens(n)
        reply = await SCRIPTS["claim"].run_async(client, *claim_call(
            k, self.consumer, self.queue_config, self._token_prefix, first, n))
        status = reply[0]
        if status == b"paused":
            qs.paused = True  # seen before the flag poll: stop fetching at once
            self._release(n)
            return
        if reply[1]:  # the group is gone (deleted under us): make it again
            await self._ensure_group(client, k)
        got = (len(reply) - 2) // _CLAIM_WIDTH
        if got < n:
            qs.idle = True
        launched = 0
        for i in range(2, len(reply), _CLAIM_WIDTH):
            (_level, eid, jid, code, token, attempt, data, deadline, wait_ms,
             age_ms) = reply[i:i + _CLAIM_WIDTH]
            if code != b"run":
                if code == b"paused":
                    qs.paused = True
                continue
            launched += 1
            self._launch(qs, eid.decode(), jid.decode(), token.decode(), int(attempt), data,
                         (int(deadline), int(wait_ms), int(age_ms)))
        if launched:
            self.stats.started += launched
            tel.STARTED.add(launched, qs.labels)
        self._release(n - launched)

    async def _read_own(self, qs: QState, n: int) -> list[Any]:
        assert self._client is not None and qs.own_cursor is not None
        reply: Any = await self._client.xreadgroup(
            GROUP, self.consumer, {qs.keys.stream: qs.own_cursor}, count=n)
        raw: list[Any] = reply[0][1] if reply else []
        qs.own_cursor = raw[-1][0].decode() if raw else None
        return [e for e in raw if not self._busy(qs, e[0].decode())]

    async def _reclaim(self, qs: QState, n: int) -> list[Any]:
        """Take over up to n entries whose lease lapsed (XAUTOCLAIM; the cursor is kept).
        Entries of this worker's own lost leases are taken like any other: the handler that
        lost its lease is fenced out, the job runs again."""
        assert self._client is not None
        min_idle = int(self.config.visibility_timeout_s * 1000)
        reply: Any = await self._client.xautoclaim(
            qs.keys.stream, GROUP, self.consumer, min_idle, qs.cursor, count=n)
        qs.cursor = reply[0].decode()
        entries = [e for e in reply[1] if not self._busy(qs, e[0].decode())]
        if entries:
            log.info("reclaiming %d lapsed entries of %s", len(entries), qs.keys.queue)
        return entries

    async def _start_batch(self, qs: QState, entries: list[Any], mode: str) -> None:
        """Start delivered entries (capacity for all of them is already reserved); mode is
        'new', 'reclaim' or 'own' (own pending entries: a job active under a token of this
        worker is a start whose reply was lost, answered as the same start).

        start.lua is safe to repeat with the same tokens, so a call that meets a transient
        error (its reply possibly lost after it ran) is sent again, the same, until Redis
        answers: a job is never counted as started twice for one start."""
        client = self._client
        assert client is not None
        k = qs.keys
        good: list[tuple[str, str, str]] = []
        bad: list[tuple[str, str]] = []
        ghosts: list[str] = []
        for entry_id, fields in entries:
            eid = entry_id.decode()
            if fields is None:
                ghosts.append(eid)
                continue
            raw = fields.get(b"id")
            try:
                good.append((eid, raw.decode(), f"{self._token_prefix}{self._take_tokens(1):x}"))
            except (AttributeError, UnicodeDecodeError):
                bad.append((eid, repr(fields)[:500]))
        calls = [good[i:i + _BATCH] for i in range(0, len(good), _BATCH)] or [[]]
        unreleased = len(entries)
        resume = self._token_prefix if mode == "own" else ""
        sup = self._sup.setdefault(f"start on {k.tag}", Supervised(
            f"start on {k.tag}", log, outage=self._outage))
        try:
            while True:
                try:
                    if ghosts:
                        await client.xack(k.stream, GROUP, *ghosts)
                        unreleased -= len(ghosts)
                        self._release(len(ghosts))
                        ghosts = []
                    while calls:
                        part = calls[0]
                        if part or bad:
                            reply = await SCRIPTS["start"].run_async(
                                client, *start_call(k, self.consumer, self.queue_config, part,
                                                    bad, resume))
                            unreleased -= len(part) + len(bad)
                            self._started(qs, part, reply, len(bad), mode == "reclaim")
                        bad = []
                        calls.pop(0)
                    sup.ok()
                    return
                except Exception as exc:
                    if not transient(exc) or not self._running:
                        raise
                    await asyncio.sleep(sup.failed(exc))
        except asyncio.CancelledError:
            self._release(unreleased)
            raise
        except Exception as exc:  # noqa: BLE001 - entries stay pending, reclaimed later
            sup.failed(exc)
            log.warning("start on %s gave up (%s); its entries stay pending", k.queue, exc)
            self._release(unreleased)
            qs.own_cursor = "0"

    def _started(self, qs: QState, part: list[tuple[str, str, str]], reply: Any,
                 malformed: int, reclaimed: bool) -> None:
        """Launch what start.lua said to run; free the slots of everything else."""
        launched = 0
        skipped = malformed
        for n, (eid, jid, _token) in enumerate(part):
            code, token, attempt, data, deadline, wait_ms, age_ms = reply[7 * n:7 * n + 7]
            if code != b"run":
                skipped += 1
                if code == b"paused":
                    qs.paused = True  # seen before the flag poll: stop fetching at once
                continue
            launched += 1
            self._launch(qs, eid, jid, token.decode(), int(attempt), data,
                         (int(deadline), int(wait_ms), int(age_ms)))
        if launched:
            self.stats.started += launched
            tel.STARTED.add(launched, qs.labels)
            if reclaimed:
                self.stats.reclaimed += launched
                tel.RECLAIMED.add(launched, qs.labels)
        self._release(skipped)


def start_call(k: Keys, consumer: str, cfg: QueueConfig, part: Sequence[tuple[str, str, str]],
               bad: Sequence[tuple[str, str]], resume: str = "") -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one start.lua call: (entry, job id, token) per entry to start, and
    (entry, description) per malformed entry; resume: the worker's token prefix when these
    are its own pending entries read again."""
    keys = [k.stream, k.dead, k.stats, k.events, k.paused, *(k.job(j) for _, j, _t in part)]
    args: list[Any] = [GROUP, consumer, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                       resume, len(part)]
    for eid, jid, token in part:
        args += [eid, jid, token]
    args.append(len(bad))
    for eid, desc in bad:
        args += [eid, desc]
    keys += k.group_keys  # a grouped job starts through its group's gate
    args.append(cfg.group_arg)
    return keys, args


def claim_call(k: Keys, consumer: str, cfg: QueueConfig, token_prefix: str, first: int, n: int
               ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one claim.lua call: up to n entries, tokens from number first on."""
    keys = [k.dead, k.stats, k.events, k.paused, k.stream, *k.group_keys]
    args: list[Any] = [GROUP, consumer, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                       k.job(""), token_prefix, first, n, n, cfg.group_arg]
    return keys, args
