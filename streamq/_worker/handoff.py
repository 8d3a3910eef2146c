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
from .._core.keys import GROUP
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
TICKET_SLACK_MS = 500
"""A hand-off ticket holds this long past the blocking read it was posted for: a worker
that is gone (killed while idle) gets handed nothing after that."""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def inbox_row(entry: Any) -> tuple[Any, ...]:
    """An inbox entry read by XREADGROUP as a row of ticket.lua's reply."""
    eid, f = entry
    f = f or {}
    return (eid, f.get(b"e", b""), f.get(b"id", b""), f.get(b"c", b"own"), f.get(b"k", b""),
            f.get(b"n", 0), f.get(b"d", b""), f.get(b"dl", 0), f.get(b"w", 0), f.get(b"a", 0))


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

        def _release(self, n: int) -> None: ...
        def _busy(self, qs: QState, entry: str) -> bool: ...
        def _launch(self, qs: QState, entry: str, job_id: str, token: str, attempt: int,
                    data: bytes, times: tuple[int, int, int]) -> asyncio.Task[None]: ...

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
        launched = 0
        late = time.monotonic() - since >= self.config.renew_every_s
        for inbox_entry, eid, jid, code, token, attempt, data, deadline, wait_ms, age_ms in rows:
            qs.inbox_acks.append(_text(inbox_entry))
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
            qs.handed.append(self._launch(qs, entry, job_id, tok, int(attempt), data,
                                          (int(deadline), int(wait_ms), int(age_ms))))
            self._leases.backdate(qs.keys.tag, entry, tok, since)
        if launched:
            self.stats.started += launched
            self.stats.handed_over += launched
        return launched

    async def _let_handed_settle(self, qs: QState) -> None:
        """A job was just handed over: before this loop posts its next ticket, let that
        job's outcome go out if it ends at once (the result is what its producer waits for;
        measured, a ticket sent first delayed it by ~0.2 ms). A job that runs longer than
        _HANDED_WAIT_S is not waited for."""
        tasks, qs.handed = qs.handed, []
        await asyncio.sleep(0)  # the job's first step runs before this one goes on
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
