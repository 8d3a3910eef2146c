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
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from .._core import telemetry as tel
from .._core.config import QueueConfig, WorkerConfig
from .._core.keys import DEFAULT_PRIORITY, GROUP, Keys, levels_in_use
from .._core.retry import transient
from .._core.scripts import SCRIPTS
from .._core.sends import xreadgroup
from .._core.supervise import Outage, Supervised
from .calls import CLAIM_HEAD, ClaimPack, claim_call, claim_read, lease_tokens, start_call
from .handoff import TICKET_SLACK_MS, HandOff, inbox_row
from .lease import Lease, LeaseKeeper, new_lease
from .slots import Slots
from .state import QState, WorkerStats

log = logging.getLogger("streamq.worker")
_BATCH = 1000
_LEVELS_EVERY_S = 1.0
"""How often a fetch loop reads its shard's levels SET (priority levels in use)."""
class Fetching(HandOff):
    """Fetch, claim and start: the part of the Worker that turns stream entries into leases."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        consumer: str
        config: WorkerConfig
        queue_config: QueueConfig
        stats: WorkerStats
        _client: aredis.Redis | None
        _running: bool
        _slots: Slots
        _sup: dict[str, Supervised]
        _outage: Outage
        _leases: LeaseKeeper
        _token_prefix: str
        _next_token: int
        _no_handoff: bool

        def _release(self, n: int) -> None: ...
        def _owed(self) -> int: ...
        async def _retired(self, qs: QState) -> bool: ...
        def _launch(self, qs: QState, entry: str, job_id: str, token: str, attempt: int,
                    data: bytes, times: tuple[int, int, int], deps: Any = None) -> None: ...
        def _start_jobs(self, tasks: list[asyncio.Task[None]] | None = None) -> None: ...
        def _hold(self, leases: list[Lease]) -> None: ...
        async def _rest_unowned(self, qs: QState) -> float: ...
        _to_start: list[tuple[QState, Lease, int, bytes, tuple[int, int, int]]]

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

    # ------------------------------------------------------------ lanes (priority levels)

    def _lane(self, qs: QState, level: int) -> QState:
        """The state of one level's stream of a shard (made on first use; its consumer group
        must exist already): its leases, settling loop, own pending entries and reclaim."""
        lane = qs.lanes.get(level)
        if lane is None:
            lane = QState(qs.keys.at_level(level), labels=qs.labels, own_cursor=None)
            qs.lanes[level] = lane
            self._lane_added(lane)
        return lane

    def _lane_added(self, lane: QState) -> None:
        """A new lane's settling loop (the Worker starts it when it is running)."""

    async def _refresh_levels_retried(self, client: aredis.Redis, qs: QState, _retried: bool
                                      ) -> None:
        await self._refresh_levels(qs, client)

    async def _refresh_levels(self, qs: QState, client: aredis.Redis | None = None) -> None:
        """Read the shard's levels SET: every level in use gets its consumer group and lane."""
        client = client or self._client
        assert client is not None
        qs.lanes.setdefault(DEFAULT_PRIORITY, qs)
        raw: Any = await client.smembers(qs.keys.levels)
        for p in sorted(set(levels_in_use(raw)) - set(qs.lanes)):
            await self._ensure_group(client, qs.keys.at_level(p))
            self._lane(qs, p)
        qs.order = sorted(qs.lanes, reverse=True)

    def _shares(self, qs: QState, n: int) -> list[int]:
        """Split n over the levels in use (qs.order): by weight (smooth weighted round robin,
        its state kept between calls) or, strict, all to the highest."""
        order = qs.order
        if len(order) == 1:
            return [n]
        if self.queue_config.strict_priority:
            return [n] + [0] * (len(order) - 1)
        weights = self.queue_config.priority_weights
        total = sum(weights[p] for p in order)
        cur = qs.wrr
        shares = dict.fromkeys(order, 0)
        for _ in range(n):
            best = order[0]
            for p in order:
                cur[p] = cur.get(p, 0) + weights[p]
                if cur[p] > cur.get(best, 0):
                    best = p
            cur[best] -= total
            shares[best] += 1
        return [shares[p] for p in order]

    # ------------------------------------------------------------------------ fetching

    def _fetch_step(self, qs: QState) -> Any:
        """One round of fetching for one queue shard: own pending entries first, lapsed
        leases when a reclaim is due, new entries otherwise (claim.lua, or a blocking read
        when the streams were found drained), over every priority level in use. The step
        alone owns the capacity it reserves; whatever it raises, the supervisor logs and
        retries."""
        loop = asyncio.get_running_loop()

        async def step() -> float:
            client = self._client
            assert client is not None
            slots = self._slots
            if qs.paused:
                slots.rest(qs.keys.tag)
                return 0.2
            if loop.time() < qs.limited_until:  # the rate limit allows no start yet
                slots.rest(qs.keys.tag)
                return qs.limited_until - loop.time()
            if not qs.owned and not qs.ticket and qs.own_cursor is None:
                # another worker's shard (owners.py): no new work fetched here
                slots.rest(qs.keys.tag)
                return await self._rest_unowned(qs)
            if loop.time() >= qs.levels_due:
                await self._refresh_levels(qs)
                qs.levels_due = loop.time() + _LEVELS_EVERY_S
            # at most three quarters of the slots per fetch: one batch starts while another
            # settles (half made a third more script calls per job for the same overlap:
            # docs/performance.md, issue 15's sixth round)
            want = min(self.config.fetch_batch, max(1, self.config.concurrency * 3 // 4))
            if qs.idle and qs.own_cursor is None and loop.time() < qs.next_reclaim:
                # a blocking read: a share of the free slots, the turn passed on at once
                n = await slots.take_share(want, qs.keys.tag)
            elif qs.failing:  # its last round failed (its node away?): a probe of one slot,
                # no held turn, so that a node that does not answer holds no other shard up
                n = await slots.take_share(1, qs.keys.tag)
            else:  # a claim (or a read of own or lapsed entries): every free slot, the turn
                # held until its reply (one claim in flight per worker, as unsharded)
                while (not qs.idle and self._owed() and slots.free < want
                       and (qs.sending or qs.buf)):
                    # short of slots that outcomes waiting to be settled hold (_owed): the
                    # lane's settling call (in flight, or about to go) gives them back, so
                    # claim after it ends, one full batch rather than a short one and then
                    # another (never while idle: a lone job still starts at once;
                    # docs/performance.md, the floor's claim sizes)
                    qs.settled.clear()
                    await qs.settled.wait()
                n = await slots.take_all(want, qs.keys.tag)
            try:
                pause = await fetch(n)
            except Exception:
                qs.failing = True
                raise
            finally:
                slots.pass_turn(qs.keys.tag)
            qs.failing = False
            return pause

        async def fetch(n: int) -> float:
            """The round itself, with n slots reserved."""
            client = self._client
            assert client is not None
            mode = "new"
            got: list[tuple[QState, list[Any]]] = []
            launched = 0
            try:
                if qs.ticket and not (qs.idle and qs.own_cursor is None and qs.owned
                                      and loop.time() < qs.next_reclaim):
                    # leaving the idle wait: no job may be handed over any more before
                    # anything else is read (hand-off: docs/performance.md#hand-off)
                    launched = await self._ticket(qs, 0)
                    self._settle_slots(n, launched)
                    return 0.0
                if qs.starting and (qs.own_cursor is not None or loop.time() >= qs.next_reclaim):
                    # reading own entries or reclaiming must not meet a batch still starting
                    await asyncio.wait(set(qs.starting))
                if qs.own_cursor is not None:  # entries delivered to this consumer name earlier
                    got = [await self._read_own(qs, n)]
                    mode = "own"
                elif not qs.owned:  # (its own entries read: it rests from now on)
                    self._release(n)
                    return 0.0
                elif loop.time() >= qs.next_reclaim:
                    got = [await self._reclaim(qs, n)]
                    mode = "reclaim"
                elif not qs.idle:
                    await self._claim(qs, n)
                    return 0.0
                else:  # the streams were drained: wait for work, then claim again
                    got, launched = await self._wait_for_work(qs, n, loop.time())
            except BaseException as exc:
                self._release(n)
                if isinstance(exc, ResponseError) and ("NOGROUP" in str(exc)
                                                       or "UNBLOCKED" in str(exc)):
                    # (UNBLOCKED: the stream was deleted under a blocking read)
                    if await self._retired(qs):  # a reshard deleted it: never make it again
                        return 0.0
                    for lane in list(qs.lanes.values()):  # deleted under us: make them again
                        await self._ensure_group(client, lane.keys)
                    return 0.0
                if isinstance(exc, Exception):
                    qs.own_cursor = "0"  # a lost reply may have delivered entries: read them
                raise
            total = sum(len(entries) for _, entries in got)
            self._settle_slots(n, total + launched)
            for lane, entries in got:
                if entries:  # start in the background: the next read overlaps this round trip
                    task = asyncio.create_task(self._start_batch(qs, lane, entries, mode))
                    qs.starting.add(task)
                    task.add_done_callback(qs.starting.discard)
            if launched:
                await self._let_handed_settle(qs)
            elif total and total < n:  # no backlog: let the start go out before the next read
                await asyncio.sleep(0)
            return 0.0

        return step

    async def _wait_for_work(self, qs: QState, n: int, now: float
                             ) -> tuple[list[tuple[QState, list[Any]]], int]:
        """A blocking XREADGROUP COUNT 1 over every level's stream: at most one entry per
        level, never a burst of low-priority entries ahead of urgent work arriving just
        after; then claims go on. Every level is read, also with fewer slots (n) than levels
        in use: a level left out would never be read while the worker stays idle (a job
        promoted to it after the queue drained waited for ever). When more levels answer
        than n, the highest levels' entries start and the rest, delivered to this consumer,
        are read as its own entries next (as after a lost reply). Returns the entries read
        per lane, and how many jobs were handed over started (launched already, in slots of
        the n)."""
        client = self._client
        assert client is not None
        lanes = [qs.lanes[p] for p in qs.order]
        # one stream (no priority level in use, no queue-wide rate limit): read up to n at
        # once, and go on claiming only when that filled n (a backlog may be left); an idle
        # worker that got a lone job then waits again instead of sending a claim that finds
        # nothing (one round trip off every lone job's path to its result)
        single = len(lanes) == 1 and self.queue_config.rate_limit is None
        block = min(self.config.block_ms, max(1, int((qs.next_reclaim - now) * 1000)))
        count = n if single else 1
        streams: dict[Any, Any] = {lane.keys.stream: ">" for lane in lanes}
        launched = 0
        handing = single and n >= 2 and self.queue_config.handoff and not self._no_handoff
        if handing:
            # post (or refresh) this lane's ticket, one slot of the n kept for the job a
            # producer may start for this worker; the inbox is read beside the stream. The
            # wait is kept under half a renewal period, so that a job handed over during it
            # is never taken for one learnt late (handoff.py's _handed)
            block = min(block, max(1, int(self.config.renew_every_s * 500)))
            launched = await self._ticket(qs, block + TICKET_SLACK_MS)
            if launched or qs.own_cursor is not None:  # handed over since the last read:
                return [], launched  # run it (or start it as our own), then wait again
            count = n - 1
            streams[qs.keys.inbox(self._token_prefix)] = ">"
        elif qs.ticket:  # no longer a lane for hand-offs (levels in use, a rate limit)
            return [], await self._ticket(qs, 0)
        sent = time.monotonic()
        reply = await xreadgroup(client, GROUP, self.consumer, streams, count, block, qs.reads)
        since = self._inbox_answered(qs, sent) if handing else sent
        if not reply:
            return [], 0
        by_stream = {lane.keys.stream: lane for lane in lanes}
        got = []
        for stream, entries in reply:
            lane = by_stream.get(stream.decode())
            if lane is None:  # the inbox
                launched += self._handed(qs, [inbox_row(e) for e in entries], since)
            else:
                got.append((lane, entries))
        if sum(len(entries) for _, entries in got) >= count:
            qs.idle = False
        if not single and sum(len(entries) for _, entries in got) > n:
            rank = {id(lane): i for i, lane in enumerate(lanes)}  # highest level first
            got.sort(key=lambda le: rank[id(le[0])])
            got = got[:n]  # (count 1: one entry per level that answered)
            qs.own_cursor = "0"  # the entries left out: delivered to us, read as our own
        return got, launched

    async def _claim(self, qs: QState, n: int) -> None:
        """Read and start up to n new entries with claim.lua (n slots are reserved; this
        frees what it does not use, and on an error all n: the caller reads its own pending
        entries next, which finds the entries of a call whose reply was lost)."""
        client = self._client
        assert client is not None
        first = self._take_tokens(n)
        order = qs.order
        streams = [qs.lanes[p].keys.stream for p in order]
        script = SCRIPTS["claim"]
        if script.packable(client):  # the fixed keys and arguments packed once (same bytes)
            pack = qs.claim_pack
            if pack is None or pack.order != order or pack.prefix != self._token_prefix:
                pack = qs.claim_pack = ClaimPack.make(
                    qs.keys, self.consumer, self.queue_config, self._token_prefix, order,
                    streams)
            reply = await script.run_packed_async(client, pack.call(
                first, n, self.queue_config.rate_args(qs.keys.shard), self._shares(qs, n)),
                kept=qs.reads)
        else:
            reply = await script.run_async(client, *claim_call(
                qs.keys, self.consumer, self.queue_config, self._token_prefix, first, n,
                streams, self._shares(qs, n)), kept=qs.reads)
        # (the loop's own connection: one call at a time, as its blocking reads; no pool
        # hand-out and return per claim)
        status, missing, allowed, wait_ms = reply[:CLAIM_HEAD]
        if status == b"paused":
            qs.paused = True  # seen before the flag poll: stop fetching at once
            self._release(n)
            return
        if wait_ms:  # the rate limit: no start conforms before then (no busy polling)
            qs.limited_until = asyncio.get_running_loop().time() + int(wait_ms) / 1000
        if missing:  # a group is gone (deleted under us): make it again
            if await self._retired(qs):  # (unless a reshard retired the shard)
                self._release(n)
                return
            for i in missing.split(b","):
                await self._ensure_group(client, qs.lanes[order[int(i) - 1]].keys)
        read = claim_read(reply)
        if read < int(allowed):  # fewer than the rate allowed: drained
            qs.idle = True
        # the batch in one pass (Worker._launch's work, the leases held under one lock)
        leases: list[Lease] = []
        try:
            lanes = qs.lanes
            to_start = self._to_start
            hold, start = leases.append, to_start.append
            now = time.monotonic()
            # the k-th entry read (started or not) has the k-th token
            token = iter(lease_tokens(self._token_prefix, first, read)).__next__
            for rows in reply[CLAIM_HEAD:]:  # one array per read: its level, then 4 values
                lane = lanes[order[rows[0] - 1]]  # per entry (claim.lua's header)
                keys = lane.keys
                it = iter(rows)
                next(it)
                for eid, jid, data, t in zip(it, it, it, it, strict=False):
                    tok = token()
                    if t.__class__ is int:  # attempt 1, no deadline, waited t ms
                        lease = new_lease(keys, jid.decode(), eid.decode(), tok, now)
                        hold(lease)
                        start((lane, lease, 1, data, (0, t, t)))
                    elif t.__class__ is list:  # any other start
                        attempt, deadline, wait_ms, age_ms = t
                        lease = new_lease(keys, jid.decode(), eid.decode(), tok, now)
                        hold(lease)
                        start((lane, lease, attempt, data, (deadline, wait_ms, age_ms)))
                    elif t == b"paused":  # not started (skip, dead, paused, limited)
                        qs.paused = True
            if leases:
                self.stats.started += len(leases)
            self._release(n - len(leases))
        finally:  # every lease of the batch held: now their first steps (eager.py)
            if leases:
                self._hold(leases)
            self._start_jobs()

    async def _read_own(self, qs: QState, n: int) -> tuple[QState, list[Any]]:
        """Up to n of this consumer's own pending entries, lane after lane."""
        assert self._client is not None and qs.own_cursor is not None
        if qs.own_cursor == "0":  # (re)started from outside: every lane again
            qs.own_lane = 0
        order = qs.order or [DEFAULT_PRIORITY]
        lane = qs.lanes.get(order[min(qs.own_lane, len(order) - 1)], qs)
        reply: Any = await self._client.xreadgroup(
            GROUP, self.consumer, {lane.keys.stream: qs.own_cursor}, count=n)
        raw: list[Any] = reply[0][1] if reply else []
        if raw:
            qs.own_cursor = raw[-1][0].decode()
        elif qs.own_lane + 1 < len(order):
            qs.own_lane += 1
            qs.own_cursor = "0-0"
        else:
            qs.own_cursor = None
            qs.own_lane = 0
        return lane, [e for e in raw if not self._busy(lane, e[0].decode())]

    async def _reclaim(self, qs: QState, n: int) -> tuple[QState, list[Any]]:
        """Take over up to n entries whose lease lapsed (XAUTOCLAIM, each lane's cursor
        kept), lane after lane; when a sweep of every lane is done, the next is due in
        reclaim_every_s. Entries of this worker's own lost leases are taken like any other:
        the handler that lost its lease is fenced out, the job runs again."""
        assert self._client is not None
        order = qs.order or [DEFAULT_PRIORITY]
        if qs.reclaim_lane >= len(order):
            qs.reclaim_lane = 0
        lane = qs.lanes.get(order[qs.reclaim_lane], qs)
        min_idle = int(self.config.visibility_timeout_s * 1000)
        reply: Any = await self._client.xautoclaim(
            lane.keys.stream, GROUP, self.consumer, min_idle, lane.cursor, count=n)
        lane.cursor = reply[0].decode()
        if lane.cursor == "0-0":  # this lane's sweep is done
            qs.reclaim_lane += 1
            if qs.reclaim_lane >= len(order):  # and every lane's: the next sweep when due
                qs.reclaim_lane = 0
                qs.next_reclaim = asyncio.get_running_loop().time() + self.config.reclaim_every_s
        entries = [e for e in reply[1] if not self._busy(lane, e[0].decode())]
        if entries:
            log.info("reclaiming %d lapsed entries of %s", len(entries), lane.keys.tag)
        return lane, entries

    async def _start_batch(self, qs: QState, lane: QState, entries: list[Any], mode: str
                           ) -> None:
        """Start delivered entries of one lane of shard qs (capacity for all of them is
        already reserved); mode is
        'new', 'reclaim' or 'own' (own pending entries: a job active under a token of this
        worker is a start whose reply was lost, answered as the same start).

        start.lua is safe to repeat with the same tokens, so a call that meets a transient
        error (its reply possibly lost after it ran) is sent again, the same, until Redis
        answers: a job is never counted as started twice for one start."""
        client = self._client
        assert client is not None
        k = lane.keys
        good: list[tuple[str, str, str]] = []
        bad: list[tuple[str, str]] = []
        ghosts: list[str] = []
        for entry_id, fields in entries:
            eid = entry_id.decode()
            if not fields:  # deleted while pending: None, or {} from redis-py 8's parser
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
                                                    bad, resume, rate=True))
                            unreleased -= len(part) + len(bad)
                            self._started(qs, lane, part, reply, len(bad), mode == "reclaim")
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

    def _started(self, qs: QState, lane: QState, part: list[tuple[str, str, str]], reply: Any,
                 malformed: int, reclaimed: bool) -> None:
        """Launch what start.lua said to run (in lane, of shard qs); free the slots of
        everything else."""
        launched = 0
        skipped = malformed
        try:
            for n, (eid, jid, _token) in enumerate(part):
                code, token, attempt, data, deadline, wait_ms, age_ms = reply[7 * n:7 * n + 7]
                if code != b"run":
                    skipped += 1
                    if code == b"paused":
                        qs.paused = True  # seen before the flag poll: stop fetching at once
                    elif code == b"limited":  # over the queue's rate: handed back, wait
                        qs.limited_until = max(qs.limited_until,
                                               asyncio.get_running_loop().time()
                                               + int(data) / 1000)
                    continue
                launched += 1
                self._launch(lane, eid, jid, token.decode(), int(attempt), data,
                             (int(deadline), int(wait_ms), int(age_ms)))
            if launched:
                self.stats.started += launched
                if reclaimed:
                    self.stats.reclaimed += launched
                    tel.RECLAIMED.add(launched, qs.labels)
            self._release(skipped)
        finally:  # every lease of the batch held: now their first steps (eager.py)
            self._start_jobs()
