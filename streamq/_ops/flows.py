"""A job's place in a workflow (docs/workflows.md#looking-at-a-flow): its parents, its
dependencies with each one's state, and what still blocks it, in bounded pages.

Read from the workflow keys only (the job's pending SET and results HASH, its parents SET)
and one record read per node shown; SSCAN/HSCAN with a cursor, so a 10,000 -> 1 fan-in is
shown page by page, never in one reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .._core.driver import Call, Cmd, Op, ok
from .._core.errors import InvalidArgument, JobNotFound
from .._core.flow import OUTCOMES
from .._core.keys import Keys, check_job_id, parse_job_key
from .._core.locate import locate_refs, read_layouts
from .._core.model import record_state
from .._core.shards import Layout

_POLICY = {"f": "fail", "c": "continue", "i": "ignore", "r": "remove", "d": "death"}
_PHASES = ("d", "r", "p")
"""Pages walk the pending SET (d), then the results HASH (r), then the parents SET (p)."""
MAX_LIMIT = 1000


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@attrs.frozen
class FlowEdge:
    """One edge of a job's flow: a dependency of it (``children``) or a job waiting for it
    (``parents``)."""

    queue: str
    job_id: str
    state: str
    """The other job's state now (``missing``: no record: never enqueued, expired, purged)."""
    policy: str
    """The edge's failure policy: fail | continue | ignore | remove | death."""
    index: int
    """The dependency's place in the waiting job's ``depends_on``."""
    outcome: str = ""
    """Children only: how the dependency ended as the waiting job recorded it (completed,
    failed, cancelled, purged, missing); '' while it is pending."""


@attrs.frozen
class BatchProgress:
    """A batch's progress (``FlowView.batch``), read from one of its callbacks still waiting
    (on_complete first): its pending SET and results HASH (HSCAN, at most ``MAX_BATCH_SCAN``
    results counted)."""

    open: bool
    """Not closed (nor cancelled) yet: jobs may still be added."""
    total: int
    """Jobs added so far (ended + pending)."""
    completed: int
    dead: int
    """Dead-lettered (failed) jobs; cancelled, purged or missing ones count in neither."""
    pending: int
    """Jobs not ended yet."""
    callbacks: dict[str, str] = attrs.field(factory=dict)
    """Callback kind -> 'job id state' now."""
    settled: bool = False
    """No callback waits any more (the counts are then 0: the keys they came from are gone)."""


MAX_BATCH_SCAN = 100_000


@attrs.frozen
class FlowView:
    """One page of a job's flow (``Admin.flow``)."""

    queue: str
    job_id: str
    state: str
    """The job's own state."""
    children: list[FlowEdge]
    """The jobs it waits (or waited) for on this page: pending ones first, then ended ones."""
    parents: list[FlowEdge]
    """The jobs waiting for it, on this page (kept until it ends: then they are resolved)."""
    cursor: str = ""
    """'' on the last page; else pass it back for the next one."""
    batch: BatchProgress | None = None
    """For a batch's own id (docs/workflows.md#batches-with-callbacks): its progress counts."""
    pending_total: int = 0
    """Dependencies it still waits for, on every page (SCARD of its pending SET)."""
    ended_total: int = 0
    """Dependencies that ended and are recorded, on every page (HLEN of its results)."""
    parents_total: int = 0
    """Jobs waiting for it, on every page (SCARD of its parents SET)."""

    @property
    def blocked_by(self) -> list[FlowEdge]:
        """The dependencies on this page it still waits for."""
        return [c for c in self.children if not c.outcome]


def _parse_cursor(cursor: str | None) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    phase, _, cur = cursor.partition(":")
    if phase not in _PHASES or not cur.isdigit():
        raise InvalidArgument(f"invalid flow cursor {cursor!r} (pass back the one a page gave)")
    return _PHASES.index(phase), int(cur)


def _states(reply: Any) -> str:
    r = ok(reply)
    v = r[0] if r[0] is not None else r[1]  # layout 2 's', else layout 1 'state'
    return record_state(v) or "missing"


def flow(keys: Keys, shards: int, job_id: str, cursor: str | None = None, limit: int = 100,
         known: Mapping[str, Layout] | None = None) -> Op[FlowView]:
    """One page of ``job_id``'s flow. ``keys``: the job's own shard (located); ``shards``: its
    queue's shard count when none is stored; ``known``: layouts already read, by queue. About
    ``limit`` edges a page (SSCAN/HSCAN counts are hints). Each dependency's record is read
    in the shard that holds it (``locate_refs``: one written before a reshard may be in its
    home under an earlier count); a waiting job's record key is in its edge."""
    check_job_id(job_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be 1..{MAX_LIMIT}, got {limit!r}")
    phase, cur = _parse_cursor(cursor)
    own, n_deps, n_ended, n_parents = yield [
        Cmd.of("HMGET", keys.job(job_id), "s", "state", "bc"), Cmd.of("SCARD", keys.deps(job_id)),
        Cmd.of("HLEN", keys.dep_results(job_id)), Cmd.of("SCARD", keys.parents(job_id))]
    state = _states(own)
    if state == "missing":
        raise JobNotFound(f"job {job_id!r} not found in queue {keys.queue!r}")
    batch = None
    if ok(own)[2] is not None:
        batch = yield from batch_progress(keys, job_id, state, _s(ok(own)[2]))
    # (kind, policy letter, index, queue, id, record key or '', outcome)
    rows: list[tuple[str, str, int, str, str, str, str]] = []
    totals = int(ok(n_deps)), int(ok(n_ended)), int(ok(n_parents))
    if not any(totals):
        phase = len(_PHASES)  # (no edge at all: nothing to scan; most jobs are not in a flow)
    while phase < len(_PHASES) and len(rows) < limit:
        name = _PHASES[phase]
        key = {"d": keys.deps(job_id), "r": keys.dep_results(job_id),
               "p": keys.parents(job_id)}[name]
        (r,) = yield [Cmd.of("HSCAN" if name == "r" else "SSCAN", key, cur,
                             "COUNT", limit - len(rows))]
        nxt, items = ok(r)
        cur = int(nxt)
        if name == "r":
            for i in range(0, len(items) - 1, 2):
                parts = _s(items[i]).split(" ", 2)
                v = items[i + 1]
                raw = v if isinstance(v, bytes) else str(v).encode()
                if len(parts) == 3 and parts[0].isdigit():
                    rows.append(("c", "", int(parts[0]), parts[1], parts[2], "",
                                 OUTCOMES.get(chr(raw[0]) if raw else "m", "missing")))
        else:
            for m in items:
                parts = _s(m).split(" ", 2)
                if len(parts) != 3 or parts[0][:1] not in _POLICY or not parts[0][1:].isdigit():
                    continue  # (not a member the workflow scripts write)
                if name == "d":
                    rows.append(("c", parts[0][0], int(parts[0][1:]), parts[1], parts[2], "",
                                 ""))
                else:
                    where = parse_job_key(parts[1], keys.prefix)
                    if where is not None:
                        rows.append(("p", parts[0][0], int(parts[0][1:]), where[0], parts[2],
                                     parts[1], ""))
        if cur == 0:
            phase += 1
    kids = [(r[3], r[4]) for r in rows if not r[5]]
    lays = yield from read_layouts(keys.prefix, {q for q, _ in kids}, known,
                                   {keys.queue: shards})
    at = iter((yield from locate_refs(keys.prefix, lays, kids)))
    reads: list[Cmd | Call] = [
        Cmd.of("HMGET", r[5] or Keys(r[3], keys.prefix, next(at)).job(r[4]), "s", "state")
        for r in rows]
    got = (yield reads) if reads else []
    children: list[FlowEdge] = []
    parents: list[FlowEdge] = []
    for r, v in zip(rows, got, strict=True):
        edge = FlowEdge(r[3], r[4], _states(v), _POLICY.get(r[1], ""), r[2], r[6])
        (children if r[0] == "c" else parents).append(edge)
    children.sort(key=lambda c: (c.outcome != "", c.index))
    parents.sort(key=lambda p: (p.queue, p.job_id))
    return FlowView(keys.queue, job_id, state, children, parents,
                    "" if phase >= len(_PHASES) else f"{_PHASES[phase]}:{cur}", batch,
                    *totals)


def batch_progress(keys: Keys, batch_id: str, state: str, bc: str) -> Op[BatchProgress]:
    """A batch's counts from its first callback still waiting (see ``BatchProgress``)."""
    cbs = [tuple(w.split("=", 1)) for w in bc.split() if "=" in w]
    order = {"on_complete": 0, "on_success": 1, "on_death": 2}
    cbs.sort(key=lambda c: order.get(c[0], 3))
    got = yield [Cmd.of("HMGET", keys.job(cid), "s", "state") for _k, cid in cbs]
    states = {k: (cid, _states(v)) for (k, cid), v in zip(cbs, got, strict=True)}
    shown = {k: f"{cid} {st}" for k, (cid, st) in states.items()}
    is_open = state == "waiting"
    tracker = next((cid for _k, (cid, st) in states.items() if st == "waiting"), None)
    if tracker is None:
        return BatchProgress(is_open, 0, 0, 0, 0, shown, True)
    (n,) = yield [Cmd.of("SCARD", keys.deps(tracker))]
    pending = int(ok(n)) - (1 if is_open else 0)
    completed = dead = ended = 0
    cur = 0
    while True:
        (r,) = yield [Cmd.of("HSCAN", keys.dep_results(tracker), cur, "COUNT", MAX_LIMIT)]
        nxt, items = ok(r)
        cur = int(nxt)
        for i in range(0, len(items) - 1, 2):
            if _s(items[i]).startswith("0 "):
                continue  # (index 0: the batch itself)
            v = items[i + 1]
            letter = (v if isinstance(v, bytes) else str(v).encode())[:1]
            ended += 1
            completed += letter == b"c"
            dead += letter == b"f"
        if cur == 0 or ended >= MAX_BATCH_SCAN:
            break
    return BatchProgress(is_open, ended + pending, completed, dead, pending, shown)
