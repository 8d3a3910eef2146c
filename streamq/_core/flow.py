"""Workflows (docs/workflows.md): jobs that wait for others, as sans-IO operations.

One primitive: a job in state ``waiting`` keeps its pending dependencies as a SET (wait.lua);
each edge is registered in the dependency's own slot (link_many.lua, a few hundred per call);
the dependency's terminal transition resolves it (inline in one slot, through an outbox in
another: _flow.lua); a relay applies outbox messages (resolve_many.lua) and a capped repair
sweep re-links what a lost message or a producer that died half-way left behind. The sugar
(``JobSpec``, ``chain``, ``group``, ``chord``) compiles to that primitive
(streamq/_producer/flows.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from .driver import Call, Cmd, Op, ok
from .errors import InvalidArgument
from .keys import Keys, check_job_id, check_queue_name, shard_of
from .locate import locate_refs, read_layouts

Policy = Literal["fail", "continue", "ignore", "remove", "death"]
POLICIES: dict[str, str] = {"fail": "f", "continue": "c", "ignore": "i", "remove": "r",
                            "death": "d"}
"""Per-edge failure policies and their letters in the SET members (docs/workflows.md)."""
_POLICY_OF: dict[str, Policy] = {"f": "fail", "c": "continue", "i": "ignore", "r": "remove",
                                 "d": "death"}
OUTCOMES: dict[str, str] = {"c": "completed", "f": "failed", "x": "cancelled", "p": "purged",
                            "m": "missing"}
"""A dependency results value's first letter -> the dependency's outcome."""
DEPS_HEADER = "streamq-deps"
"""Header of a job that waits for others: its worker reads its dependency results before the
handler runs (``Job.dependency_results``)."""
RELAY_BATCH = 200
"""Outbox messages one relay step applies per shard (loops are capped)."""
REPAIR_PARENTS = 20
REPAIR_MEMBERS = 200
"""A repair step looks at the oldest waiting jobs of a shard, this many, and at most this many
pending dependencies of each (SSCAN: a cursor per job, kept by the caller between steps)."""
SHARDS_FIELD = "shards"


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@attrs.frozen
class JobRef:
    """A dependency: a job of another queue (or of this one), and what its failure does to
    the job that waits for it (``policy``: ``fail``, the default, dead-letters the waiting
    job naming this one; ``continue`` runs it, and it sees the failure in its dependency
    results; ``ignore`` runs it as if this one had completed; ``remove`` drops this edge as
    if it never existed, with no trace in the results; ``death``: the first of its ``death``
    edges whose job is dead-lettered releases it at once, and it is cancelled when they all
    ended without one, a batch's ``on_death``: docs/workflows.md)."""

    queue: str = attrs.field(validator=lambda _i, _a, v: check_queue_name(v))
    job_id: str = attrs.field(validator=lambda _i, _a, v: check_job_id(v))
    policy: Policy = attrs.field(default="fail")

    @policy.validator
    def _check(self, _a: Any, v: str) -> None:
        if v not in POLICIES:
            raise InvalidArgument(f"dependency policy must be one of {sorted(POLICIES)},"
                                  f" got {v!r}")


@attrs.frozen
class DependencyResult:
    """How one dependency ended, as its waiting job sees it."""

    index: int
    """Its place in ``depends_on`` (a chord's group: the member's place)."""
    queue: str
    job_id: str
    state: str
    """completed | failed | cancelled | purged | missing (expired or never enqueued)."""
    result: Any = None
    """The result (completed), as its handler returned it."""
    reason: str = ""
    """Why it failed (failed), else ''."""


@attrs.frozen
class BatchSummary:
    """What a batch's callback sees of its batch (``Job.batch_summary()``, from its dependency
    results: index 0 is the batch itself, the others its jobs)."""

    batch_id: str
    total: int
    """Jobs that ended and were recorded (every job of the batch, for on_success and
    on_complete)."""
    completed: int
    failed: list[str]
    """Ids of the jobs that were dead-lettered."""
    other: list[str]
    """Ids of the jobs that were cancelled, purged or missing."""
    results: list[DependencyResult]
    """Every job's result, in the order they were added."""

    @classmethod
    def of(cls, deps: Sequence[DependencyResult]) -> BatchSummary:
        jobs = [d for d in deps if d.index > 0]
        return cls(next((d.job_id for d in deps if d.index == 0), ""), len(jobs),
                   sum(1 for d in jobs if d.state == "completed"),
                   [d.job_id for d in jobs if d.state == "failed"],
                   [d.job_id for d in jobs if d.state not in ("completed", "failed")], jobs)


def refs(queue: str, depends_on: Iterable[Any]) -> list[JobRef]:
    """``depends_on`` items as JobRefs: a job id of ``queue``, a ``(queue, job_id)`` pair, a
    JobRef, or anything with ``job_id`` (an EnqueueResult: of ``queue``). Raises
    InvalidArgument (also for an empty list or a job named twice)."""
    if isinstance(depends_on, (str, bytes)):
        raise InvalidArgument("depends_on must be a list of job ids or references, not a string")
    out: list[JobRef] = []
    for d in depends_on:
        if isinstance(d, JobRef):
            out.append(d)
        elif isinstance(d, str):
            out.append(JobRef(queue, d))
        elif isinstance(d, tuple) and len(d) == 2:
            out.append(JobRef(d[0], d[1]))
        elif isinstance(getattr(d, "job_id", None), str):
            out.append(JobRef(queue, d.job_id))
        else:
            raise InvalidArgument(f"depends_on: {d!r} is not a job id, a (queue, job_id) pair"
                                  " or a JobRef")
    if not out:
        raise InvalidArgument("depends_on is empty: enqueue the job without it")
    seen = {(r.queue, r.job_id) for r in out}
    if len(seen) != len(out):
        raise InvalidArgument("depends_on names a job twice")
    return out


def shard_counts(prefix: str, queues: Iterable[str], known: Mapping[str, int]
                 ) -> Op[dict[str, int]]:
    """The shard count of each queue (stored on its shard 0; none stored: 1)."""
    out = dict(known)
    ask = sorted({q for q in queues if q not in out})
    if ask:
        r = yield [Cmd.of("HGET", Keys(q, prefix).meta, SHARDS_FIELD) for q in ask]
        for q, v in zip(ask, r, strict=True):
            v = ok(v)
            out[q] = int(v) if v is not None else 1
    return out


def wk_of(jk: Keys, job_id: str, level: int, events_arg: str, dead_ttl_s: int,
          dead_maxlen: int, handoff: bool = True) -> str:
    """A waiting record's 'wk' (_flow.lua's header): the keys and settings of its release;
    with ``handoff`` also the tickets ZSET of its stream and its queue's pause flag, so that
    its release hands it to a worker waiting for work (docs/workflows.md#hand-off)."""
    words = [jk.stream_level(level), jk.delayed, jk.deps(job_id), jk.dep_results(job_id),
             jk.waiting, jk.events, jk.stats, jk.dead, jk.levels, events_arg,
             str(dead_ttl_s), str(dead_maxlen), jk.wake_channel]
    if handoff:
        words += [jk.at_level(level).tickets, jk.paused]
    return " ".join(words)


def member(ref: JobRef, index: int) -> str:
    """The deps SET member of an edge."""
    return f"{POLICIES[ref.policy]}{index} {ref.queue} {ref.job_id}"


@functools.lru_cache(maxsize=256)
def _queue_keys(queue: str, prefix: str) -> Keys:
    """A queue's shard-0 keys (Keys is immutable: one per queue serves every edge of a large
    fan-in, instead of one made and checked per edge)."""
    return Keys(queue, prefix)


def link_call(prefix: str, shards: Mapping[str, int], parent_key: str, parent_id: str,
              ref: JobRef, index: int) -> Call:
    """link.lua's call for an edge to ``ref`` in its home under ``shards[ref.queue]`` (a
    dependency that may have been written before a reshard: ``link_at`` its located shard)."""
    return link_at(prefix, shard_of(ref.job_id, shards[ref.queue]), parent_key, parent_id, ref,
                   index)


def link_at(prefix: str, shard: int, parent_key: str, parent_id: str, ref: JobRef, index: int
            ) -> Call:
    """link.lua's call for an edge to ``ref``, whose record is in ``shard`` of its queue
    (``locate.locate_refs``)."""
    ck = _queue_keys(ref.queue, prefix)
    ck = ck if shard == 0 else ck.of_shard(shard)
    pk = f"{ck.parents(ref.job_id)} {ck.outbox} {ref.queue}"
    m = f"{POLICIES[ref.policy]}{index} {parent_key} {parent_id}"
    return Call("link", [ck.job(ref.job_id), ck.parents(ref.job_id), ck.outbox],
                [ref.job_id, pk, m])


Message = tuple[str, str, str, str, str, bytes]
"""An outbox message: (outbox key, entry id, parent record key, parent id, deps member, value)."""


LINK_BATCH = 500
"""Edges one link_many.lua call links (children of one slot), and ended dependencies one
resolve_many.lua call applies (one waiting job): a call stays short."""


def apply(messages: Sequence[Message]) -> Op[list[int]]:
    """Resolve each message in its parent's slot (resolve_many.lua: the messages of one
    parent, up to LINK_BATCH per call), then delete the applied ones from their outboxes. A
    message whose resolve failed stays (the relay tries it again)."""
    if not messages:
        return []
    by_parent: dict[tuple[str, str], list[int]] = {}
    for i, m in enumerate(messages):
        by_parent.setdefault((m[2], m[3]), []).append(i)
    groups = [(prec, pid, idx[k:k + LINK_BATCH]) for (prec, pid), idx in by_parent.items()
              for k in range(0, len(idx), LINK_BATCH)]
    r = yield [Call("resolve_many", [prec],
                    [pid, *(a for i in idx for a in (messages[i][4], messages[i][5]))])
               for prec, pid, idx in groups]
    codes = [-1] * len(messages)
    for (_p, _i, idx), v in zip(groups, r, strict=True):
        if isinstance(v, Exception):
            continue
        for i, c in zip(idx, v, strict=True):
            codes[i] = int(c)
    by: dict[str, list[str]] = {}
    for m, c in zip(messages, codes, strict=True):
        if c >= 0 and m[0]:
            by.setdefault(m[0], []).append(m[1])
    if by:
        d = yield [Cmd.of("XDEL", box, *ids) for box, ids in by.items()]
        for v in d:
            ok(v)
    return codes


def link(calls: Sequence[Call]) -> Op[list[str]]:
    """Link edges (link.lua calls, as link_call makes them), those of one slot up to
    LINK_BATCH per link_many.lua call; an edge to a dependency that had already ended is
    resolved now: in link_many.lua itself when its parent is in that slot, else its outbox
    message (its value in the answer) is applied at once (resolve_many.lua). Returns each
    edge's dependency state."""
    if not calls:
        return []
    states, _ = yield from _link_many(calls, tolerant=False)
    return states


def _link_many(calls: Sequence[Call], tolerant: bool) -> Op[tuple[list[str], int]]:
    """link()'s work; returns each edge's dependency state ('' for one whose call failed,
    ``tolerant``: else the call's error is raised) and how many resolves changed a job."""
    by_box: dict[str, list[int]] = {}
    for i, c in enumerate(calls):
        by_box.setdefault(c.keys[2], []).append(i)
    groups = [(box, idx[k:k + LINK_BATCH]) for box, idx in by_box.items()
              for k in range(0, len(idx), LINK_BATCH)]
    r = yield [Call("link_many", [box, *(k for i in idx for k in calls[i].keys[:2])],
                    [a for i in idx for a in calls[i].args])
               for box, idx in groups]
    states = [""] * len(calls)
    msgs: list[Message] = []
    changed = 0
    for (box, idx), v in zip(groups, r, strict=True):
        if tolerant and isinstance(v, Exception):
            continue
        for i, a in zip(idx, ok(v), strict=True):
            kind = _s(a[0])
            if kind == "ended":
                states[i] = _s(a[2])
                prec, pid, dmember, _ = _msg_of(calls[i])
                raw = a[3]
                msgs.append((box, _s(a[1]), prec, pid, dmember,
                             raw if isinstance(raw, bytes) else str(raw).encode()))
            else:
                states[i] = _s(a[1])
                if kind == "resolved" and int(a[2]) > 0:
                    changed += 1
    if msgs:
        codes = yield from apply(msgs)
        changed += sum(1 for c in codes if c > 0)
    return states, changed


def _msg_of(c: Call) -> tuple[str, str, str, bytes]:
    pi, prec, pid = _s(c.args[2]).split(" ")
    cq = _s(c.args[1]).rsplit(" ", 1)[1]
    return prec, pid, f"{pi} {cq} {_s(c.args[0])}", b""


def _entries(box: str, reply: Any) -> list[Message]:
    out: list[Message] = []
    for eid, fields in reply or []:
        f = {_s(fields[i]): fields[i + 1] for i in range(0, len(fields) - 1, 2)}
        if all(k in f for k in ("p", "i", "m", "v")):
            v = f["v"]
            out.append((box, _s(eid), _s(f["p"]), _s(f["i"]), _s(f["m"]),
                        v if isinstance(v, bytes) else str(v).encode()))
    return out


def relay_read(keys: Keys, entries: Any) -> Op[int]:
    """Apply outbox entries a blocking read brought (relay.py: at once, without reading them
    again); returns how many were applied."""
    codes = yield from apply(_entries(keys.outbox, entries))
    return sum(1 for c in codes if c >= 0)


def relay(keys: Keys, batch: int = RELAY_BATCH) -> Op[tuple[int, bool, str]]:
    """One relay step over a shard's outbox: up to ``batch`` messages applied and deleted.
    Returns (messages applied, whether more may be waiting, the id of the last entry read:
    '0-0' when none was: a blocking read after it wakes on the next one, relay.py)."""
    (r,) = yield [Cmd.of("XRANGE", keys.outbox, "-", "+", "COUNT", batch)]
    msgs = _entries(keys.outbox, ok(r))
    codes = yield from apply(msgs)
    last = _s(r[-1][0]) if r else "0-0"
    return sum(1 for c in codes if c >= 0), len(r or []) >= batch, last


def repair(keys: Keys, shards: int | None, min_age_ms: int, cursors: dict[str, int],
           known: Mapping[str, int] | None = None) -> Op[tuple[int, int]]:
    """One repair step over a shard's waiting jobs older than ``min_age_ms``: each pending
    dependency is linked again (link_many.lua: a no-op for a live one; one that ended or is missing
    is resolved now), a job with nothing pending is released, and an index entry whose job is
    no longer waiting is dropped. Returns (dependencies checked, resolves that changed a job).
    ``cursors``: SSCAN cursors per job id, kept by the caller between steps."""
    (t,) = yield [Cmd.of("TIME")]
    now = int(ok(t)[0]) * 1000 + int(ok(t)[1]) // 1000
    (ids,) = yield [Cmd.of("ZRANGEBYSCORE", keys.waiting, "-inf", now - min_age_ms,
                           "LIMIT", 0, REPAIR_PARENTS)]
    pids = [_s(i) for i in ok(ids)]
    if not pids:
        cursors.clear()
        return 0, 0
    for stale in set(cursors) - set(pids):
        del cursors[stale]
    step: list[Cmd | Call] = []
    for pid in pids:
        step.append(Cmd.of("HGET", keys.job(pid), "s"))
        step.append(Cmd.of("SSCAN", keys.deps(pid), cursors.get(pid, 0),
                           "COUNT", REPAIR_MEMBERS))
    r = yield step
    gone: list[str] = []
    edges: list[tuple[str, JobRef, int]] = []
    empty: list[str] = []
    for i, pid in enumerate(pids):
        st, scan = r[2 * i], r[2 * i + 1]
        if isinstance(st, Exception) or isinstance(scan, Exception):
            continue
        if st != b"w":
            gone.append(pid)
            continue
        cur, members = int(scan[0]), scan[1]
        cursors[pid] = cur
        if not members and cur == 0:
            empty.append(pid)
        for m in members:
            parts = _s(m).split(" ", 2)
            pol = _POLICY_OF.get(parts[0][:1]) if len(parts) == 3 else None
            if pol is None or not parts[0][1:].isdigit():
                continue  # (not a member wait.lua writes: left alone)
            try:
                edges.append((pid, JobRef(parts[1], parts[2], pol), int(parts[0][1:])))
            except InvalidArgument:
                continue
    if gone:
        yield [Cmd.of("ZREM", keys.waiting, *gone)]
    changed = 0
    if empty:  # nothing pending and still waiting: release (resolve.lua with no member)
        codes = yield from apply([("", "", keys.job(p), p, "", b"") for p in empty])
        changed += sum(1 for c in codes if c > 0)
    if edges:
        # a dependency written before a reshard is linked in its own shard (locate_refs)
        lays = yield from read_layouts(keys.prefix, (e[1].queue for e in edges), counts={
            **({} if shards is None else {keys.queue: shards}), **(known or {})})
        at = yield from locate_refs(keys.prefix, lays, [(e[1].queue, e[1].job_id)
                                                        for e in edges])
        _, n = yield from _link_many([link_at(keys.prefix, s, keys.job(pid), pid, ref, idx)
                                      for (pid, ref, idx), s in zip(edges, at, strict=True)],
                                     tolerant=True)
        changed += n
    if changed:
        yield [Cmd.of("HINCRBY", keys.stats, "flow_repairs", changed)]
    return len(edges), changed


def results_page(keys: Keys, job_id: str, serde: Any, cursor: int = 0, count: int = 1000
                 ) -> Op[tuple[int, list[DependencyResult]]]:
    """One page of a job's dependency results (HSCAN: a large fan-in never needs one giant
    reply). Returns (next cursor, 0 when done; results of this page, by index)."""
    (r,) = yield [Cmd.of("HSCAN", keys.dep_results(job_id), cursor, "COUNT", count)]
    cur, flat = ok(r)
    out = [decode_result(flat[i], flat[i + 1], serde) for i in range(0, len(flat) - 1, 2)]
    out.sort(key=lambda d: d.index)
    return int(cur), out


def all_results(keys: Keys, job_id: str, serde: Any) -> Op[list[DependencyResult]]:
    """Every dependency result of a job, page by page, by index."""
    out: list[DependencyResult] = []
    cur = 0
    while True:
        cur, page = yield from results_page(keys, job_id, serde, cur)
        out.extend(page)
        if cur == 0:
            break
    out.sort(key=lambda d: d.index)
    return out


def results_of(flat: Sequence[Any], serde: Any) -> list[DependencyResult]:
    """A job's dependency results from its results HASH as HGETALL gives it (field, value,
    ...), by index."""
    out = [decode_result(flat[i], flat[i + 1], serde) for i in range(0, len(flat) - 1, 2)]
    out.sort(key=lambda d: d.index)
    return out


def decode_result(field: Any, value: Any, serde: Any) -> DependencyResult:
    idx, q, cid = _s(field).split(" ", 2)
    raw = value if isinstance(value, bytes) else str(value).encode()
    state = OUTCOMES.get(chr(raw[0]) if raw else "m", "missing")
    body = raw[1:]
    result: Any = None
    reason = ""
    if state == "completed" and body:
        try:
            result = serde.loads(body)
        except Exception:  # noqa: BLE001 - an undecodable result comes back as bytes
            result = body
    elif state in ("failed", "purged"):
        reason = body.decode(errors="replace")
    return DependencyResult(int(idx), q, cid, state, result, reason)
