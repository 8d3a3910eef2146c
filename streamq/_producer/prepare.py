"""Producer logic shared by Queue and AsyncQueue: validation, script arguments, reply parsing."""

from __future__ import annotations

import binascii
import datetime as dt
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .._core import dedup as _dedup
from .._core import durable
from .._core import search as _search
from .._core import telemetry as tel
from .._core.args import seconds as _seconds
from .._core.config import QueueConfig
from .._core.errors import (
    InvalidArgument,
    InvalidDedup,
    JobFailed,
    PartialEnqueueError,
    PayloadTooLarge,
    QueueFull,
    ReplicationTimeout,
    ResultNotReady,
    ScriptError,
    SerializationError,
)
from .._core.keys import (
    DEFAULT_PRIORITY,
    Keys,
    check_group,
    check_job_id,
    check_priority,
    notify_allowed,
    shard_of,
)
from .._core.model import (
    TERMINAL,
    EnqueueResult,
    JobInfo,
    decode_record,
    plain_options,
)
from .._core.scripts import Arg
from .._core.serde import JsonSerde, dumps_str_keys, render_path

_TYPE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:/-]{0,199}")
_TYPES_SEEN: set[str] = set()  # job types already validated (most producers use a handful)
MAX_BATCH = 1000
"""Jobs per enqueue script call (loops are capped)."""

ENQUEUE_KEYS = ("type", "payload", "job_id", "delay", "run_at", "deadline", "max_attempts",
                "result_ttl", "idempotency_key", "headers", "version", "group", "priority",
                "dedup")


def new_job_id() -> str:
    """22 characters of URL-safe base64 over 16 random bytes (128 bits, like a UUID, in
    10 fewer bytes than hex: the id is stored in the record's key and its stream entry). A
    leading '-' or '_' (not allowed first in a job id) becomes 'x'."""
    # (base64.urlsafe_b64encode, without its two Python-level calls: once per job)
    jid = _b2a(os.urandom(16), newline=False)[:22].translate(_URLSAFE).decode()
    return jid if jid[0] not in "-_" else "x" + jid[1:]


_b2a = binascii.b2a_base64
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _epoch_ms(name: str, v: Any) -> int:
    if not isinstance(v, dt.datetime):
        raise InvalidArgument(f"{name} must be a datetime, got {type(v).__name__}")
    if v.tzinfo is None:
        raise InvalidArgument(f"{name} must be timezone-aware (naive datetimes are ambiguous)")
    # before 1970 is 'long ago', not a negative number (which enqueue.lua reads as relative)
    return max(1, int(v.timestamp() * 1000))


def check_type(job_type: str) -> str:
    """A job type is 1-200 of A-Z a-z 0-9 . _ : / -; raises InvalidArgument."""
    if not isinstance(job_type, str) or not _TYPE_RE.fullmatch(job_type):
        raise InvalidArgument(f"invalid job type {job_type!r}: 1-200 of A-Z a-z 0-9 . _ : / -")
    if type(job_type) is str and len(_TYPES_SEEN) < 1024:
        _TYPES_SEEN.add(job_type)
    return job_type


class Prepared(NamedTuple):  # a plain tuple: one per job on the enqueue hot path
    job_id: str
    key: str
    args: tuple[Arg, ...]
    shard: int = 0
    """The queue shard the job goes to (keys.shard_of its id)."""
    group: str = ""
    """The job's group ('' = none): docs/fairness.md#groups."""
    level: int = DEFAULT_PRIORITY
    """The job's priority (its ready stream: Keys.stream_level)."""
    dedup: _dedup.Dedup | None = None
    """The job's dedup key and mode (docs/dedup.md); the job is in the key's shard."""
    routed: int = 1
    """The shard count ``shard`` was computed by (sent with the call: enqueue.lua refuses a
    job routed by another count than its shard's frozen one; relayout.py re-routes it)."""
    drawn: bool = False
    """A dedup job whose id streamq drew (in its key's shard): re-routing may draw again."""


def prepare(
    keys: Keys,
    cfg: QueueConfig,
    job_type: str,
    payload: Any = None,
    *,
    job_id: str | None = None,
    delay: float | dt.timedelta | None = None,
    run_at: dt.datetime | None = None,
    deadline: float | dt.timedelta | dt.datetime | None = None,
    max_attempts: int | None = None,
    result_ttl: float | dt.timedelta | None = None,
    idempotency_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    version: int = 1,
    trace: Mapping[str, str] | None = None,
    notify: str = "",
    group: str | None = None,
    priority: int | None = None,
    dedup: _dedup.Dedup | None = None,
) -> Prepared:
    """Validate one job and build its slice of enqueue.lua's arguments. Raises InvalidArgument."""
    if type(job_type) is not str or job_type not in _TYPES_SEEN:
        check_type(job_type)
    jid = new_job_id() if job_id is None else check_job_id(job_id)
    if dedup is not None:
        dedup = _dedup.check(dedup)
        jid = _in_dedup_shard(dedup, cfg.shards, jid, job_id is None)
        if dedup.mode == "debounce" and (delay is not None or run_at is not None):
            raise InvalidDedup("dedup mode debounce sets the start (delay_ms): give no"
                               " delay or run_at")
    if notify and not notify_allowed(keys, notify, jid):  # only enqueue_and_wait's channels
        raise InvalidArgument("notify is set by enqueue_and_wait; it cannot be given")
    delay_ms = 0
    run_at_ms = 0
    if delay is not None and run_at is not None:
        raise InvalidArgument("give delay or run_at, not both")
    if delay is not None:
        delay_ms = math.ceil(_seconds("delay", delay, allow_zero=True) * 1000)
    if run_at is not None:
        run_at_ms = _epoch_ms("run_at", run_at)
    if dedup is not None and dedup.delay_ms:  # debounce: the job waits delay_ms
        delay_ms = dedup.delay_ms
    deadline_arg = 0
    if isinstance(deadline, dt.datetime):
        deadline_arg = _epoch_ms("deadline", deadline)
    elif deadline is not None:
        deadline_arg = -math.ceil(_seconds("deadline", deadline, allow_zero=False) * 1000)
    if max_attempts is None:
        attempts = 0
    elif isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not (
        1 <= max_attempts <= 10_000
    ):
        raise InvalidArgument(f"max_attempts must be an integer 1..10000, got {max_attempts!r}")
    else:
        attempts = max_attempts
    ttl_s = cfg.default_result_ttl_s
    if result_ttl is not None:
        seconds = _seconds("result_ttl", result_ttl, allow_zero=True)
        ttl_s = 0 if seconds == 0 else max(1, math.ceil(seconds))  # 0: fire-and-forget
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument(f"version must be a positive integer, got {version!r}")
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        raise InvalidArgument("idempotency_key must be a string")
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must map str to str, got {type(headers).__name__}")
    hdrs = dict(headers) if headers else {}
    if hdrs and not all(isinstance(k, str) and isinstance(v, str) for k, v in hdrs.items()):
        raise InvalidArgument("headers must map str to str")
    options = plain_options(version, attempts, run_at_ms, deadline_arg if deadline_arg > 0
                            else 0, idempotency_key, dict(trace) if trace else {}, hdrs)
    try:
        data = cfg.serde.dumps(payload)
    except SerializationError as exc:
        raise _in_payload(exc) from exc
    opts = cfg.serde.dumps(options) if options else b""
    p = _sealed(keys, cfg, jid, job_type, data, opts, (attempts, ttl_s, deadline_arg,
                                                       delay_ms, run_at_ms, notify))
    if group is not None:
        p = p._replace(group=check_group(group))
    if priority is not None and check_priority(priority) != DEFAULT_PRIORITY:
        p = p._replace(level=priority)
    if dedup is not None:
        p = p._replace(dedup=dedup, drawn=job_id is None)
    return p


def _in_dedup_shard(dedup: _dedup.Dedup, shards: int, jid: str, drawn: bool) -> str:
    """A sharded queue keeps a dedup key, and every job of it, in the shard of the key
    (``shard_of(key, shards)``): a drawn id is drawn again until it lands there (about
    ``shards`` draws), a given one must already (InvalidDedup)."""
    if shards == 1:
        return jid
    want = shard_of(dedup.key, shards)
    if not drawn:
        if shard_of(jid, shards) != want:
            raise InvalidDedup(f"job id {jid!r} is in shard {shard_of(jid, shards)}, its dedup"
                               f" key {dedup.key!r} in shard {want}: a deduplicated job lives in"
                               " its key's shard; let streamq draw the id, or pick one there")
        return jid
    for _ in range(64 * shards):
        if shard_of(jid, shards) == want:
            return jid
        jid = new_job_id()
    raise InvalidDedup(f"no job id found in shard {want}")  # (odds below 1e-27)


def prepare_plain(keys: Keys, cfg: QueueConfig, job_type: str, payload: Any,
                  trace: Mapping[str, str], job_id: str = "", notify: str = "") -> Prepared:
    """``prepare(keys, cfg, job_type, payload, trace=trace)``: enqueue's common case, every
    other option at its default, without prepare's option checks (the same arguments, and
    the same errors). Raises InvalidArgument. ``job_id`` (checked already; '' = a new one)
    and ``notify`` (a waiter channel of this queue): enqueue_and_wait's own options."""
    if type(job_type) is not str or job_type not in _TYPES_SEEN:
        check_type(job_type)
    jid = job_id or new_job_id()
    try:
        data = cfg.serde.dumps(payload)
    except SerializationError as exc:
        raise _in_payload(exc) from exc
    opts = cfg.serde.dumps({"trace": dict(trace)}) if trace else b""  # (plain_options)
    return _sealed(keys, cfg, jid, job_type, data, opts,
                   (0, cfg.default_result_ttl_s, 0, 0, 0, notify))


def _in_payload(exc: SerializationError) -> SerializationError:
    """Name the key path from the payload."""
    path = exc.path
    if not path:
        return exc
    return SerializationError(str(exc).replace(render_path(path), "payload" + render_path(path),
                                               1), path=tuple(path))


def _sealed(keys: Keys, cfg: QueueConfig, jid: str, job_type: str, data: bytes, opts: bytes,
            rest: tuple[Arg, ...]) -> Prepared:
    """enqueue.lua's arguments of one job: id, options, body ('<type> <payload>'), rest."""
    size = len(data) + len(opts) + len(job_type) + 1
    if size > cfg.max_payload_bytes:
        raise PayloadTooLarge(
            f"job {jid!r}: payload and options are {size} bytes, over the queue's"
            f" max_payload_bytes of {cfg.max_payload_bytes}"
        )
    jk = keys.for_job(jid, cfg.shards)  # the job's shard (its id's CRC-32 modulo shards)
    return Prepared(jid, jk.job(jid), (jid, opts, job_type.encode() + b" " + data, *rest),
                    jk.shard, routed=cfg.shards)


def prepare_row(keys: Keys, cfg: QueueConfig, job_type: str, payload: Any, job_id: str,
                delay: float | None, created_ms: int, *, str_keys_only: bool = False
                ) -> Prepared:
    """``prepare(keys, cfg, job_type, payload, job_id=job_id, delay=delay)`` for bulk rows
    (Spark): ``job_type`` already checked (check_type), every other option at its default.
    ``str_keys_only``: the caller knows every mapping in ``payload`` has str keys (built
    from a schema), so the serde's key walk is skipped. Raises InvalidArgument."""
    check_job_id(job_id)
    delay_ms = 0
    if delay is not None:
        delay_ms = math.ceil(_seconds("delay", delay, allow_zero=True) * 1000)
    try:
        data = dumps_str_keys(cfg.serde, payload) if str_keys_only else cfg.serde.dumps(payload)
    except SerializationError as exc:
        raise _in_payload(exc) from exc
    return _sealed(keys, cfg, job_id, job_type, data, b"", (0, cfg.default_result_ttl_s, 0,
                                                            delay_ms, 0, ""))


class RowTemplate(NamedTuple):
    """What prepare_row() sends for a row, around the payload: the body's head."""

    head: str
    """'<type> ': the body is the head and the payload's JSON text."""


def row_template(cfg: QueueConfig, job_type: str, created_ms: int) -> RowTemplate | None:
    """The body head of prepare_row(); None unless the queue's serde is the default JSON one
    (then a payload that is already JSON text is the serialised payload as it is).
    ``created_ms`` is not stored (the record's creation time is the server's)."""
    if type(cfg.serde) is not JsonSerde:
        return None
    return RowTemplate(f"{job_type} ")


def prepare_row_json(keys: Keys, cfg: QueueConfig, tpl: RowTemplate, job_type: str,
                     job_id: str, payload_json: str, delay: float | None) -> Prepared:
    """prepare_row() for a payload that is already valid JSON text (Spark's to_json): the
    same envelope bytes, built from ``tpl``. Raises InvalidArgument."""
    check_job_id(job_id)  # its characters need no JSON escaping
    delay_ms = 0
    if delay is not None:
        delay_ms = math.ceil(_seconds("delay", delay, allow_zero=True) * 1000)
    data = payload_json.encode()
    return _sealed(keys, cfg, job_id, job_type, data, b"", (0, cfg.default_result_ttl_s, 0,
                                                            delay_ms, 0, ""))


def prepare_many(keys: Keys, cfg: QueueConfig, jobs: Iterable[Mapping[str, Any]],
                 trace: Mapping[str, str] | None = None) -> list[Prepared]:
    out: list[Prepared] = []
    for i, spec in enumerate(jobs):
        if not isinstance(spec, Mapping) or "type" not in spec:
            raise InvalidArgument(f"job #{i}: a mapping with at least a 'type' key is required")
        unknown = set(spec) - set(ENQUEUE_KEYS)
        if unknown:
            raise InvalidArgument(f"job #{i}: unknown keys {sorted(unknown)}")
        kw = {k: v for k, v in spec.items() if k not in ("type", "payload")}
        try:
            out.append(prepare(keys, cfg, spec["type"], spec.get("payload"), trace=trace, **kw))
        except InvalidArgument as exc:
            raise type(exc)(f"job #{i}: {exc}") from exc
    return out


def chunks(prepared: Sequence[Prepared]) -> list[Sequence[Prepared]]:
    """Script calls of at most MAX_BATCH jobs, each within one shard (one slot); jobs keep
    their order within a shard. ``in_order`` puts the answers back in the caller's order."""
    if all(p.shard == 0 for p in prepared):
        return [prepared[i:i + MAX_BATCH] for i in range(0, len(prepared), MAX_BATCH)]
    by: dict[int, list[Prepared]] = {}
    for p in prepared:
        by.setdefault(p.shard, []).append(p)
    return [part[i:i + MAX_BATCH] for _, part in sorted(by.items())
            for i in range(0, len(part), MAX_BATCH)]


def in_order(prepared: Sequence[Prepared], batches: Sequence[Sequence[Prepared]],
             results: Sequence[EnqueueResult]) -> list[EnqueueResult]:
    """``results`` (batch after batch, from ``chunks``) in the order of ``prepared``."""
    if len(batches) <= 1 or all(p.shard == 0 for p in prepared):
        return list(results)
    at = {id(p): i for i, p in enumerate(prepared)}
    out: list[EnqueueResult | None] = [None] * len(prepared)
    flat = (p for b in batches for p in b)
    for p, r in zip(flat, results, strict=True):
        out[at[id(p)]] = r
    return [r for r in out if r is not None]


def enqueue_call(
    keys: Keys, cfg: QueueConfig, batch: Sequence[Prepared],
    tags: Sequence[str] | None = None, *, handoff: bool = False,
) -> tuple[list[str], list[Arg]]:
    """enqueue.lua's keys and arguments for ``batch`` (jobs of one shard: see ``chunks``).
    ``tags``: one writer tag per job (the Spark path: it identifies the row, see
    enqueue.lua); without, a repeated call is told by its bodies and options. ``handoff``:
    jobs may go straight to idle workers' inboxes, started (docs/performance.md#hand-off)."""
    if batch and batch[0].shard != keys.shard:
        keys = keys.of_shard(batch[0].shard)
    h = _head(keys, cfg)
    k = list(h.keys)
    k.extend(p.key for p in batch)
    args: list[Arg] = [*h.args, len(batch)]
    if tags is None:
        for p in batch:
            args.extend(p.args)
            args.append("")
    else:
        for p, tag in zip(batch, tags, strict=True):
            args.extend(p.args)
            args.append(tag)
    grouped = any(p.group for p in batch)
    if handoff or grouped:  # else an ungrouped batch is sent as before
        k.extend(h.group_keys)
        args.append(h.group_arg)
        if grouped:  # (else no '' per job: enqueue.lua tells by the count of arguments)
            args.extend(p.group for p in batch)
    if any(p.level != DEFAULT_PRIORITY for p in batch):  # then the last 5 keys and N args:
        k.extend(h.level_keys)  # enqueue.lua routes each job by priority
        args.extend("" if p.level == DEFAULT_PRIORITY else p.level for p in batch)
    if handoff:  # the last 3 keys (with the group keys above: enqueue.lua tells them apart)
        k.extend(h.handoff_keys)
    if any(p.dedup is not None for p in batch):  # the dedup section, after everything
        _dedup_section(keys, batch, k, args)
    if cfg.search is not None and batch:  # the search section, after that (docs/search.md)
        _search.section(keys, cfg, batch, k, args)
    _compact(args, len(batch))
    # the count the jobs were routed by (enqueue.lua's freeze check: its header)
    head = args[3]
    args[3] = (f"{head.decode() if isinstance(head, bytes) else head}"
               f"/{batch[0].routed if batch else cfg.shards}")
    return k, args


def _compact(args: list[Arg], n: int) -> None:
    """enqueue.lua's compact form, in place, for a batch whose jobs differ only in id and
    body (an ``enqueue_many`` of one kind of job): ARGV[4] gets a leading '=', the 8 values
    the jobs share come once, then id and body per job, 2 arguments instead of 10 (each
    argument costs redis-server its parsing, an object and a Lua string: about 1,200
    instructions; docs/performance.md#floor-per-job-on-one-server-issue-32). Its ids are
    distinct: a batch with an id twice is sent in full (enqueue.lua's plain batch, which
    writes a compact call whose records are all new, checks no id twice itself)."""
    if n < 2:
        return
    shared = args[5:6] + args[7:14]
    for b in range(14, 4 + 10 * n, 10):
        if args[b + 1] != shared[0] or args[b + 3:b + 10] != shared[1:]:
            return
    if len(set(args[4:4 + 10 * n:10])) != n:
        return
    rows: list[Arg] = [*shared]
    for b in range(4, 4 + 10 * n, 10):
        rows.append(args[b])
        rows.append(args[b + 2])
    head = args[3]  # N, 'N:D' or 'N:D:S' (an int or a str)
    args[3] = "=" + (head.decode() if isinstance(head, bytes) else str(head))
    args[4:4 + 10 * n] = rows


def _dedup_section(keys: Keys, batch: Sequence[Prepared], k: list[str], args: list[Arg]
                   ) -> None:
    """enqueue.lua's dedup section (its header): N becomes 'N:D', then per dedup job its key
    (KEYS) and index, mode letter, TTL, delay and max wait (ARGV), after the record prefix."""
    d = 0
    args.append(keys.job(""))
    for i, p in enumerate(batch, 1):
        dd = p.dedup
        if dd is None:
            continue
        d += 1
        k.append(keys.dedup(dd.key))
        args.extend((i, _dedup.LETTER[dd.mode], dd.ttl_ms, dd.delay_ms or 0,
                     dd.max_wait_ms or 0))
    args[3] = f"{len(batch)}:{d}"  # (after the 3 head arguments)


class _Head(NamedTuple):
    """The parts of enqueue.lua's keys and arguments that depend on the queue shard and its
    config only."""

    cfg: QueueConfig
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    group_keys: tuple[str, ...]
    group_arg: str
    level_keys: tuple[str, ...]
    handoff_keys: tuple[str, ...]


_HEADS: dict[tuple[Any, ...], _Head] = {}
_HEADS_MAX = 256


def _head(keys: Keys, cfg: QueueConfig) -> _Head:
    """enqueue_call's fixed parts, built once per (config object, shard): formatting the
    ~20 key names of a call was a quarter of a lone enqueue's Python time. The entry keeps
    its config, so an id seen again is the same object."""
    memo = (id(cfg), keys.queue, keys.prefix, keys.shard, keys.level)
    h = _HEADS.get(memo)
    if h is None or h.cfg is not cfg:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        h = _Head(cfg, (keys.stream, keys.delayed, keys.stats, keys.events),
                  (cfg.events_arg, cfg.max_depth, keys.wake_channel), tuple(keys.group_keys),
                  cfg.group_arg, (keys.levels, *keys.level_streams),
                  (keys.tickets, keys.paused, keys.dead))
        _HEADS[memo] = h
    return h


def parse_enqueue(
    cfg: QueueConfig, batch: Sequence[Prepared], reply: list[Any] | int, *, retried: bool
) -> list[EnqueueResult]:
    if isinstance(reply, int):  # enqueue.lua's plain batch (its header's F): N, every job
        if abs(reply) != len(batch):  # queued; -N, every job scheduled
            raise ScriptError(f"enqueue.lua answered {reply} for {len(batch)} jobs")
        if reply > 0:
            return [EnqueueResult(p.job_id, "queued", "queued") for p in batch]
        return [EnqueueResult(p.job_id, "scheduled", "scheduled") for p in batch]
    out: list[EnqueueResult] = []
    at = 0
    for p in batch:
        st = reply[at].decode()
        if st == "deduplicated":  # folded by its dedup key into the job it names
            into, state = reply[at + 1].decode(), reply[at + 2].decode()
            at += 3
            out.append(EnqueueResult(into, "deduplicated", state, reason=(
                p.dedup.mode if p.dedup is not None else "")))
            continue
        if st != "duplicate":  # one element: the status (enqueue.lua's header)
            at += 1
            out.append(EnqueueResult(p.job_id, st, st) if st != "full" else
                       EnqueueResult(p.job_id, "rejected", "", reason="queue full"))
            continue
        _, state, result, error, mine = reply[at:at + 5]
        at += 5
        if retried and int(mine) == 1:
            # an earlier try of this very call went through before the connection dropped
            st_state = state.decode()
            out.append(EnqueueResult(p.job_id, "scheduled" if st_state == "scheduled" else "queued",
                                     st_state))
            continue
        res = cfg.serde.loads(result) if result else None
        err = cfg.serde.loads(error) if error else None
        out.append(EnqueueResult(p.job_id, st, state.decode(), res, err))
    return out


Part = tuple[list[EnqueueResult], int]
"""One enqueue script call's results, with the replicas that confirmed it."""


def parsed_each(cfg: QueueConfig, batches: Sequence[Sequence[Prepared]], replies: Sequence[Any],
                acks: Sequence[int], retried: bool) -> list[Part | Exception]:
    """Each call's results (and confirming replicas), or its own error (``durable.run_each``)."""
    out: list[Part | Exception] = []
    for b, reply, n in zip(batches, replies, acks, strict=True):
        out.append(reply if isinstance(reply, Exception) else
                   (parse_enqueue(cfg, b, reply, retried=retried), n))
    return out


def answered_many(queue: str, cfg: QueueConfig, prepared: Sequence[Prepared],
                  batches: Sequence[Sequence[Prepared]], outcomes: Sequence[Part | Exception]
                  ) -> list[EnqueueResult]:
    """enqueue_many's answer from each call's outcome: every job's EnqueueResult in the
    caller's order; ReplicationTimeout as ``durable.confirm`` says. When some calls failed
    (their errors, after the retries) and others were answered: PartialEnqueueError, every
    job's outcome in it (the written jobs counted in the metrics); when none was answered:
    the first error itself."""
    flat: list[EnqueueResult] = []
    parts: list[Part] = []
    errors: dict[str, BaseException] = {}
    first: Exception | None = None
    for b, o in zip(batches, outcomes, strict=True):
        if isinstance(o, Exception):
            first = first or o
            why = str(o) or type(o).__name__
            for p in b:
                errors[p.job_id] = o
                flat.append(EnqueueResult(p.job_id, "error", "", reason=why, exception=o))
        else:
            flat.extend(o[0])
            parts.append(o)
    out = in_order(prepared, batches, flat)
    if first is None:
        durable.confirm(cfg, out, parts)
        return out
    if not parts:
        raise first
    replication: ReplicationTimeout | None = None
    try:
        durable.confirm(cfg, [r for r in out if r.status != "error"], parts)
    except ReplicationTimeout as exc:
        replication = exc
    count(queue, [r for r in out if r.status != "error"])
    raise PartialEnqueueError(queue, out, errors, replication) from first


def count(queue: str, results: list[EnqueueResult]) -> list[EnqueueResult]:
    """Feed the enqueue metrics."""
    accepted = sum(1 for r in results if r.status in ("queued", "scheduled"))
    dup = sum(1 for r in results if r.status in ("duplicate", "deduplicated"))
    attrs = tel.attrs_for(queue)
    if accepted:
        tel.ENQUEUED.add(accepted, attrs)
    if dup:
        tel.DUPLICATES.add(dup, attrs)
    return results


def check_waitable(options: Mapping[str, Any]) -> None:
    """enqueue_and_wait needs the job's record when it completes."""
    ttl = options.get("result_ttl")
    if ttl is not None and not isinstance(ttl, bool) and (
            ttl == 0 or (isinstance(ttl, dt.timedelta) and ttl.total_seconds() == 0)):
        raise InvalidArgument("enqueue_and_wait needs the result: result_ttl=0 (fire-and-forget)"
                              " deletes it on completion; use enqueue, or a positive result_ttl")


def single(queue: str, r: EnqueueResult) -> EnqueueResult:
    """A single enqueue's answer (counted with its batch: see Queue._enqueue_each)."""
    if r.status == "rejected":
        raise QueueFull(queue, r.job_id)
    return r


def inline_result(raw: bytes, serde: Any) -> Any:
    """A completed job's result as finish.lua put it in a waiter message (b'' = None), read
    as JobInfo.result reads the record's (undecodable bytes come back as they are)."""
    if not raw:
        return None
    try:
        return serde.loads(raw)
    except SerializationError:
        return raw


def outcome(info: JobInfo) -> Any:
    """The result of a finished job, or the error it ended with."""
    if info.state == "completed":
        return info.result
    if info.state in TERMINAL:
        raise JobFailed(info.id, info.state, info.error or ({"message": info.reason}
                                                             if info.reason else None))
    raise ResultNotReady(f"job {info.id!r} is {info.state}")


def to_info(keys: Keys, cfg: QueueConfig, job_id: str, h: dict[bytes, bytes]) -> JobInfo:
    return decode_record(keys.queue, job_id, h, cfg.serde)
