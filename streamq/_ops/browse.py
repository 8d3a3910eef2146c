"""More admin operations (sans-IO, as in ``operations.py``): listings by state, a job's timeline,
workers, cron entries, run-now, cancel and the audit event every operator action writes.

Each operation costs O(its page size): listings read at most ``scan`` entries of one index
(the ready stream, the delayed set, the dead stream or the events stream) per call and hand
back a cursor; nothing reads the keyspace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from .._core.cancel import cancel_call, parse_cancel
from .._core.config import QueueConfig
from .._core.driver import Cmd, Op, Step, _dict, _s, _server_ms, ok
from .._core.errors import InvalidArgument, JobNotFound
from .._core.flow_cancel import cascade
from .._core.keys import GROUP, Keys, check_job_id
from .._core.model import BRIEF_FIELDS, CancelResult, brief, entry_id, record_state
from .._core.timeseries import Point, decode
from .operations import (
    PAGE,
    DeadEntry,
    DeadFilter,
    Page,
    _dead_entry,
    _entry_ms,
    level_of,
    over_levels,
    split_cursor,
)

_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}")
_DELAYED_CURSOR = re.compile(r"(-?\d{1,20}):(\d{1,9})")

ListState = Literal["queued", "scheduled", "retrying", "completed", "cancelled"]
DELAYED_STATES = ("scheduled", "retrying")
RECENT_EVENTS = ("completed", "cancelled", "failed", "retrying")


def _t(v: Any) -> str:
    """Text written by anyone (job data, events): bytes that are not UTF-8 are replaced."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def check_stream_id(cursor: str | None) -> str | None:
    """A stream entry id given by a user (a cursor): ``<ms>-<seq>``; InvalidArgument else."""
    if cursor is not None and not _STREAM_ID.fullmatch(cursor):
        raise InvalidArgument(f"invalid cursor {cursor!r}: expected a stream id like 1700-0")
    return cursor


@attrs.frozen
class JobRow:
    """One line of a listing: enough to show the job and link to it."""

    job_id: str
    type: str
    state: str
    """The record's state now ('' when the record has expired or never existed)."""
    attempts: int
    at_ms: int
    """The time the listing is ordered by: enqueued (ready), due (delayed), event time."""
    ref: str = ""
    """The index entry: stream entry id, or the event id."""
    detail: str = ""


@attrs.frozen
class ListFilter:
    """Bounded filters: each page reads at most ``scan`` index entries, whatever matches."""

    type: str | None = None
    since_ms: int | None = None
    """Only entries at or after this time (epoch ms): a range bound, costs nothing."""
    until_ms: int | None = None


def _rows_step(keys: Keys, ids: list[str]) -> Step:
    return [Cmd.of("HMGET", keys.job(j), *BRIEF_FIELDS) if j else
            Cmd.of("ECHO", "") for j in ids]


def _fields(rep: Any) -> tuple[str, str, int]:
    return brief(ok(rep))


def ready(keys: Keys, flt: ListFilter | None = None, *, limit: int = 50,
          cursor: str | None = None, scan: int = PAGE) -> Op[Page]:
    """Entries of the ready streams not yet delivered to a worker: every priority level,
    highest first, each oldest first."""
    limit = max(1, min(limit, PAGE))
    check_stream_id(split_cursor(cursor)[1])

    def one(k: Keys, c: str | None, n: int) -> Op[Page]:
        return _ready(k, flt, limit=n, cursor=c, scan=scan)

    return (yield from over_levels(keys, cursor, limit, one))


def _ready(keys: Keys, flt: ListFilter | None = None, *, limit: int = 50,
           cursor: str | None = None, scan: int = PAGE) -> Op[Page]:
    flt = flt or ListFilter()
    limit = max(1, min(limit, PAGE))
    start = cursor
    if start is None:
        (groups,) = yield [Cmd.of("XINFO", "GROUPS", keys.stream)]
        last = "0-0"
        if not isinstance(groups, Exception):
            for g in groups:
                gd = _dict(g)
                if _s(gd.get("name", "")) == GROUP:
                    last = _s(gd["last-delivered-id"])
        start = last
    if flt.since_ms is not None and _entry_ms(start) < flt.since_ms:
        start = f"{flt.since_ms - 1}-{2**63 - 1}"
    end = f"{flt.until_ms}" if flt.until_ms is not None else "+"
    items: list[JobRow] = []
    read = 0
    pos = start
    chunk = limit if flt.type is None else 4 * limit
    while read < scan:
        n = min(chunk, PAGE, scan - read)
        chunk *= 2
        (raw,) = yield [Cmd.of("XRANGE", keys.stream, f"({pos}", end, "COUNT", n)]
        page = ok(raw)
        read += len(page)
        ids = [(_s(e[0]), _t(_dict(e[1] or []).get("id", b""))) for e in page]
        recs = yield _rows_step(keys, [j for _, j in ids])
        for (eid, jid), rec in zip(ids, recs, strict=True):
            pos = eid
            t, st, att = _fields(rec) if jid else ("", "", 0)
            if flt.type is not None and t != flt.type:
                continue
            items.append(JobRow(jid, t, st, att, _entry_ms(eid), eid))
            if len(items) == limit:
                return Page(items, eid)
        if len(page) < n:
            return Page(items, None)
    return Page(items, pos)


def delayed(keys: Keys, state: str | None = None, flt: ListFilter | None = None, *,
            limit: int = 50, cursor: str | None = None, scan: int = 2 * PAGE) -> Op[Page]:
    """Members of the delayed set (scheduled and retrying jobs) by due time, soonest first;
    ``state`` keeps one of the two. The cursor is ``<score>:<members of that score seen>``.
    ``state="waiting"``: the waiting index instead (jobs waiting for their dependencies, by
    when they started waiting, oldest first: docs/workflows.md)."""
    if state is not None and state not in (*DELAYED_STATES, "waiting"):
        raise InvalidArgument(f"delayed jobs are scheduled or retrying, not {state!r}")
    index = keys.waiting if state == "waiting" else keys.delayed
    flt = flt or ListFilter()
    limit = max(1, min(limit, PAGE))
    score, skip = (str(flt.since_ms) if flt.since_ms is not None else "-inf"), 0
    if cursor is not None:
        m = _DELAYED_CURSOR.fullmatch(cursor)
        if not m:
            raise InvalidArgument(f"invalid cursor {cursor!r}: expected <score>:<count>")
        score, skip = m.group(1), int(m.group(2))
    end = str(flt.until_ms) if flt.until_ms is not None else "+inf"
    items: list[JobRow] = []
    read = 0
    chunk = 2 * limit if state is None and flt.type is None else 4 * limit
    while read < scan:
        n = min(chunk, PAGE, scan - read)
        chunk *= 2
        (raw,) = yield [Cmd.of("ZRANGE", index, score, end, "BYSCORE", "LIMIT", skip, n,
                               "WITHSCORES")]
        flat = ok(raw)
        pairs = [(_t(flat[i]), int(float(flat[i + 1]))) for i in range(0, len(flat), 2)]
        read += len(pairs)
        recs = yield _rows_step(keys, [j for j, _ in pairs])
        for (jid, due), rec in zip(pairs, recs, strict=True):
            skip = skip + 1 if str(due) == score else 1
            score = str(due)
            t, st, att = _fields(rec)
            if (state is not None and st != state) or (flt.type is not None and t != flt.type):
                continue
            items.append(JobRow(jid, t, st, att, due))
            if len(items) == limit:
                return Page(items, f"{score}:{skip}")
        if len(pairs) < n:
            return Page(items, None)
    return Page(items, f"{score}:{skip}")


def recent(keys: Keys, ev: str, flt: ListFilter | None = None, *, limit: int = 50,
           cursor: str | None = None, scan: int = 10 * PAGE) -> Op[Page]:
    """Jobs that recently had lifecycle event ``ev`` (completed, cancelled, ...), newest first,
    from the capped events stream: the only index of finished jobs."""
    if ev not in RECENT_EVENTS:
        raise InvalidArgument(f"no listing of {ev!r} events; try one of {RECENT_EVENTS}")
    flt = flt or ListFilter()
    limit = max(1, min(limit, PAGE))
    check_stream_id(cursor)
    pos = f"({cursor}" if cursor else (f"{flt.until_ms}" if flt.until_ms is not None else "+")
    low = f"{flt.since_ms}" if flt.since_ms is not None else "-"
    found: list[tuple[str, str, str]] = []
    read = 0
    last = cursor
    done = False
    while read < scan and not done:
        n = min(PAGE, scan - read)
        (raw,) = yield [Cmd.of("XREVRANGE", keys.events, pos, low, "COUNT", n)]
        page = ok(raw)
        read += len(page)
        for e in page:
            last = _s(e[0])
            f = _dict(e[1] or [])
            if _t(f.get("ev", b"")) == ev:
                found.append((last, _t(f.get("job", b"")), _t(f.get("d", b""))))
                if len(found) == limit:
                    done = True
                    break
        if len(page) < n and not done:
            last = None
            break
        pos = f"({last}"
    recs = yield _rows_step(keys, [j for _, j, _ in found])
    items = []
    for (eid, jid, d), rec in zip(found, recs, strict=True):
        t, st, att = _fields(rec) if jid else ("", "", 0)
        if flt.type is not None and t != flt.type:
            continue
        items.append(JobRow(jid, t, st, att, _entry_ms(eid), eid, d))
    return Page(items, last)


def recent_completed(keys: Keys, flt: ListFilter | None = None, *, limit: int = 50
                     ) -> Op[list[JobRow]]:
    """Recently completed jobs from the shard's capped list (``Keys.recent``, written by
    finish.lua whatever the event kinds: up to 10 per call, ``RECENT_KEEP`` kept), newest
    first: one LRANGE and one HMGET per entry."""
    flt = flt or ListFilter()
    limit = max(1, min(limit, PAGE))
    (raw,) = yield [Cmd.of("LRANGE", keys.recent, 0, PAGE - 1)]
    found: list[tuple[int, str]] = []
    for v in [] if isinstance(raw, Exception) else raw:  # (a damaged key: nothing listed)
        at, _, jid = _t(v).partition(" ")
        if not at.isdigit() or not jid:
            continue
        if (flt.since_ms is not None and int(at) < flt.since_ms) or (
                flt.until_ms is not None and int(at) > flt.until_ms):
            continue
        found.append((int(at), jid))
    recs = yield _rows_step(keys, [j for _, j in found])
    items = []
    for (at_ms, jid), rec in zip(found, recs, strict=True):
        t, st, att = _fields(rec)
        if flt.type is not None and t != flt.type:
            continue
        items.append(JobRow(jid, t, st, att, at_ms))
        if len(items) == limit:
            break
    return items


# ------------------------------------------------------------------ a job's timeline


@attrs.frozen
class Event:
    at_ms: int
    ev: str
    detail: str
    event_id: str


@attrs.frozen
class Timeline:
    events: list[Event]
    """Oldest first."""
    scanned: int
    complete: bool
    """False when the scan stopped at its cap or older events were trimmed from the stream."""


def timeline(keys: Keys, job_id: str, since_ms: int, at_ms: Sequence[int] = (), *,
             scan: int = PAGE) -> Op[Timeline]:
    """The job's events from the events stream, which has no per-job index, in one round trip:
    the entries of the milliseconds in ``at_ms`` (the times its record holds: created,
    enqueued, started, finished, each failed attempt; a script writes its event at the same
    server time) and the newest ``scan`` entries back to ``since_ms`` (its creation). Complete
    when that scan reached ``since_ms`` and nothing older was trimmed."""
    check_job_id(job_id)
    since_ms = max(0, since_ms)
    moments = sorted({int(t) for t in at_ms if t and int(t) >= since_ms})[:50]
    step: Step = [Cmd.of("XRANGE", keys.events, "-", "+", "COUNT", 1),
                  Cmd.of("XREVRANGE", keys.events, "+", since_ms, "COUNT", scan)]
    step += [Cmd.of("XRANGE", keys.events, t, t + 1, "COUNT", 200) for t in moments]
    replies = yield step
    first_e = ok(replies[0])
    newest = ok(replies[1])
    trimmed = bool(first_e) and _entry_ms(_s(first_e[0][0])) > since_ms
    seen: dict[str, Event] = {}
    for rep in replies[1:]:
        for e in ok(rep):
            f = _dict(e[1] or [])
            if _t(f.get("job", b"")) == job_id:
                eid = _s(e[0])
                seen[eid] = Event(_entry_ms(eid), _t(f.get("ev", b"")), _t(f.get("d", b"")),
                                  eid)
    ordered = sorted(seen.values(), key=lambda ev: tuple(map(int, ev.event_id.split("-"))))
    # whole when the scan reached back to the job's creation: nothing older was trimmed, or
    # its own first event (enqueued) is there
    complete = len(newest) < scan and (not trimmed or any(e.ev == "enqueued" for e in ordered))
    return Timeline(ordered, len(newest), complete)


@attrs.frozen
class Lease:
    """A job's place in the ready stream: its entry and, once delivered, the lease on it."""

    entry: str
    token: str
    consumer: str
    """The consumer holding the entry ('' when not delivered yet)."""
    idle_s: float | None
    """Since the entry was last delivered, claimed or renewed; None when not delivered."""
    deliveries: int


def lease(keys: Keys, job_id: str) -> Op[Lease | None]:
    """The job's stream entry and lease (None when the job is not in the stream)."""
    check_job_id(job_id)
    (rec,) = yield [Cmd.of("HMGET", keys.job(job_id), "s", "e", "k", "state", "entry", "token",
                           "p")]
    state, entry, token, state1, entry1, token1, prio = ok(rec)
    keys = keys.at_level(level_of(prio))  # the stream of its priority level
    if state is None:  # a layout-1 record, or none
        state, entry, token = state1, entry1, token1
    eid = entry_id(entry)  # kept once the job left the stream: the state says if it is live
    if record_state(state) not in ("queued", "active") or not _STREAM_ID.fullmatch(eid):
        return None
    (p,) = yield [Cmd.of("XPENDING", keys.stream, GROUP, eid, eid, 1)]
    rows = [] if isinstance(p, Exception) else p
    if not rows:
        return Lease(eid, _t(token or b""), "", None, 0)
    _, consumer, idle, deliveries = rows[0]
    return Lease(eid, _t(token or b""), _t(consumer), int(idle) / 1000, int(deliveries))


def find_dead(keys: Keys, job_id: str, around_ms: int, window_ms: int = 5000
              ) -> Op[DeadEntry | None]:
    """The dead entry of a job dead-lettered at about ``around_ms`` (its record's finish
    time): the dead stream is indexed by time, not by job, so this reads at most one page
    of entries within ``window_ms`` of it."""
    check_job_id(job_id)
    lo, hi = max(0, around_ms - window_ms), around_ms + window_ms
    (raw,) = yield [Cmd.of("XRANGE", keys.dead, lo, hi, "COUNT", PAGE)]
    for e in ok(raw):
        de = _dead_entry(e, keys.shard)
        if de.job_id == job_id:
            return de
    return None


def count_dead(keys: Keys, flt: DeadFilter, max_scan: int = 100 * PAGE) -> Op[tuple[int, bool]]:
    """Dead entries matching ``flt``, reading at most ``max_scan`` entries (oldest first);
    the flag says whether every entry was read (the count is exact)."""
    (t,) = yield [Cmd.of("TIME")]
    now = _server_ms(ok(t))
    n = read = 0
    pos = "-"
    while read < max_scan:
        (raw,) = yield [Cmd.of("XRANGE", keys.dead, pos, "+", "COUNT", PAGE)]
        page = ok(raw)
        read += len(page)
        n += sum(1 for e in page if flt.match(_dead_entry(e), now))
        if len(page) < PAGE:
            return n, True
        pos = f"({_s(page[-1][0])}"
    return n, False


def series(keys: Keys, hours: bool = False) -> Op[list[Point]]:
    """The queue's time series (written by workers, see ``_timeseries``), oldest first: the
    minute buckets of the last 6 hours, or the hour buckets of the last 30 days."""
    key, width = (keys.series_hours, 3_600_000) if hours else (keys.series_minutes, 60_000)
    (raw,) = yield [Cmd.of("HGETALL", key)]
    points = [decode(_s(f), v, width) for f, v in _dict(ok(raw)).items()]
    return sorted((p for p in points if p is not None), key=lambda p: p.t_ms)


def last_minute(keys: Keys) -> Op[tuple[int, int] | None]:
    """Completed and failed in the last full minute from the time series (None when no
    worker wrote that minute)."""
    (t,) = yield [Cmd.of("TIME")]
    minute = _server_ms(ok(t)) // 60_000 - 1
    (raw,) = yield [Cmd.of("HGET", keys.series_minutes, minute)]
    point = decode(minute, ok(raw), 60_000) if ok(raw) else None
    return (point.completed, point.failed) if point else None


def per_minute(keys: Keys) -> Op[tuple[float, float] | None]:
    """Completed and failed per minute over the last 60 seconds, from the time series: the
    current minute's bucket plus the previous one's share of the window (the part of it
    within the last 60 s, assuming its jobs were spread evenly). Workers add to the buckets
    every 10 s or so, so the rate follows with that delay, and falls to 0 a minute after the
    last job. None when no worker writes the series (nothing in its last 6 hours)."""
    (t,) = yield [Cmd.of("TIME")]
    now = _server_ms(ok(t))
    minute = now // 60_000
    raw, size = yield [Cmd.of("HMGET", keys.series_minutes, minute, minute - 1),
                       Cmd.of("HLEN", keys.series_minutes)]
    if not ok(size):
        return None
    cur_raw, prev_raw = ok(raw)
    cur = decode(minute, cur_raw, 60_000) if cur_raw else None
    prev = decode(minute - 1, prev_raw, 60_000) if prev_raw else None
    share = 1 - (now % 60_000) / 60_000
    return ((cur.completed if cur else 0) + (prev.completed * share if prev else 0),
            (cur.failed if cur else 0) + (prev.failed * share if prev else 0))


# ------------------------------------------------------------------ workers and cron


@attrs.frozen
class WorkerInfo:
    name: str
    pending: int
    idle_s: float
    heartbeat_age_s: float | None
    alive: bool
    concurrency: int | None
    host: str
    pid: int | None


def workers(keys: Keys, alive_within_ms: int = 30_000) -> Op[list[WorkerInfo]]:
    """The consumers of the queue's group (at most 1,000) with their worker's heartbeat info.
    Alive: a heartbeat within ``alive_within_ms`` and its info still there (it expires after
    three missed heartbeats)."""
    from .operations import consumers

    found = yield from consumers(keys, alive_within_ms)
    infos = yield [Cmd.of("HGET", keys.worker_info(c.name), "info") for c in found]
    out = []
    for c, raw in zip(found, infos, strict=True):
        info: dict[str, Any] = {}
        if not isinstance(raw, Exception) and raw:
            try:
                loaded = json.loads(raw)
                info = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                info = {}
        conc, pid = info.get("concurrency"), info.get("pid")
        # heartbeat.lua writes the info with each beat and lets it expire after 3 missed ones:
        # gone, the worker stopped beating (a heartbeat up to 30 s old is not enough)
        alive = c.alive and not isinstance(raw, Exception) and raw is not None
        out.append(WorkerInfo(c.name, c.pending, c.idle_s, c.heartbeat_age_s, alive,
                              conc if isinstance(conc, int) else None,
                              str(info.get("host", "")), pid if isinstance(pid, int) else None))
    return out


@attrs.frozen
class CronInfo:
    name: str
    schedule: str
    """The cron expression (with its time zone) or 'every N s'."""
    job_type: str
    last_tick_ms: int | None
    next_tick_ms: int | None
    last_job: str


def cron_entries(keys: Keys) -> Op[list[CronInfo]]:
    """Cron entries enqueueing on this queue, as the scheduler daemon publishes them."""
    (raw,) = yield [Cmd.of("HGETALL", keys.cron)]
    fields = {k: v for k, v in _dict(ok(raw)).items()}
    out = []
    for name, v in sorted(fields.items()):
        if name.endswith(":last"):
            continue
        try:
            d = json.loads(v)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        sched = (f"{d.get('expr')} ({d.get('tz') or 'UTC'})" if d.get("expr")
                 else f"every {d.get('every')} s")
        last = d.get("last_tick_ms")
        nxt = d.get("next_tick_ms")
        out.append(CronInfo(name, sched, str(d.get("job_type", "")),
                            int(last) if isinstance(last, int | float) else None,
                            int(nxt) if isinstance(nxt, int | float) else None,
                            str(d.get("last_job", "") or "")))
    return out[:PAGE]


# ------------------------------------------------------------------ actions


def audit_cmd(keys: Keys, cfg: QueueConfig, who: str, action: str, job_id: str = "",
              outcome: str = "") -> Step:
    """The events-stream entry recording an operator action: ``ev`` = ``admin``, ``d`` =
    ``<action> by <who>: <outcome>`` (the time is the entry id). Nothing when events are off."""
    if cfg.events_maxlen <= 0 or "admin" not in cfg.event_kinds:
        return []
    detail = f"{action} by {who}" + (f": {outcome}" if outcome else "")
    return [Cmd.of("XADD", keys.events, "MAXLEN", "~", cfg.events_maxlen, "*", "job", job_id,
                   "ev", "admin", "d", detail[:500])]


def audit(keys: Keys, cfg: QueueConfig, who: str, action: str, job_id: str = "",
          outcome: str = "") -> Op[None]:
    cmds = audit_cmd(keys, cfg, who, action, job_id, outcome)
    if cmds:
        (r,) = yield cmds
        ok(r)


def run_now(keys: Keys, cfg: QueueConfig, job_id: str, who: str) -> Op[str]:
    """Make a scheduled or retrying job due now: its delayed-set score becomes 0 (``ZADD XX``,
    so a job promoted or cancelled meanwhile is left alone) and promoters are woken; the
    promotion itself is promote.lua's, as for any due job."""
    check_job_id(job_id)
    r = yield [Cmd.of("HMGET", keys.job(job_id), "s", "state"),
               Cmd.of("ZSCORE", keys.delayed, job_id)]
    state2, state1 = ok(r[0])
    state, score = state2 if state2 is not None else state1, ok(r[1])
    if state is None:
        raise JobNotFound(f"job {job_id!r} not found in queue {keys.queue!r}")
    if score is None or record_state(state) not in DELAYED_STATES:
        outcome = f"not run: job is {record_state(state)}"
    else:
        r2 = yield [Cmd.of("ZADD", keys.delayed, "XX", 0, job_id),
                    Cmd.of("PUBLISH", keys.wake_channel, 0)]
        ok(r2[0])
        outcome = "due now"
    yield from audit(keys, cfg, who, "run-now", job_id, outcome)
    return outcome


def cancel(keys: Keys, cfg: QueueConfig, job_id: str, who: str) -> Op[CancelResult]:
    """Cancel a job (cancel.lua; a running one's worker is told to stop it), recording who
    did."""
    from .._core.driver import Call

    ks, args = cancel_call(keys, cfg, job_id)
    (r,) = yield [Call("cancel", ks, args)]
    res = parse_cancel(job_id, ok(r), retried=False)
    if res.cancelled:  # its unstarted dependencies no other job waits for (flow_cancel)
        yield from cascade(keys, cfg, job_id)  # (keys: the job's own shard, located)
    yield from audit(keys, cfg, who, "cancel", job_id,
                     "cancelled" if res.cancelled else "cancel requested (running)"
                     if res.code == "cancel_requested" else f"not cancelled: {res.reason}")
    return res


def now_ms() -> Op[int]:
    (t,) = yield [Cmd.of("TIME")]
    return _server_ms(ok(t))
