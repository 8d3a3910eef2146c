"""The one key builder. No key name is assembled anywhere else (and never inside Lua).

Every key of queue ``Q`` carries the hash tag ``{Q}``, so all keys of a queue live in one
Redis Cluster slot and one script may touch them all.

A sharded queue (``QueueConfig(shards=N)``) is N complete key sets: shard 0 keeps the keys
above, shard i >= 1 has the same keys under the hash tag ``{Q#i}`` (``#`` cannot occur in
a queue name, so no other queue's tag can equal it). A job lives in shard
``shard_of(job_id, N)`` (CRC-32 of the id's UTF-8 bytes, modulo N): every key one script
touches belongs to one shard, so scripts never cross slots (docs/scaling.md#sharded-queues).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import attrs

from .errors import InvalidArgument, InvalidGroup, InvalidJobId, InvalidQueueName

_QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=#-]{0,199}")
_GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,63}")
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

MAX_SHARDS = 256
"""Upper bound of ``QueueConfig.shards``: a worker runs one blocking fetch loop (and keeps one
connection busy) per shard of each queue, and every admin read of a whole queue visits every
shard; 256 shards already spread a queue over any cluster one would run (each shard is one
slot), while keeping those costs bounded."""

GROUP = "streamq"

RECENT_KEEP = 100
"""Entries of a shard's recent completions list (``Keys.recent``): a few KB per queue."""
"""The consumer group every worker of every queue reads with."""

PRIORITIES = range(5)
"""Job priorities: 0 (lowest) .. 4 (highest), higher is fetched sooner (docs/fairness.md)."""
DEFAULT_PRIORITY = 2
"""A job without ``priority=`` has this one: its entry goes in the queue's ``stream`` as before
priorities existed; every other level has a stream of its own (``Keys.stream_level``)."""


def levels_in_use(raw: Any) -> list[int]:
    """The priority levels in use from a SMEMBERS reply of ``Keys.levels`` (or an Exception
    from a pipeline: none), highest first, with the default level always; members that are
    not a known level are ignored."""
    found = {DEFAULT_PRIORITY}
    for v in () if raw is None or isinstance(raw, Exception) else raw:
        try:
            p = int(v)
        except (TypeError, ValueError):
            continue
        if p in PRIORITIES:
            found.add(p)
    return sorted(found, reverse=True)


def check_priority(priority: object) -> int:
    """A priority 0..4 (an int, not a bool); raises InvalidPriority."""
    from .errors import InvalidPriority

    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in PRIORITIES:
        raise InvalidPriority(f"priority must be an integer {PRIORITIES[0]}..{PRIORITIES[-1]}"
                              f" (higher = sooner; default {DEFAULT_PRIORITY}), got {priority!r}")
    return priority


def check_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name):
        raise InvalidQueueName(
            f"invalid queue name {name!r}: 1-128 characters of A-Z a-z 0-9 . _ : @ / + = -,"
            " starting with a letter or digit"
        )
    return name


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise InvalidJobId(
            f"invalid job id {job_id!r}: 1-200 characters of A-Z a-z 0-9 . _ : @ / + = # -,"
            " starting with a letter or digit"
        )
    return job_id


def check_group(group: str) -> str:
    """A group name (``enqueue(group=...)``): 1-64 characters of A-Z a-z 0-9 . _ : @ / + = -,
    starting with a letter or digit. No space: the group scripts keep '<group> <id>' members
    in one sorted set per shard and find a group's members by the prefix '<group> '."""
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise InvalidGroup(
            f"invalid group {group!r}: 1-64 characters of A-Z a-z 0-9 . _ : @ / + = -,"
            " starting with a letter or digit"
        )
    return group


_TERM_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,63}")


def check_search_term(what: str, v: object) -> str:
    """A declared search field name: 1-64 of A-Z a-z 0-9 . _ / - (dots reach into nested
    objects); raises InvalidArgument."""
    if not isinstance(v, str) or not _TERM_RE.fullmatch(v):
        raise InvalidArgument(f"invalid search {what} {v!r}: 1-64 characters of A-Z a-z 0-9"
                              " . _ / -")
    return v


def queues_key(prefix: str = "streamq") -> str:
    """SET of queue names that workers and schedulers have served (for `streamq stats`).

    It has no hash tag: it is written with a plain SADD, never inside a queue's script."""
    return f"{prefix}:queues"


def shard_of(job_id: str, shards: int) -> int:
    """The shard of a job: CRC-32 (zlib) of the id's UTF-8 bytes modulo ``shards``. Fixed
    and documented (never Python's salted ``hash()``): every producer, worker and admin of
    any version and language finds a job in the same shard, so dedup by id stays exact."""
    if shards == 1:
        return 0
    return zlib.crc32(job_id.encode()) % shards


def _shard_no(_inst: object, _att: object, v: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < MAX_SHARDS:
        raise InvalidArgument(f"shard must be an integer 0..{MAX_SHARDS - 1}, got {v!r}")


def _level(_inst: object, _att: object, v: int) -> None:
    check_priority(v)


@attrs.frozen
class Keys:
    """Key names of one queue (of one shard of it: ``shard`` 0 is the unsharded layout).
    ``level``: the priority whose ready stream ``stream`` names (a worker keeps one lane of
    state per shard and level in use); every other key is the shard's, whatever the level."""

    queue: str = attrs.field(validator=lambda _i, _a, v: check_queue_name(v))
    prefix: str = "streamq"
    shard: int = attrs.field(default=0, validator=_shard_no)
    level: int = attrs.field(default=DEFAULT_PRIORITY, validator=_level)
    # derived names, computed once (the worker and producer ask for them per job)
    _shard_tag: str = attrs.field(init=False, eq=False, repr=False, hash=False)
    _tag: str = attrs.field(init=False, eq=False, repr=False, hash=False)
    _base: str = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX_RE.fullmatch(self.prefix):
            raise InvalidQueueName(f"invalid key prefix {self.prefix!r}")
        shard_tag = self.queue if self.shard == 0 else f"{self.queue}#{self.shard}"
        object.__setattr__(self, "_shard_tag", shard_tag)
        object.__setattr__(self, "_tag", shard_tag if self.level == DEFAULT_PRIORITY
                           else f"{shard_tag}^{self.level}")
        object.__setattr__(self, "_base", f"{self.prefix}:{{{shard_tag}}}")

    @property
    def shard_tag(self) -> str:
        """The hash tag's content: the queue name for shard 0, '<queue>#<i>' for shard i."""
        return self._shard_tag

    @property
    def tag(self) -> str:
        """Names one lane wherever a worker keys its state (leases, loops): the shard's tag
        (``shard_tag``) at the default priority, '<shard tag>^<level>' at another."""
        return self._tag

    def of_shard(self, shard: int) -> Keys:
        """The keys of another shard of the same queue (at the default priority)."""
        return Keys(self.queue, self.prefix, shard)

    def at_level(self, level: int) -> Keys:
        """The same shard's keys with ``stream`` naming the ready stream of ``level``."""
        return self if level == self.level else Keys(self.queue, self.prefix, self.shard, level)

    def for_job(self, job_id: str, shards: int) -> Keys:
        """The keys of the shard that holds ``job_id`` in a queue of ``shards`` shards."""
        n = shard_of(job_id, shards)
        return self if n == self.shard and self.level == DEFAULT_PRIORITY else Keys(
            self.queue, self.prefix, n)

    @property
    def meta(self) -> str:
        """HASH on shard 0: 'shards' = the queue's shard count (written once, HSETNX)."""
        return f"{self.prefix}:{{{self.queue}}}:meta"

    @property
    def base(self) -> str:
        return self._base

    @property
    def stream(self) -> str:
        """The ready stream of this key set's level (the default level: ``<base>:stream``)."""
        return self.stream_level(self.level)

    def stream_level(self, level: int) -> str:
        """The ready stream of one priority level: ``<base>:stream`` for the default level
        (the layout before priorities), ``<base>:stream:p<level>`` for the others."""
        if level == DEFAULT_PRIORITY:
            return f"{self.base}:stream"
        return f"{self.base}:stream:p{level}"

    @property
    def level_streams(self) -> list[str]:
        """The ready streams of every level but the default, lowest first (scripts that
        route a job by its priority get them in KEYS)."""
        return [self.stream_level(p) for p in PRIORITIES if p != DEFAULT_PRIORITY]

    @property
    def tickets(self) -> str:
        """ZSET of the hand-off tickets of idle workers reading this level's ready stream
        (ticket.lua, enqueue.lua: docs/performance.md#hand-off), scored by when each lapses."""
        return f"{self.stream}:tickets"

    def inbox(self, token_prefix: str) -> str:
        """STREAM where producers put the jobs they started for one idle worker run (named
        by its lease token prefix, new at every start of a worker): ticket.lua."""
        return f"{self.base}:inbox:{token_prefix}"

    @property
    def rate(self) -> str:
        """STRING: the queue-wide rate limiter's state, the theoretical arrival time in µs
        (GCRA; claim.lua and start.lua), expiring once it is in the past."""
        return f"{self.base}:rate"

    @property
    def levels(self) -> str:
        """SET of the priority levels other than the default that jobs of this shard have
        used (written by enqueue.lua; workers read it to know which streams to fetch from)."""
        return f"{self.base}:levels"

    @property
    def delayed(self) -> str:
        return f"{self.base}:delayed"

    @property
    def dead(self) -> str:
        return f"{self.base}:dead"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @property
    def lease_seq(self) -> str:
        return f"{self.base}:lease_seq"

    @property
    def paused(self) -> str:
        return f"{self.base}:paused"

    @property
    def cron(self) -> str:
        """Cron state: '<name>:last' = last fired tick (ms), '<name>' = ops info (JSON)."""
        return f"{self.base}:cron"

    @property
    def workers(self) -> str:
        return f"{self.base}:workers"

    @property
    def types(self) -> str:
        """HASH: job type -> when a worker of this queue last published a handler for it."""
        return f"{self.base}:types"

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel told when a delayed job becomes the earliest due."""
        return f"{self.base}:wake"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel told the job id when a running job of this shard is asked to stop
        (cancel.lua); every worker of the shard listens (streamq/_worker/cancel.py)."""
        return f"{self.base}:cancel"

    @property
    def series_minutes(self) -> str:
        """HASH: epoch minute -> that minute's outcomes (JSON), kept 6 hours (timeseries.lua)."""
        return f"{self.base}:ts:m"

    @property
    def series_hours(self) -> str:
        """HASH: epoch hour -> that hour's outcomes (JSON), kept 30 days."""
        return f"{self.base}:ts:h"

    # Groups (docs/fairness.md). Six keys per shard, whatever the number of groups: the
    # scripts take them in KEYS (group_keys, in this order) and never name a group's key.
    @property
    def group_wait(self) -> str:
        """ZSET (all scores 0): '<group> <seq, 16 digits><job id>' per grouped job waiting
        for a slot; a group's members sort together, in FIFO order (its wait list)."""
        return f"{self.base}:g:wait"

    @property
    def group_inflight(self) -> str:
        """ZSET (all scores 0): '<group> <job id>' per grouped job holding a slot (admitted
        to the stream, or running); a group's in-flight count is a ZLEXCOUNT."""
        return f"{self.base}:g:fl"

    @property
    def group_index(self) -> str:
        """ZSET (all scores 0) of groups that have waiting or in-flight jobs (listing)."""
        return f"{self.base}:g:idx"

    @property
    def group_config(self) -> str:
        """HASH: 'l:<group>' limit, 'r:<group>' rate '<n> <period ms>', 'p:<group>' paused;
        ' t' / ' h' the wait list's tail / head sequence counters."""
        return f"{self.base}:g:cfg"

    @property
    def group_tat(self) -> str:
        """ZSET: group -> its rate limiter's theoretical arrival time (GCRA), ms."""
        return f"{self.base}:g:tat"

    @property
    def group_parked(self) -> str:
        """ZSET: group -> the time (ms) it may admit again (held back by its rate)."""
        return f"{self.base}:g:parked"

    @property
    def group_keys(self) -> list[str]:
        """The group keys, in the order every script takes them (_groups.lua's gctx): the
        six group keys, then the ready stream of every priority level, lowest first (a job
        admitted from its group's wait list goes to its own level's stream)."""
        return [self.group_wait, self.group_inflight, self.group_index, self.group_config,
                self.group_tat, self.group_parked,
                *(self.stream_level(p) for p in PRIORITIES)]

    def worker_info(self, consumer: str) -> str:
        return f"{self.base}:worker:{consumer}"

    def finished(self, consumer: str) -> str:
        """HASH, 't': the lease tokens of the fire-and-forget jobs (``result_ttl=0``) that
        one worker's last finish.lua call on this level's stream completed, their records
        deleted: a repeat of that call (its reply was lost) still answers 'completed' for
        them. Expires an hour after the last such call."""
        if self.level == DEFAULT_PRIORITY:
            return f"{self.base}:fin:{consumer}"
        return f"{self.base}:fin:p{self.level}:{consumer}"

    @property
    def recent(self) -> str:
        """LIST, newest first: '<finish ms> <job id>' of recently completed jobs, up to 10 per
        finish.lua call, trimmed to ``RECENT_KEEP`` entries (the dashboard's completed tab)."""
        return f"{self.base}:recent"

    def job(self, job_id: str) -> str:
        return f"{self.base}:job:{job_id}"

    # Search (docs/search.md, only with QueueConfig.search): sorted sets of job ids written
    # by enqueue.lua in the same call as the record, scored by the server's enqueue time (ms).
    @property
    def ix_all(self) -> str:
        """ZSET: every indexed job id of the shard -> enqueue ms (the time index)."""
        return f"{self.base}:ix:all"

    @property
    def ix_ids(self) -> str:
        """ZSET, all scores 0: the same ids, for id-prefix lookups (ZRANGEBYLEX); trimmed
        with ``ix_all``."""
        return f"{self.base}:ix:ids"

    def ix_type(self, job_type: str) -> str:
        """ZSET: ids of one job type -> enqueue ms."""
        return f"{self.base}:ix:t:{job_type}"

    def ix_group(self, group: str) -> str:
        """ZSET: ids of one group -> enqueue ms."""
        return f"{self.base}:ix:g:{group}"

    def ix_field(self, job_type: str, field: str, value: str) -> str:
        """ZSET: ids of one job type whose declared payload field has one value -> enqueue ms
        (the value as text: a string as is, a number in JSON form, true/false)."""
        return f"{self.base}:ix:f:{job_type}:{field}={value}"

    @property
    def ix_ew(self) -> str:
        """ZSET, all scores 0: the error-word index of the dead letters (docs/search.md#error-
        text): members '<word>\\0<inverted entry ms, 13 digits><inverted seq, 8 digits>', so
        ZRANGEBYLEX over a word gives its dead letters newest first. Written by ixdead.lua."""
        return f"{self.base}:ix:ew"

    @property
    def ix_ewl(self) -> str:
        """ZSET: the dead letters ``ix_ew`` holds -> their dead-letter ms; members '<ms>-<seq,
        8 digits> <word> <word> ...' (the words to remove with it; the newest is how far
        ixdead.lua has read the dead stream)."""
        return f"{self.base}:ix:ewl"

    @property
    def ix_decl(self) -> str:
        """HASH on shard 0: 'fields' = the declared fields (JSON), 'since' = when a producer
        with a SearchConfig first wrote to the queue (ms; entries start there)."""
        return f"{self.base}:ix:decl"

    def dedup(self, key: str) -> str:
        """STRING: the id of the job that holds dedup key ``key`` (docs/dedup.md). A queue's
        dedup key lives in the shard ``shard_of(key, shards)`` (its jobs' shard)."""
        return f"{self.base}:dd:{key}"

    # Workflows (docs/workflows.md): a waiting job's dependencies live in its own shard's
    # slot, a job's parents in the job's slot; nothing names another slot's key but the
    # parents SET members and outbox messages (data a script never touches outside its slot).
    def deps(self, job_id: str) -> str:
        """SET of a waiting job's pending dependencies: '<policy><index> <queue> <job id>'
        (policy f = fail, c = continue, i = ignore; index: its place in depends_on)."""
        return f"{self.base}:deps:{job_id}"

    def dep_results(self, job_id: str) -> str:
        """HASH of a waiting job's resolved dependencies: '<index> <queue> <job id>' ->
        '<state letter><result or reason>' (c completed, f failed, x cancelled, p purged,
        m missing); deleted when the job completes or is cancelled."""
        return f"{self.base}:dres:{job_id}"

    def parents(self, job_id: str) -> str:
        """SET of the jobs waiting for this one: '<policy><index> <parent record key>
        <parent id>'; read and deleted by the job's terminal transition."""
        return f"{self.base}:par:{job_id}"

    @property
    def outbox(self) -> str:
        """STREAM of resolve messages for parents in another slot, written by a child's
        terminal transition, applied by the relay (resolve.lua) and then deleted."""
        return f"{self.base}:outbox"

    @property
    def waiting(self) -> str:
        """ZSET: id of each waiting job of this shard -> when it started waiting (ms): the
        count, the oldest wait and the repair sweep's index (no SCAN)."""
        return f"{self.base}:waiting"

    def done_channel(self, job_id: str) -> str:
        """Pub/sub channel told when this job reaches a terminal state (releases before the
        shared waiter channel used one per job; their waiters still work)."""
        return f"{self.base}:done:{job_id}"

    def waiter_channel(self, tag: str) -> str:
        """Pub/sub channel of one producer object's waiters: every job it waits on names it
        as its 'notify' channel; messages are '<state> <job id>'."""
        return f"{self.base}:wait:{tag}"


def notify_allowed(keys: Keys, channel: str, job_id: str) -> bool:
    """A notify channel a producer may give a job: the job's own done channel or a waiter
    channel of its queue (nothing else: notifications stay inside the queue)."""
    if channel == keys.done_channel(job_id):
        return True
    prefix = keys.waiter_channel("")
    tag = channel[len(prefix):]
    return channel.startswith(prefix) and 0 < len(tag) <= 64 and tag.isalnum()


def barrier_key(key: str) -> str:
    """STRING ``<prefix>:{<tag>}:barrier`` in the slot of ``key`` (any key of a queue shard):
    with ``QueueConfig.min_replicas`` on a Redis Cluster, a producer writes it (``SET … PX``,
    it expires after a minute) before each WAIT, so the WAIT covers a call that wrote nothing
    (all duplicates); see durable.py."""
    close = key.index("}")
    return f"{key[:close + 1]}:barrier"


def parse_job_key(key: str, prefix: str = "streamq") -> tuple[str, int, str] | None:
    """(queue, shard, job id) of a job record key this builder made (``Keys.job``), as held
    in a parents SET member; None for anything else."""
    m = re.fullmatch(re.escape(prefix) + r":\{([^}#]+)(?:#(\d+))?\}:job:(.+)", key)
    if m is None:
        return None
    try:
        return check_queue_name(m[1]), int(m[2] or 0), check_job_id(m[3])
    except InvalidArgument:
        return None


def shard_keys(queue: str, shards: int, prefix: str = "streamq") -> list[Keys]:
    """The key sets of every shard of a queue, shard 0 first."""
    return [Keys(queue, prefix, i) for i in range(shards)]
