"""Frozen configuration objects. Durations carry their unit in the name (``_s``, ``_ms``)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import attrs

from .errors import InvalidArgument
from .serde import JsonSerde, Serde


def _positive_int(_inst: object, att: attrs.Attribute[int], v: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InvalidArgument(f"{att.name} must be a positive integer, got {v!r}")


def _non_negative_int(_inst: object, att: attrs.Attribute[int], v: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InvalidArgument(f"{att.name} must be an integer >= 0, got {v!r}")


def _shard_count(_inst: object, att: attrs.Attribute[int], v: int) -> None:
    from .keys import MAX_SHARDS

    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SHARDS:
        raise InvalidArgument(f"{att.name} must be an integer 1..{MAX_SHARDS}, got {v!r}")


def _positive_seconds(_inst: object, att: attrs.Attribute[float], v: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise InvalidArgument(f"{att.name} must be a positive, finite number of seconds, got {v!r}")


def start_wait_seconds(_inst: object, att: attrs.Attribute[float], v: float) -> None:
    """0 or more finite seconds (a start-up's wait for Redis)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise InvalidArgument(f"{att.name} must be 0 or more, finite seconds, got {v!r}")


def _optional_positive_seconds(
    inst: object, att: attrs.Attribute[float | None], v: float | None
) -> None:
    if v is not None:
        _positive_seconds(inst, att, v)  # type: ignore[arg-type]


def _optional_megabytes(_inst: object, att: attrs.Attribute[float | None],
                        v: float | None) -> None:
    if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                          or not math.isfinite(v) or v <= 0):
        raise InvalidArgument(f"{att.name} must be a positive number of MiB, got {v!r}")


def _pool_kind(_inst: object, att: attrs.Attribute[str], v: str) -> None:
    if v not in ("thread", "process"):
        raise InvalidArgument(f"{att.name} must be 'thread' or 'process', got {v!r}")


def _optional_pool_registry(_inst: object, att: attrs.Attribute[str | None],
                            v: str | None) -> None:
    if v is not None and (not isinstance(v, str) or ":" not in v or v.endswith(":")):
        raise InvalidArgument(f"{att.name} must be 'module:attribute' naming the Registry"
                              f" (e.g. 'myapp.tasks:registry'), got {v!r}")


def _limit_count(_inst: object, att: attrs.Attribute[int], v: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1_000_000:
        raise InvalidArgument(f"{att.name} must be an integer 1..1000000, got {v!r}")


def _period(_inst: object, att: attrs.Attribute[float], v: float) -> None:
    if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
            or not 0.001 <= v <= 86_400):
        raise InvalidArgument(f"{att.name} must be a number of seconds 0.001..86400, got {v!r}")


@attrs.frozen
class RateLimit:
    """At most ``limit`` job starts in any window of ``period_s`` seconds (sliding, not
    fixed: docs/fairness.md#queue-wide-rate-limit). ``burst`` of them may start at once;
    the rest are spaced evenly (GCRA: one every period_s / (limit - burst + 1))."""

    limit: int = attrs.field(validator=_limit_count)
    period_s: float = attrs.field(default=1.0, validator=_period)
    burst: int = attrs.field(default=1, validator=_limit_count)

    def __attrs_post_init__(self) -> None:
        if self.burst > self.limit:
            raise InvalidArgument(f"burst must be at most limit ({self.limit}), got"
                                  f" {self.burst}")

    def gcra(self, shard: int, shards: int) -> tuple[int, int]:
        """(emission interval, tolerance) in microseconds of one shard's limiter: a
        sharded queue divides the limit among its shards (shard i gets limit // shards, one
        more for i < limit % shards), so the shards together never exceed it."""
        mine = self.limit // shards + (1 if shard < self.limit % shards else 0)
        burst = max(1, min(self.burst, mine))
        period_us = round(self.period_s * 1_000_000)
        interval = -(-period_us // (mine - burst + 1))  # rounded up: never more than limit
        return interval, (burst - 1) * interval


@attrs.frozen
class RetryPolicy:
    """Exponential backoff with full jitter: delay = uniform(0, min(cap, base * 2**(attempt-1)))."""

    base_s: float = attrs.field(default=1.0, validator=_positive_seconds)
    cap_s: float = attrs.field(default=300.0, validator=_positive_seconds)

    def delay_s(self, attempt: int) -> float:
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt - 1, 60))
        return random.uniform(0.0, ceiling)


EVENT_KINDS: tuple[str, ...] = (
    "enqueued", "queued", "started", "reclaimed", "progress", "completed", "retrying",
    "failed", "cancelled", "released", "lease_lost", "requeued", "redriven", "purged", "admin",
    "cancel_requested", "rate_limited", "deduplicated",
)
"""Every lifecycle event kind (docs/key-layout.md#stream-entries)."""
ALL_EVENTS: frozenset[str] = frozenset(EVENT_KINDS)
DEFAULT_EVENTS: frozenset[str] = ALL_EVENTS - {"enqueued", "queued", "started", "completed"}
"""The default ``QueueConfig.event_kinds``: everything but the four steps every job takes
(each would cost about 50 bytes of Redis memory per job); the job record keeps their times."""


def _event_kinds(_inst: object, att: attrs.Attribute[frozenset[str]], v: frozenset[str]) -> None:
    if not isinstance(v, frozenset) or not all(isinstance(k, str) for k in v):
        raise InvalidArgument(f"{att.name} must be a frozenset of event kinds, got {v!r}")
    unknown = v - ALL_EVENTS
    if unknown:
        raise InvalidArgument(f"{att.name}: unknown event kinds {sorted(unknown)}; known:"
                              f" {', '.join(EVENT_KINDS)}")


def _optional_rate(_inst: object, att: attrs.Attribute[GroupRate | None], v: object) -> None:
    if v is not None and not isinstance(v, GroupRate):
        raise InvalidArgument(f"{att.name} must be a GroupRate or None, got {v!r}")


@attrs.frozen
class GroupRate:
    """At most ``limit`` starts per ``period_s`` seconds (GCRA without burst: starts are
    spaced at least period_s / limit apart, so no window of period_s ever holds more than
    ``limit`` starts)."""

    limit: int = attrs.field(validator=_positive_int)
    period_s: float = attrs.field(default=1.0, validator=_positive_seconds)

    @property
    def arg(self) -> str:
        """'<n> <period ms>', as the scripts and the group config HASH keep it."""
        return f"{self.limit} {max(1, round(self.period_s * 1000))}"


def _weights(_inst: object, att: attrs.Attribute[tuple[int, ...]], v: tuple[int, ...]) -> None:
    from .keys import PRIORITIES

    if (not isinstance(v, tuple) or len(v) != len(PRIORITIES)
            or not all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 1000
                       for w in v)):
        raise InvalidArgument(f"{att.name} must be a tuple of {len(PRIORITIES)} integers"
                              f" 1..1000 (one per priority, lowest first), got {v!r}")


@attrs.frozen
class QueueConfig:
    """Settings shared by producers and workers of a queue (keep them the same on both sides)."""

    max_payload_bytes: int = attrs.field(default=512 * 1024, validator=_positive_int)
    max_depth: int = attrs.field(default=0, validator=_non_negative_int)
    """Reject enqueues once ready + in-flight + delayed reaches this; 0 = unlimited."""
    default_result_ttl_s: int = attrs.field(default=24 * 3600, validator=_positive_int)
    dead_ttl_s: int = attrs.field(default=14 * 24 * 3600, validator=_positive_int)
    """How long dead-lettered job records are kept."""
    dead_maxlen: int = attrs.field(default=1_000_000, validator=_positive_int)
    events_maxlen: int = attrs.field(default=100_000, validator=_non_negative_int)
    """Approximate cap of the lifecycle events stream; 0 turns events off."""
    event_kinds: frozenset[str] = attrs.field(default=DEFAULT_EVENTS, validator=_event_kinds)
    """Which lifecycle events are written (``ALL_EVENTS`` for every one, e.g. for a full
    export). The default leaves out enqueued, queued, started and completed: the steps every
    job takes, whose times the job record keeps (docs/performance.md#memory-per-job)."""
    key_prefix: str = "streamq"
    serde: Serde = attrs.field(factory=JsonSerde)
    require_handler: bool = False
    """Producers refuse (UnknownJobType) job types no worker of the queue has published a
    handler for; off by default (a producer may run before any worker)."""
    min_replicas: int = attrs.field(default=0, validator=_non_negative_int)
    """After each enqueue call and each settled batch, ``WAIT`` until this many replicas
    have the write (0 = no WAIT: replication stays asynchronous). A producer whose WAIT
    times out gets ReplicationTimeout (the job is written on the primary); a worker logs a
    warning. On Redis Cluster each node that took a write WAITs on that connection for its
    own replicas, and the producer is told about the short nodes' jobs only. See
    docs/durability.md."""
    min_replicas_timeout_ms: int = attrs.field(default=1000, validator=_positive_int)
    """How long that WAIT blocks at most (keep it well below the client's socket timeout)."""
    shards: int = attrs.field(default=1, validator=_shard_count)
    """How many key sets (hash slots) the queue is spread over, 1..256 (keys.MAX_SHARDS):
    1 is the unsharded layout. Stored with the queue by its first user; every producer,
    worker, scheduler and admin must use the same number (else ShardCountMismatch). See
    docs/scaling.md#sharded-queues."""
    group_concurrency: int = attrs.field(default=1, validator=_positive_int)
    """Default in-flight limit (admitted to the stream + running) of each group of jobs
    enqueued with ``group=``; per-group overrides are set at run time
    (``Admin.set_group_limit``) and stored in Redis. Per shard on a sharded queue.
    docs/fairness.md#groups."""
    group_rate: GroupRate | None = attrs.field(default=None, validator=_optional_rate)
    """Default start rate of each group (None: unlimited); overrides with
    ``Admin.set_group_rate``. docs/fairness.md#group-rate-limits."""
    priority_weights: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8, 16),
                                                    validator=_weights)
    """Each priority's weight, priority 0 first (docs/fairness.md#priorities): under a
    backlog at several levels a worker splits each fetch over the levels in use by these
    weights (smooth weighted round robin), and what a level leaves unused goes to the others,
    highest first. The default gives each level twice the share of the level below it."""
    strict_priority: bool = False
    """Fetch strictly by priority instead (a lower level waits while a higher has work)."""
    handoff: bool = True
    """Idle workers post hand-off tickets, and producers start a new job for such a worker
    inside the enqueue call, so it wakes with a started job (no start round trip on an idle
    queue's path: docs/performance.md#hand-off). Off on either side: none is handed off."""
    rate_limit: RateLimit | None = attrs.field(default=None)
    search: SearchConfig | None = attrs.field(default=None)
    """Job search indexes (docs/search.md): None (the default) writes none, so a queue costs
    what it did; a ``SearchConfig`` makes every enqueue add the job to per-shard sorted sets
    (all ids, id prefix, type, group, declared payload fields) in the same script."""

    @search.validator
    def _check_search(self, att: attrs.Attribute[SearchConfig | None],
                      v: SearchConfig | None) -> None:
        if v is not None and not isinstance(v, SearchConfig):
            raise InvalidArgument(f"{att.name} must be a SearchConfig or None, got {v!r}")
    """At most this many job starts per period over the whole queue, checked inside the
    script that starts jobs (docs/fairness.md#queue-wide-rate-limit); None = no limit."""

    @rate_limit.validator
    def _check_rate(self, att: attrs.Attribute[RateLimit | None], v: RateLimit | None) -> None:
        if v is None:
            return
        if not isinstance(v, RateLimit):
            raise InvalidArgument(f"{att.name} must be a RateLimit or None, got {v!r}")
        if v.limit < self.shards:
            raise InvalidArgument(f"{att.name}: a queue of {self.shards} shards divides its"
                                  f" limit among them: limit must be at least {self.shards},"
                                  f" got {v.limit}")

    def rate_args(self, shard: int) -> tuple[int, int]:
        """The limiter's arguments of one shard (claim.lua, start.lua): emission interval
        and tolerance in µs; (0, 0) = no limit."""
        if self.rate_limit is None:
            return 0, 0
        return self.rate_limit.gcra(shard, self.shards)


    @property
    def group_arg(self) -> str:
        """The scripts' group defaults argument: '<limit> <rate n> <rate period ms>'."""
        rate = self.group_rate.arg if self.group_rate is not None else "0 0"
        return f"{self.group_concurrency} {rate}"

    @property
    def events_arg(self) -> str:
        """The scripts' events argument (_lib.lua's emit): '0' (off), '<maxlen>' (every
        kind) or '<maxlen>:,<kind>,...,' (only those)."""
        if self.events_maxlen == 0 or not self.event_kinds:
            return "0"
        if self.event_kinds == ALL_EVENTS:
            return str(self.events_maxlen)
        return f"{self.events_maxlen}:,{','.join(sorted(self.event_kinds))},"


def _search_fields(_inst: object, att: attrs.Attribute[Any], v: Any) -> None:
    from .keys import check_search_term

    if not isinstance(v, Mapping):
        raise InvalidArgument(f"{att.name} must map a job type to a list of payload field"
                              f" names, got {v!r}")
    for jtype, names in v.items():
        if not isinstance(jtype, str) or isinstance(names, str) or not isinstance(
                names, (list, tuple)):
            raise InvalidArgument(f"{att.name}: {jtype!r} must map to a list of field names,"
                                  f" got {names!r}")
        for name in names:
            check_search_term("field name", name)


def _frozen_fields(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: tuple(n) if isinstance(n, (list, tuple)) else n for k, n in v.items()}
    return v


@attrs.frozen
class SearchConfig:
    """What a queue indexes for search (docs/search.md). Every job gets an entry in the
    shard's time index (its id, scored by enqueue time), the id-prefix index, its type's
    index and its group's; ``fields`` adds one per declared payload field value:
    ``{"email.send": ["customer_id"]}`` indexes ``payload["customer_id"]`` of ``email.send``
    jobs (a dotted name reaches into nested objects). Only scalar values up to
    ``MAX_VALUE_BYTES`` are indexed (strings, numbers, booleans)."""

    fields: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=_frozen_fields,
                                                       validator=_search_fields)
    retention_s: int | None = attrs.field(default=None)
    """How long an index entry is kept (from enqueue): None = the queue's ``dead_ttl_s``
    (a record lives at most that long, but a longer result TTL of its own); entries whose
    record expired earlier are dropped when a search meets them."""

    @retention_s.validator
    def _check_retention(self, att: attrs.Attribute[int | None], v: int | None) -> None:
        if v is not None:
            _positive_int(self, att, v)  # type: ignore[arg-type]

    MAX_VALUE_BYTES = 128


_STALL_WARN_S: float | None = 1.0


@attrs.frozen
class WorkerConfig:
    """How a worker process fetches, runs and recovers jobs."""

    concurrency: int = attrs.field(default=64, validator=_positive_int)
    visibility_timeout_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    """A job whose lease is not renewed for this long is taken over by another worker."""
    fetch_batch: int = attrs.field(default=128, validator=_positive_int)
    block_ms: int = attrs.field(default=2000, validator=_positive_int)
    grace_period_s: float = attrs.field(default=10.0, validator=_positive_seconds)
    heartbeat_interval_s: float = attrs.field(default=5.0, validator=_positive_seconds)
    promote_interval_s: float = attrs.field(default=1.0, validator=_positive_seconds)
    """Longest sleep between promotion rounds (sooner when the next due time is known)."""
    reclaim_interval_s: float | None = attrs.field(
        default=None, validator=_optional_positive_seconds
    )
    """How often to look for lapsed leases; None = a quarter of the visibility timeout."""
    consumer_dead_after_s: float = attrs.field(default=600.0, validator=_positive_seconds)
    """Consumers silent this long, with an empty pending list, are pruned from the group."""
    prune_interval_s: float = attrs.field(default=60.0, validator=_positive_seconds)
    """How often a worker looks for dead consumers to prune."""
    sync_threads: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive_int))
    """Thread pool size for sync handlers; None = concurrency."""
    max_abandoned_threads: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive_int))
    """Extra threads for sync handlers that outlived their timeout (a thread cannot be
    interrupted): up to this many hung handlers never delay other sync jobs; past it, new sync
    jobs wait for a thread and a warning names the stuck jobs. None = the pool size."""
    default_max_attempts: int = attrs.field(default=3, validator=_positive_int)
    default_timeout_s: float | None = attrs.field(
        default=None, validator=_optional_positive_seconds
    )
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    log_dead_tracebacks: bool = True
    """Log the handler's traceback with the ERROR line of a dead-lettered job (every failed
    attempt is a WARNING line without it)."""
    loop_stall_warn_s: float | None = attrs.field(
        default=_STALL_WARN_S, validator=_optional_positive_seconds)
    """A watchdog thread logs a WARNING, with the blocking job and its stack, when the event
    loop does not answer for this long (a handler blocking it); None turns it off."""
    promote: bool = True
    """Promote due delayed/retry jobs from this worker (on unless a scheduler daemon does it)."""
    trace_parent: bool = True
    """Parent each attempt's span on the producer's span (True) or only link to it (False)."""
    group_reconcile_interval_s: float = attrs.field(default=30.0, validator=_positive_seconds)
    """How often the worker re-checks its queues' group slots against the job records and
    frees leaked ones (docs/fairness.md#reconcile)."""
    gauges_interval_s: float = attrs.field(default=10.0, validator=_positive_seconds)
    """Queue gauges (ready, pending, ...) are re-read at most this often, and only while a
    metrics reader is collecting them."""

    own_shards: bool = True
    """On a sharded queue, the live workers split its shards among them: each fetches new
    work only from its own part, and they rebalance as workers come and go
    (docs/scaling.md#who-reads-which-shard). False: every worker fetches from every shard.
    A dead worker's shards pass on once its heartbeat is older than 3 heartbeat intervals
    (keep that under the visibility timeout, or its shards wait the longer of the two)."""

    pool: str = attrs.field(default="thread", validator=_pool_kind)
    """Where handlers run: ``"thread"`` (async ones on the event loop, sync ones in threads)
    or ``"process"`` (every handler in a pool of child processes, as ``isolation="process"``
    does for one handler; docs/production.md#isolated-handlers-the-process-pool)."""
    pool_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive_int))
    """Child processes of the process pool (jobs beyond it wait for a child, their leases
    renewed, their timeouts not running yet); None = the number of CPUs."""
    pool_registry: str | None = attrs.field(default=None, validator=_optional_pool_registry)
    """``module:attribute`` of the Registry, which each child imports (``streamq worker``
    passes its own); None = found in a module of the registry's handlers."""
    max_jobs_per_child: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive_int))
    """A pool child is replaced (between jobs) after this many jobs; None = never."""
    max_memory_per_child_mb: float | None = attrs.field(
        default=None, validator=_optional_megabytes)
    """A pool child whose resident memory (RSS, in MiB) reaches this after a job is
    replaced before its next one; None = never."""
    pool_start_timeout_s: float = attrs.field(default=60.0, validator=_positive_seconds)
    """How long a new pool child may take to import the registry and run its startup hooks."""
    start_wait_s: float = attrs.field(default=0.0, validator=start_wait_seconds)
    """How long ``start()`` keeps trying again while Redis is not usable yet (refused or
    timed-out connections, LOADING after a restart, READONLY or MASTERDOWN in a failover,
    OOM): one WARNING per try, backing off up to 5 s. 0 = give up after each set-up call's
    own few retries (about 3 s). A wrong password, a refused permission or a bad URL fails at
    once whatever this says."""

    @property
    def reclaim_every_s(self) -> float:
        if self.reclaim_interval_s is not None:
            return self.reclaim_interval_s
        return max(0.05, self.visibility_timeout_s / 4)

    @property
    def renew_every_s(self) -> float:
        return max(0.05, self.visibility_timeout_s / 3)
