"""State a worker shares with its parts (settling, housekeeping): per-queue state and counters.

Kept apart from the Worker so that the parts are built with what they need and import
nothing of the Worker itself."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from .._core.keys import Keys
from .._core.sends import Kept
from .groups import GroupKeeper
from .promote import Promoter

Finish = tuple[str, str, str, str, bytes, Any, str]
"""(job id, entry, token, outcome, data, delay ms or reason, error type) for finish.lua."""


@attrs.define
class QState:
    keys: Keys
    buf: list[Finish] = attrs.field(factory=list)
    flush: asyncio.Event = attrs.field(factory=asyncio.Event)
    paused: bool = False
    cursor: str = "0-0"
    """XAUTOCLAIM cursor, kept between reclaim rounds."""
    next_reclaim: float = 0.0
    own_cursor: str | None = "0"
    """Where to read this consumer's own pending entries from; None once they are all seen."""
    idle: bool = False
    """The last claim found the streams drained: wait with a blocking read (fetch.py)."""
    lanes: dict[int, QState] = attrs.field(factory=dict)
    """A shard's lanes by priority level (its own state at the default level); the state
    of each level's stream: leases, settling, own pending entries, reclaim (fetch.py)."""
    order: list[int] = attrs.field(factory=list)
    """The levels in use, highest first: the order in which a claim reads them."""
    levels_due: float = 0.0
    """When to read the shard's levels SET again."""
    wrr: dict[int, int] = attrs.field(factory=dict)
    """Smooth weighted round robin state (current weight per level) of the claim split."""
    own_lane: int = 0
    """Which lane (index in order) the own pending read is at."""
    reclaim_lane: int = 0
    """Which lane (index in order) the reclaim sweep is at."""
    failing: bool = False
    """The fetch loop's last round failed: its next takes one slot and no held turn."""
    limited_until: float = 0.0
    """The queue's rate limit allows no start before this (loop time): fetching waits."""
    promoter: Promoter | None = None
    groups: GroupKeeper | None = None
    """Group upkeep of this shard (unpark, reconcile)."""
    starting: set[asyncio.Task[None]] = attrs.field(factory=set)
    """start.lua calls in flight: the fetch loop reads on while a batch starts."""
    ticket: bool = False
    """A hand-off ticket of this lane may be out (posted, not yet withdrawn): fetch.py."""
    inbox_acks: list[str] = attrs.field(factory=list)
    """Inbox entries read, acknowledged with the next ticket.lua call."""
    handed: list[asyncio.Task[None]] = attrs.field(factory=list)
    """Jobs just handed over, launched by the fetch loop (it lets them settle first)."""
    inbox_read: float | None = None
    """When (time.monotonic) the last read of the inbox that Redis answered was sent: a job
    a later read brings was handed over (its lease begun) after that (handoff.py)."""
    settle_calls: int = 0
    """finish.lua calls the settling loop has sent (settle.py counts them)."""
    settled: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set when a finish.lua call of the settling loop has ended (its reply read or failed)."""
    reads: Kept = attrs.field(factory=Kept)
    """The connection the fetch loop keeps for its blocking reads and claims (fetch.py)."""
    settles: Kept = attrs.field(factory=Kept)
    claim_pack: Any = None
    """The fixed runs of this shard's claim.lua calls, packed once (calls.py's ClaimPack)."""
    """The connection this lane's finish.lua calls go out on (settle.py)."""
    sending: bool = False
    """A finish.lua call of this lane is in flight (one at a time: settle.py)."""
    settle_idle: bool = False
    """The settling loop waits for outcomes (not sending, not backing off): a lone job may
    send its own outcome at once (``Settler.settle_now``)."""
    labels: dict[str, str] = attrs.field(factory=dict)
    """Metric attributes of this queue."""
    owned: bool = True
    """This worker fetches new work from the shard (owners.py; a shard's default-level
    state): False rests its fetch loop but for its own pending entries."""
    resting: bool = False
    """The fetch loop rests on a shard it does not own: no read, no ticket out (owners.py)."""
    retired: bool = False
    """The shard was retired by a reshard (its index >= ``Layout.read``): its loops end and
    nothing re-creates its keys (reshard.py)."""
    gauges: dict[str, float] = attrs.field(factory=dict)
    job_types: dict[str, str] = attrs.field(factory=dict)
    """The job type of each started entry, while metrics are recorded (by entry id: the
    settling loop counts outcomes by type, ``tel.job_attrs``)."""


@attrs.define
class WorkerStats:
    started: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    reclaimed: int = 0
    released: int = 0
    cancelled: int = 0
    """Running jobs stopped by a requested cancel."""
    handed_over: int = 0
    """Jobs a producer started for this idle worker inside its enqueue (hand-off)."""
    rate_limited: int = 0
    """Attempts that raised RateLimited (back later, no attempt counted)."""
    stuck_threads: int = 0
    """Sync handlers that outlived their timeout and still hold a thread (a gauge)."""

    def fields(self) -> dict[str, int]:
        """Every counter by name (the JSON ``stopped`` log line carries them as ``stats``)."""
        return {a.name: getattr(self, a.name) for a in attrs.fields(WorkerStats)}

    def summary(self) -> str:
        """'12 started, 11 completed, 1 retried': the counters that are not 0."""
        parts = [f"{n} {name.replace('_', ' ')}" for name, n in self.fields().items() if n]
        return ", ".join(parts) or "no jobs"
