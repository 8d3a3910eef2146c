"""Admin operations, written once as sans-IO generators.

Each operation yields a *step* (a list of commands and script calls, sent as one pipeline)
and receives the replies (an exception object in place of a failed command). The sync and
async drivers in ``_core/driver.py`` run them; no operation touches a connection itself.
Every listing works in pages of at most ``PAGE`` entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from .._core.config import QueueConfig
from .._core.driver import Call, Cmd, Op, _dict, _s, _server_ms, ok
from .._core.errors import InvalidArgument, JobNotFound, UnknownQueue
from .._core.keys import (
    DEFAULT_PRIORITY,
    GROUP,
    PRIORITIES,
    Keys,
    check_job_id,
    levels_in_use,
    queues_key,
)
from .._core.model import BRIEF_FIELDS, JobInfo, brief, decode_record, entry_id, record_state
from .._core.scripts import Arg

T = TypeVar("T")
PAGE = 1000


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


# ------------------------------------------------------------------ stats


@attrs.frozen
class LevelStats:
    """One priority level's ready stream (docs/fairness.md#priorities)."""

    ready: int
    """Entries of this level not yet delivered to any worker."""
    pending: int
    """Entries of this level delivered and not settled."""
    oldest_ready_age_s: float | None
    """Age of the oldest undelivered entry of this level (None: none waiting)."""


@attrs.frozen
class QueueStats:
    queue: str
    ready: int
    """Entries not yet delivered to any worker (every priority level)."""
    pending: int
    """Entries delivered and not settled (in the PEL): running, or held by a dead worker."""
    scheduled: int
    retrying: int
    dead: int
    consumers: int
    workers_alive: int
    paused: bool
    oldest_ready_age_s: float | None
    counters: dict[str, int]
    """Lifetime counters: enqueued, started, completed, retried, failed, reclaimed, ..."""
    group_waiting: int = 0
    """Grouped jobs waiting for a slot of their group (not in the stream: not in ready)."""
    group_in_flight: int = 0
    """Grouped jobs holding a slot (in ready or pending)."""
    groups: int = 0
    """Groups with waiting or in-flight jobs (per shard: summed over shards)."""
    levels: dict[int, LevelStats] = attrs.field(factory=dict)
    """Per priority level in use (the default, 2, always): ready, pending, oldest age."""
    waiting: int = 0
    """Jobs waiting for their dependencies (workflows: docs/workflows.md)."""
    oldest_waiting_age_s: float | None = None
    """How long the oldest of them has waited."""


def _group(groups: Any) -> tuple[int, int, str]:
    """(pending, consumers, last delivered id) of streamq's group in an XINFO GROUPS reply."""
    if isinstance(groups, Exception):
        return 0, 0, "0-0"
    for g in groups:
        gd = _dict(g)
        if _s(gd.get("name", "")) == GROUP:
            return int(gd["pending"]), int(gd["consumers"]), _s(gd["last-delivered-id"])
    return 0, 0, "0-0"


def stats(keys: Keys, worker_alive_ms: int = 30_000) -> Op[QueueStats]:
    r = yield [Cmd.of("TIME"), Cmd.of("SMEMBERS", keys.levels),
               Cmd.of("ZCARD", keys.delayed), Cmd.of("XLEN", keys.dead),
               Cmd.of("HGETALL", keys.stats), Cmd.of("EXISTS", keys.paused),
               Cmd.of("EXISTS", keys.stream, keys.delayed, keys.dead, keys.stats),
               Cmd.of("ZCARD", keys.group_wait), Cmd.of("ZCARD", keys.group_inflight),
               Cmd.of("ZCARD", keys.group_index), Cmd.of("ZCARD", keys.waiting),
               Cmd.of("ZRANGE", keys.waiting, 0, 0, "WITHSCORES")]
    if not ok(r[6]):
        raise UnknownQueue(f"queue {keys.queue!r} does not exist (no keys under {keys.base})")
    now = _server_ms(ok(r[0]))
    levels = levels_in_use(r[1])
    delayed, dead = ok(r[2]), ok(r[3])
    counters = {_s(k): int(v) for k, v in _dict(ok(r[4])).items()}
    per = yield [c for p in levels for c in (Cmd.of("XLEN", keys.stream_level(p)),
                                             Cmd.of("XINFO", "GROUPS", keys.stream_level(p)))]
    groups = [(ok(per[2 * i]) if not isinstance(per[2 * i], Exception) else 0,
               *_group(per[2 * i + 1])) for i in range(len(levels))]
    r2 = yield [*(Cmd.of("XRANGE", keys.stream_level(p), f"({g[3]}", "+", "COUNT", 1)
                  for p, g in zip(levels, groups, strict=True)),
                Cmd.of("ZCOUNT", keys.workers, now - worker_alive_ms, "+inf")]
    by_level: dict[int, LevelStats] = {}
    for i, (p, (xlen, pend, _consumers, _last)) in enumerate(zip(levels, groups, strict=True)):
        first = r2[i] if not isinstance(r2[i], Exception) else []
        age = (now - _entry_ms(_s(first[0][0]))) / 1000 if first else None
        by_level[p] = LevelStats(ready=max(0, int(xlen) - pend), pending=pend,
                                 oldest_ready_age_s=age)
    ages = [v.oldest_ready_age_s for v in by_level.values() if v.oldest_ready_age_s is not None]
    retrying = max(0, counters.get("retrying_now", 0))
    return QueueStats(
        queue=keys.queue, ready=sum(v.ready for v in by_level.values()),
        pending=sum(v.pending for v in by_level.values()),
        scheduled=max(0, delayed - retrying), retrying=min(retrying, delayed), dead=dead,
        consumers=max(g[2] for g in groups), workers_alive=int(ok(r2[-1])),
        paused=bool(ok(r[5])), oldest_ready_age_s=max(ages) if ages else None,
        counters=counters, levels=by_level, group_waiting=int(ok(r[7])),
        group_in_flight=int(ok(r[8])), groups=int(ok(r[9])), waiting=int(ok(r[10])),
        oldest_waiting_age_s=(now - int(float(ok(r[11])[1]))) / 1000 if ok(r[11]) else None)


# ------------------------------------------------------------------ pending


@attrs.frozen
class PendingEntry:
    entry_id: str
    job_id: str
    type: str
    state: str
    consumer: str
    idle_s: float
    deliveries: int
    attempt: int


@attrs.frozen
class Page:
    items: list[Any]
    cursor: str | None
    """Pass back to get the next page; None when the listing is complete."""


def level_of(raw: Any) -> int:
    """A record's priority ('p'; absent: the default)."""
    try:
        p = int(raw) if raw else DEFAULT_PRIORITY
    except ValueError:
        return DEFAULT_PRIORITY
    return p if p in PRIORITIES else DEFAULT_PRIORITY


def split_cursor(cursor: str | None) -> tuple[int | None, str | None]:
    """A listing cursor over several level streams: '<id>' (the default level's, as before
    priorities) or 'p<level>:<id>' (another level's)."""
    if cursor and cursor.startswith("p") and ":" in cursor:
        level, _, rest = cursor[1:].partition(":")
        if level.isdigit() and int(level) in PRIORITIES:
            return int(level), rest or None
    return (DEFAULT_PRIORITY if cursor else None), cursor


def join_cursor(level: int, cursor: str | None) -> str | None:
    if cursor is None or level == DEFAULT_PRIORITY:
        return cursor
    return f"p{level}:{cursor}"


def over_levels(keys: Keys, cursor: str | None, limit: int,
                one: Callable[[Keys, str | None, int], Op[Page]]) -> Op[Page]:
    """A listing over every priority level's stream, highest first: one(keys at a level,
    cursor in it, how many) lists one stream; the cursor says where to go on."""
    (raw,) = yield [Cmd.of("SMEMBERS", keys.levels)]
    levels = levels_in_use(raw)
    at, inner = split_cursor(cursor)
    if at is not None and at in levels:
        levels = levels[levels.index(at):]
    items: list[Any] = []
    for i, level in enumerate(levels):
        page = yield from one(keys.at_level(level), inner if i == 0 else None,
                              limit - len(items))
        items.extend(page.items)
        if page.cursor is not None:
            return Page(items, join_cursor(level, page.cursor))
        if len(items) >= limit:
            nxt = levels[i + 1] if i + 1 < len(levels) else None
            return Page(items, None if nxt is None else f"p{nxt}:")
    return Page(items, None)


def pending(keys: Keys, *, min_idle_s: float = 0, consumer: str | None = None,
            count: int = 100, cursor: str | None = None) -> Op[Page]:
    """Delivered, unsettled entries of every priority level (highest first), a page."""
    count = max(1, min(count, PAGE))

    def one(k: Keys, c: str | None, n: int) -> Op[Page]:
        return _pending(k, min_idle_s=min_idle_s, consumer=consumer, count=n, cursor=c)

    return (yield from over_levels(keys, cursor, count, one))


def _pending(keys: Keys, *, min_idle_s: float = 0, consumer: str | None = None,
             count: int = 100, cursor: str | None = None) -> Op[Page]:
    count = max(1, min(count, PAGE))
    args: list[Any] = ["XPENDING", keys.stream, GROUP]
    if min_idle_s > 0:
        args += ["IDLE", int(min_idle_s * 1000)]
    args += [f"({cursor}" if cursor else "-", "+", count]
    if consumer:
        args.append(consumer)
    (raw,) = yield [Cmd(tuple(args))]
    if isinstance(raw, Exception):
        if "NOGROUP" in str(raw):
            return Page([], None)
        raise raw
    rows = [(_s(e[0]), _s(e[1]), int(e[2]), int(e[3])) for e in raw]
    fetched = yield [Cmd.of("XRANGE", keys.stream, eid, eid) for eid, *_ in rows]
    ids = []
    for rep in fetched:
        entries = ok(rep)
        fields = _dict(entries[0][1]) if entries and entries[0][1] else {}
        ids.append(_s(fields.get("id", b"")))
    recs = yield [Cmd.of("HMGET", keys.job(j), *BRIEF_FIELDS) if j else
                  Cmd.of("ECHO", "") for j in ids]
    items = []
    for (eid, cons, idle, deliveries), jid, rec in zip(rows, ids, recs, strict=True):
        t, st, att = brief(ok(rec)) if jid else ("", "", 0)
        items.append(PendingEntry(eid, jid, t, st, cons, idle / 1000, deliveries, att))
    return Page(items, rows[-1][0] if len(rows) == count else None)


# ------------------------------------------------------------------ jobs


def job(keys: Keys, cfg: QueueConfig, job_id: str) -> Op[JobInfo]:
    check_job_id(job_id)
    (h,) = yield [Cmd.of("HGETALL", keys.job(job_id))]
    h = ok(h)
    if not h:
        raise JobNotFound(f"job {job_id!r} not found in queue {keys.queue!r}")
    return decode_record(keys.queue, job_id, {bytes(k): v for k, v in _dict_b(h).items()},
                         cfg.serde)


def _dict_b(reply: Any) -> dict[bytes, Any]:
    if isinstance(reply, dict):
        return {k if isinstance(k, bytes) else str(k).encode(): v for k, v in reply.items()}
    it = iter(reply)
    return dict(zip(it, it, strict=True))


def requeue(keys: Keys, cfg: QueueConfig, job_id: str, who: str) -> Op[str]:
    """Hand a pending (stuck) job back to the queue now, as a new attempt."""
    check_job_id(job_id)
    (rec,) = yield [Cmd.of("HMGET", keys.job(job_id), "s", "e", "state", "entry", "p")]
    state, entry, state1, entry1, prio = ok(rec)
    if state is None:  # a layout-1 record, or none
        state, entry = state1, entry1
    if state is None:
        raise JobNotFound(f"job {job_id!r} not found in queue {keys.queue!r}")
    state = record_state(state)
    entry = entry_id(entry).encode()
    if state not in ("active", "queued") or not entry:
        return f"not requeued: job is {state}"
    keys = keys.at_level(level_of(prio))  # the stream of its priority level
    (res,) = yield [Call("requeue", [keys.stream, keys.dead, keys.stats, keys.events,
                                     keys.job(job_id), *keys.group_keys],
                         [GROUP, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen, who,
                          cfg.group_arg, _s(entry), job_id])]
    return _s(ok(res)[0])


# ------------------------------------------------------------------ dead letters


@attrs.frozen
class DeadEntry:
    dead_id: str
    job_id: str
    type: str
    reason: str
    error_type: str
    at_ms: int
    shard: int | None = None
    """The shard whose dead stream holds the entry (as listed; None: the shard that holds the
    job's record, or its current home): re-driven there (docs/scaling.md, "Calls by id
    during and after a reshard")."""


@attrs.frozen
class DeadFilter:
    type: str | None = None
    error_type: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None

    def match(self, e: DeadEntry, now_ms: int) -> bool:
        age_s = (now_ms - e.at_ms) / 1000
        return ((self.type is None or e.type == self.type)
                and (self.error_type is None or e.error_type == self.error_type)
                and (self.older_than_s is None or age_s >= self.older_than_s)
                and (self.newer_than_s is None or age_s <= self.newer_than_s))


def _dead_entry(raw: Any, shard: int | None = None) -> DeadEntry:
    eid = _s(raw[0])
    f = _dict(raw[1] or [])
    return DeadEntry(eid, _s(f.get("job", b"")), _s(f.get("type", b"")),
                     _s(f.get("reason", b"")), _s(f.get("etype", b"")), _entry_ms(eid), shard)


def dead_list(keys: Keys, flt: DeadFilter, *, limit: int = 100, cursor: str | None = None,
              oldest_first: bool = False, scan_pages: int = 10) -> Op[Page]:
    """Matching dead entries, newest first by default; scans at most scan_pages * PAGE."""
    limit = max(1, min(limit, PAGE))
    (t,) = yield [Cmd.of("TIME")]
    now = _server_ms(ok(t))
    items: list[DeadEntry] = []
    for _ in range(scan_pages):
        if oldest_first:
            cmd = Cmd.of("XRANGE", keys.dead, f"({cursor}" if cursor else "-", "+", "COUNT", PAGE)
        else:
            cmd = Cmd.of("XREVRANGE", keys.dead, f"({cursor}" if cursor else "+", "-",
                         "COUNT", PAGE)
        (raw,) = yield [cmd]
        page = ok(raw)
        for entry in page:
            cursor = _s(entry[0])
            e = _dead_entry(entry, keys.shard)
            if flt.match(e, now):
                items.append(e)
                if len(items) == limit:
                    return Page(items, cursor)
        if len(page) < PAGE:
            return Page(items, None)
    return Page(items, cursor)


def redrive(keys: Keys, cfg: QueueConfig, entries: Sequence[DeadEntry], who: str,
            *, per_entry: bool = False) -> Op[Any]:
    """Re-drive dead entries of one shard: the count of each outcome, or (``per_entry``)
    each entry's outcome in order."""
    outcome: dict[str, int] = {}
    each: list[str] = []
    for i in range(0, len(entries), PAGE):
        part = entries[i:i + PAGE]
        args: list[Arg] = [cfg.events_arg, who, cfg.group_arg]
        for e in part:
            args += [e.dead_id, e.job_id]
        (res,) = yield [Call("redrive", [keys.stream, keys.dead, keys.stats, keys.events,
                                         *(keys.job(e.job_id or "-") for e in part),
                                         *keys.group_keys, keys.levels, *keys.level_streams],
                         args)]
        for x in ok(res):
            outcome[_s(x)] = outcome.get(_s(x), 0) + 1
            each.append(_s(x))
    return each if per_entry else outcome


# ------------------------------------------------------------------ purge

PURGEABLE = ("queued", "scheduled", "retrying", "failed")


def purge(keys: Keys, cfg: QueueConfig, state: str, *, max_jobs: int = 100_000
          ) -> Op[int]:
    """Delete up to max_jobs jobs in ``state`` (queued, scheduled, retrying or failed)."""
    if state not in PURGEABLE:
        raise InvalidArgument(
            f"cannot purge by state {state!r}: purgeable states are {', '.join(PURGEABLE)};"
            " active jobs are held by workers, completed and cancelled records expire by TTL")
    purged = 0
    cursor = "-"
    skipped = 0  # delayed-set members of another state stay in place: page past them
    waiting = False  # queued: every priority level's stream, then the groups' wait list
    streams = [keys.stream]
    if state == "queued":
        (raw,) = yield [Cmd.of("SMEMBERS", keys.levels)]
        streams = [keys.stream_level(p) for p in levels_in_use(raw)]
    while purged < max_jobs:
        batch: list[tuple[str, str]] = []
        if state == "queued" and waiting:
            (raw,) = yield [Cmd.of("ZRANGE", keys.group_wait, cursor, "+", "BYLEX",
                                   "LIMIT", 0, PAGE)]
            page = ok(raw)
            for m in page:  # '<group> <16-digit seq><priority digit><job id>'
                batch.append((_s(m).partition(" ")[2][17:], ""))
            more = len(page) == PAGE
            cursor = f"({_s(page[-1])}" if page else cursor
        elif state == "queued":
            (raw,) = yield [Cmd.of("XRANGE", streams[0], cursor, "+", "COUNT", PAGE)]
            page = ok(raw)
            for e in page:
                batch.append((_s(_dict(e[1] or []).get("id", b"")), _s(e[0])))
            # a purged grouped job admits its group's next one behind the cursor: read on
            # until the stream has nothing past it, then the groups' wait list
            more = True
            cursor = f"({_s(page[-1][0])}" if page else cursor
            if not page and len(streams) > 1:  # this level is done: the next one
                streams.pop(0)
                cursor = "-"
            elif not page:
                waiting, cursor = True, "-"
        elif state == "failed":
            (raw,) = yield [Cmd.of("XRANGE", keys.dead, cursor, "+", "COUNT", PAGE)]
            page = ok(raw)
            for e in page:
                de = _dead_entry(e)
                batch.append((de.job_id, de.dead_id))
            more = len(page) == PAGE
            cursor = f"({_s(page[-1][0])}" if page else cursor
        else:
            (raw,) = yield [Cmd.of("ZRANGE", keys.delayed, skipped, skipped + PAGE - 1)]
            page = ok(raw)
            batch = [(_s(j), "") for j in page]
            more = len(page) == PAGE
        batch = [(j, d) for j, d in batch if j or d][: max_jobs - purged]
        if batch:
            args: list[Arg] = [GROUP, cfg.events_arg, state, cfg.group_arg]
            for j, d in batch:
                args += [j or "-", d]
            (res,) = yield [Call("purge", [keys.stream, keys.delayed, keys.dead, keys.stats,
                                           keys.events, *(keys.job(j or "-") for j, _ in batch),
                                           *keys.group_keys, keys.levels,
                                           *keys.level_streams], args)]
            done = sum(1 for x in ok(res) if x == b"purged")
            purged += done
            skipped += len(batch) - done
        if not more or (not batch and state != "queued"):
            break
    return purged


# ------------------------------------------------------------------ consumers


@attrs.frozen
class ConsumerInfo:
    name: str
    pending: int
    idle_s: float
    heartbeat_age_s: float | None
    alive: bool


def consumers(keys: Keys, alive_within_ms: int = 30_000) -> Op[list[ConsumerInfo]]:
    r = yield [Cmd.of("TIME"), Cmd.of("XINFO", "CONSUMERS", keys.stream, GROUP)]
    now = _server_ms(ok(r[0]))
    if isinstance(r[1], Exception):
        if "NOGROUP" in str(r[1]) or "no such key" in str(r[1]).lower():
            return []
        raise r[1]
    rows = [_dict(c) for c in r[1]][:PAGE]
    beats = yield [Cmd.of("ZSCORE", keys.workers, _s(c["name"])) for c in rows]
    out = []
    for c, beat in zip(rows, beats, strict=True):
        b = ok(beat)
        age = (now - float(b)) / 1000 if b is not None else None
        out.append(ConsumerInfo(_s(c["name"]), int(c["pending"]), int(c["idle"]) / 1000, age,
                                age is not None and age * 1000 < alive_within_ms))
    return out


def prune(keys: Keys, dead_after_s: float) -> Op[list[str]]:
    """Delete consumers whose heartbeat is older than dead_after_s and whose PEL is empty,
    and forget workers whose heartbeat is that old and that never became a consumer."""
    found = yield from consumers(keys)
    stale = [c.name for c in found if c.pending == 0 and
             (c.heartbeat_age_s is None or c.heartbeat_age_s >= dead_after_s)
             and c.idle_s >= dead_after_s]
    (res,) = yield [Call("prune", [keys.stream, keys.workers],
                         [GROUP, int(dead_after_s * 1000), *stale])]
    return [_s(x) for x in ok(res)]


def set_paused(keys: Keys, paused: bool) -> Op[bool]:
    (r,) = yield [Cmd.of("SET", keys.paused, 1) if paused else Cmd.of("DEL", keys.paused)]
    ok(r)
    return paused


def server_version() -> Op[tuple[int, ...]]:
    (info,) = yield [Cmd.of("INFO", "server")]
    text = _s(ok(info)) if not isinstance(info, dict) else ""
    version = (info.get("redis_version") if isinstance(info, dict) else
               next((ln.split(":", 1)[1] for ln in text.splitlines()
                     if ln.startswith("redis_version:")), "0"))
    return tuple(int(x) for x in str(version).strip().split(".")[:3] if x.isdigit())


# ------------------------------------------------------------------ queue names and job types


def exists(keys: Keys) -> Op[bool]:
    """Whether any key of the queue that jobs or workers leave behind exists."""
    (n,) = yield [Cmd.of("EXISTS", keys.stream, keys.delayed, keys.dead, keys.stats)]
    return bool(ok(n))


def forget(keys: Keys, force: bool) -> Op[bool]:
    """Drop the queue from the set of known queues (``streamq stats`` lists them). Refused
    while the queue holds jobs or has live workers, unless ``force``; its keys stay."""
    if not force:
        (present,) = yield [Cmd.of("EXISTS", keys.stream, keys.delayed, keys.dead, keys.stats)]
        if ok(present):
            s = yield from stats(keys)
            jobs = s.ready + s.pending + s.scheduled + s.retrying + s.dead
            if jobs or s.workers_alive:
                raise InvalidArgument(
                    f"queue {keys.queue!r} still has {jobs} jobs ({s.ready} ready,"
                    f" {s.pending} running, {s.scheduled} scheduled, {s.retrying} retrying,"
                    f" {s.dead} dead) and {s.workers_alive} live workers; purge them first,"
                    " or forget it anyway with --force (its keys stay)")
    (n,) = yield [Cmd.of("SREM", queues_key(keys.prefix), keys.queue)]
    return bool(ok(n))


def unknown_queue(keys: Keys, known: Sequence[str]) -> UnknownQueue:
    """The error for a queue none of whose keys exist, with the closest known names."""
    import difflib

    close = difflib.get_close_matches(keys.queue, list(known), n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    elif known:
        shown = sorted(known)[:10]
        hint = "known queues: " + ", ".join(shown) + (", ..." if len(known) > 10 else "")
    else:
        hint = "no queue is known yet (workers and producers add theirs to " \
               f"{queues_key(keys.prefix)})"
    return UnknownQueue(
        f"queue {keys.queue!r} does not exist (no keys under {keys.base}); {hint}")
