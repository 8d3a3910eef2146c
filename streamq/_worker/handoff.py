"""Hand-off, the worker's side: tickets (ticket.lua), the inbox, and the jobs producers
started for this worker inside their enqueue call (enqueue.lua; docs/performance.md#hand-off).

The fetch loop (fetch.py) posts a ticket before its idle blocking read, reads the inbox beside
the ready stream, and withdraws the ticket before any other read. The Worker mixes this class
in (through Fetching); the state it uses is the Worker's (declared below).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis

from .._core.config import QueueConfig, WorkerConfig
from .._core.keys import DEFAULT_PRIORITY, GROUP
from .._core.retry import transient
from .._core.scripts import SCRIPTS
from .lease import LeaseKeeper
from .slots import Slots
from .state import QState, WorkerStats

log = logging.getLogger("streamq.worker")
_ROW = 10
"""Values per handed-over job in ticket.lua's reply (an inbox entry id, then the start)."""

_HANDED_WAIT_S = 0.002
"""How long a fetch loop waits for a job just handed over to end before its next ticket."""
_HANDED_YIELDS = 8
"""At most this many event-loop turns for the settling loop to send that job's outcome."""
_FINISH_TAKES = 4
"""At most this many jobs a finish.lua call releases are handed to the worker that sent it
(their slots are held for the call's round trip: a few, not every free one)."""
TICKET_SLACK_MS = 500
"""A hand-off ticket holds this long past the blocking read it was posted for: a worker
that is gone (killed while idle) gets handed nothing after that."""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def inbox_row(entry: Any) -> tuple[Any, ...]:
    """An inbox entry read by XREADGROUP as a row of ticket.lua's reply, and the job's
    dependency results when the entry brings them (field 'r': _flow.lua's hand)."""
    eid, f = entry
    f = f or {}
    return (eid, f.get(b"e", b""), f.get(b"id", b""), f.get(b"c", b"own"), f.get(b"k", b""),
            f.get(b"n", 0), f.get(b"d", b""), f.get(b"dl", 0), f.get(b"w", 0), f.get(b"a", 0),
            _unpacked(f.get(b"r")))


def _unpacked(raw: Any) -> list[bytes] | None:
    """'<length>:<bytes>' items, one after the other, as a list (None: none, or malformed:
    the results are read from their HASH)."""
    if not isinstance(raw, bytes):
        return None
    out: list[bytes] = []
    i = 0
    try:
        while i < len(raw):
            j = raw.index(b":", i)
            n = int(raw[i:j])
            out.append(raw[j + 1:j + 1 + n])
            i = j + 1 + n
    except ValueError:
        return None
    return out if i == len(raw) else None


class HandOff:
    """Tickets, the inbox and handed-over jobs: the hand-off part of the Worker."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        consumer: str
        config: WorkerConfig
        queue_config: QueueConfig
        stats: WorkerStats
        _leases: LeaseKeeper
        _client: aredis.Redis | None
        _slots: Slots
        _token_prefix: str
        _no_handoff: bool
        _running: bool

        def _release(self, n: int) -> None: ...
        def _busy(self, qs: QState, entry: str) -> bool: ...
        def _launch(self, qs: QState, entry: str, job_id: str, token: str, attempt: int,
                    data: bytes, times: tuple[int, int, int], deps: Any = None) -> None: ...
        def _start_jobs(self, tasks: list[asyncio.Task[None]] | None = None) -> None: ...

    def _ticket_member(self, qs: QState) -> str:
        """This worker's ticket for a lane (ticket.lua's header): fixed per worker run."""
        k, cfg = qs.keys, self.queue_config
        return "|".join((k.job(""), k.inbox(self._token_prefix), self._token_prefix,
                         cfg.events_arg, str(cfg.dead_ttl_s), str(cfg.dead_maxlen),
                         self.consumer))

    async def _ticket(self, qs: QState, hold_ms: int) -> int:
        """Post (hold_ms > 0) or withdraw (0) the lane's hand-off ticket with ticket.lua,
        and launch the jobs handed over since the inbox was last read; returns how many.
        Until a withdrawal is answered a ticket may be out (``qs.ticket``): the fetch step
        withdraws it before it reads anything else."""
        client = self._client
        assert client is not None
        k = qs.keys
        qs.ticket = True
        acks, qs.inbox_acks = qs.inbox_acks, []
        sent = time.monotonic()
        try:
            reply = await SCRIPTS["ticket"].run_async(
                client, [k.tickets, k.inbox(self._token_prefix)],
                [self._ticket_member(qs), hold_ms, GROUP, self.consumer, *acks])
        except BaseException as exc:
            qs.inbox_acks = acks + qs.inbox_acks  # acknowledged by the next call
            if isinstance(exc, Exception) and not transient(exc) and hold_ms:
                # refused for good (an ACL without a command ticket.lua needs, ...): this
                # worker goes on without hand-offs; a ticket posted earlier lapses, and a job
                # handed over meanwhile is found among its own pending entries
                log.warning("hand-off off for worker %s: %s", self.consumer, exc)
                self._no_handoff = True
                qs.own_cursor = "0"
            raise
        if hold_ms == 0:
            qs.ticket = False
        flat = reply[1:]
        return self._handed(qs, [flat[i:i + _ROW] for i in range(0, len(flat), _ROW)],
                            self._inbox_answered(qs, sent))

    @staticmethod
    def _inbox_answered(qs: QState, sent: float) -> float:
        """A read of the inbox sent at ``sent`` was answered: returns since when the jobs it
        brings may have been handed over (their leases begun). Each was handed over after the
        previous answered read ran (or that read would have taken it), so after it was sent:
        the worker's own clock bounds the age of a lease a producer started."""
        since = sent if qs.inbox_read is None else qs.inbox_read
        qs.inbox_read = sent
        return since

    def _handed(self, qs: QState, rows: list[Sequence[Any]], since: float) -> int:
        """Launch jobs a producer started for this worker (enqueue.lua's hand-off; each row:
        inbox entry, then the start as claim.lua gives it without the level), handed over
        no earlier than ``since`` (time.monotonic); returns how many were launched.

        A lease a producer started counts from the hand-off, which the worker learns of
        later (at once, unless its event loop was stalled). Learnt within a renewal period
        (a third of the visibility timeout), the job runs at once, its lease renewed as if
        it had begun at ``since``. Learnt later, the lease may be half spent, or lapsed and
        taken over: the job is started again as this worker's own pending entry (start.lua:
        the same lease and attempt, its idle time reset; or left alone if another worker
        took it over), as a job it had read itself would be (invariant 13)."""
        try:
            for row in rows:
                qs.inbox_acks.append(_text(row[0]))
            launched = self._launch_started(qs, [row[1:] for row in rows], since)
            if launched:
                self.stats.started += launched
                self.stats.handed_over += launched
        finally:  # (the jobs that wait, for the fetch loop to let them settle first)
            self._start_jobs(qs.handed)
        return launched

    def _launch_started(self, qs: QState, rows: list[Sequence[Any]], since: float) -> int:
        """Launch jobs started for this worker by a script (each row: stream entry id, job
        id, code, token, attempt, data, deadline, wait ms, age ms, and optionally its
        dependency results: finish.lua's), started no earlier than ``since``: _handed's
        rules. Returns how many were launched (their first steps: the caller's
        ``_start_jobs``)."""
        launched = 0
        late = time.monotonic() - since >= self.config.renew_every_s
        for row in rows:
            eid, jid, code, token, attempt, data, deadline, wait_ms, age_ms = row[:9]
            if code == b"own":  # a malformed entry: start.lua settles it with our own ones
                qs.own_cursor = "0"
                continue
            if code != b"run":
                continue
            entry = _text(eid)
            if self._busy(qs, entry):
                continue
            if late:  # start.lua makes its lease fresh (or finds it taken over)
                qs.own_cursor = "0"
                continue
            try:
                job_id = _text(jid)
            except UnicodeDecodeError:
                qs.own_cursor = "0"
                continue
            launched += 1
            tok = _text(token)
            deps = row[9] if len(row) > 9 and isinstance(row[9], list) else None
            self._launch(qs, entry, job_id, tok, int(attempt), data,
                         (int(deadline), int(wait_ms), int(age_ms)), deps)
            self._leases.backdate(qs.keys.tag, entry, tok, since)
        return launched

    def _finish_hand_args(self, qs: QState) -> list[Any]:
        """finish.lua's optional arguments that make this worker the hand-off target of the
        jobs a settling call releases into the lane's stream (docs/workflows.md#hand-off):
        its consumer, record key prefix, token prefix and how many it takes (its free slots);
        none while it stops, with hand-off off, for a lane of another priority level, while
        levels are in use or with a queue-wide rate limit (the start would skip those
        checks, as a ticket's would). The slots offered are reserved until the call is
        answered (_finish_handed gives back what it did not use), so concurrency holds."""
        cfg = self.queue_config
        if (not self._running or not cfg.handoff or self._no_handoff or self._slots.free < 1
                or cfg.rate_limit is not None or qs.keys.level != DEFAULT_PRIORITY
                or len(qs.order) > 1):
            return []
        takes = self._slots.grab(_FINISH_TAKES)
        return [self.consumer, qs.keys.job(""), self._token_prefix, takes]

    def _finish_handed(self, qs: QState, rows: list[Sequence[Any]], sent: float,
                       reserved: int) -> None:
        """Run the jobs a finish.lua call sent at ``sent`` released and started for this
        worker (_finish_hand_args; rows empty: none, or the call failed) in the ``reserved``
        slots, and free the rest."""
        launched = 0
        try:
            launched = self._launch_started(qs, rows, sent)
            if launched:
                self.stats.started += launched
                self.stats.handed_over += launched
        finally:
            self._settle_slots(reserved, launched)
            if launched:  # their first steps once the call that released them is over (as
                # tasks of their own would start): a lone one then sends its own outcome
                asyncio.get_running_loop().call_soon(self._start_jobs)

    async def _let_handed_settle(self, qs: QState) -> None:
        """A job was just handed over: before this loop posts its next ticket, let that
        job's outcome go out if it ends at once (the result is what its producer waits for;
        measured, a ticket sent first delayed it by ~0.2 ms). A job that runs longer than
        _HANDED_WAIT_S is not waited for."""
        tasks, qs.handed = qs.handed, []
        await asyncio.sleep(0)  # (its first step ran already: _start_jobs)
        pending = [t for t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=_HANDED_WAIT_S)
        sent = qs.settle_calls
        qs.settled.clear()
        for _ in range(_HANDED_YIELDS):  # the settling loop's turn to send finish.lua
            if not qs.buf or qs.settle_calls != sent:
                break
            await asyncio.sleep(0)
        if qs.settle_calls != sent:  # and its end: Redis runs a ticket.lua sent meanwhile
            # before it writes the result message out (measured: ~0.05 ms later)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(qs.settled.wait(), _HANDED_WAIT_S)

    def _settle_slots(self, reserved: int, used: int) -> None:
        """Free the reserved slots a fetch step did not use; a hand-off beyond them (a
        started job always runs) takes slots the worker did not have free yet."""
        if used <= reserved:
            self._release(reserved - used)
        else:
            self._slots.overdraw(used - reserved)
