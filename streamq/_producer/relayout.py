"""Producers during a live reshard (docs/scaling.md#producers-during-a-reshard): new jobs
follow the queue's stored layout, and dedup by id stays exact.

A producer routes each job by ``Layout.shards`` and sends that count with every enqueue.lua
call (its header: ARGV[4]'s '/L'). A shard frozen by a reshard (``shards.FROZEN_FIELD``)
refuses a call routed by another count with ``STREAMQ_LAYOUT <n>`` and writes nothing
(``retry.layout_changed`` classifies it). :func:`enqueue` then

1. re-reads the layout (:func:`follow`); a reshard whose driver died after storing ``next``
   is finished here (``reshard.begin`` is safe to repeat), so a dead driver never stalls
   producers;
2. re-routes only the refused jobs (:func:`route`; jobs other calls wrote stay written:
   invariant 16);
3. looks for each re-routed job whose id moved home in its old homes (:func:`look`: one step,
   grouped by shard by the driver) and answers a job found there as enqueue.lua answers a
   duplicate; the old homes were frozen before the layout was published, so no record can
   appear there after the look;
4. sends the rest again; a refused call wrote nothing, so the resend is a retry only when
   the refused try was one (a try before it, whose reply was lost, may have written the job:
   then a job found with this very body and options answers 'queued', as a retry's does;
   otherwise an id some other call wrote answers 'duplicate', whatever its body); at most
   ``ATTEMPTS`` rounds, then the jobs still refused get LayoutChanged.

The same look runs before the first send of any job whose id moved home while ``Layout.prev``
is not empty (the reshard's retention window), refused or not.

:func:`enqueue` is sans-IO over two kinds of requests: a driver ``Op`` step (its replies come
back) and a :class:`Send` (the outcome of each enqueue.lua call comes back: its results and
confirming replicas, or its error). ``Queue`` and ``AsyncQueue`` serve both with their own
clients (``_producer/queue.py``).

Dedup keys (``Dedup(key=...)``) are not looked up in a key's old home: a key whose home moved
starts a new window in its new home (at most one more job per key and reshard); see
docs/scaling.md#producers-during-a-reshard.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from .._core import reshard as _reshard
from .._core import shards as _shards
from .._core.config import QueueConfig
from .._core.driver import Cmd, Op, ok
from .._core.errors import InvalidDedup, ReshardInProgress
from .._core.keys import Keys, shard_of
from .._core.model import EnqueueResult, normalize_record
from .._core.retry import layout_changed
from . import prepare as prod

T = TypeVar("T")
ATTEMPTS = 4
"""Rounds of re-reading the layout and resending refused jobs before LayoutChanged."""
REREAD_S = 60.0
"""How often a producer whose layout keeps earlier counts reads it again (monotonic clock):
they are dropped once every record written under them expired (``prev_until``)."""


def window_s(cfg: QueueConfig) -> int:
    """The longest retention of a record: how long an old home may hold one."""
    return max(cfg.default_result_ttl_s, cfg.dead_ttl_s)


def follow(keys: Keys, cfg: QueueConfig) -> Op[_shards.Layout]:
    """The stored layout, after finishing a reshard that has begun and is not published
    (its driver may have died after storing ``next``)."""
    for _ in range(ATTEMPTS):
        got = yield from _shards.read(keys)
        lay = got or _shards.Layout(cfg.shards)  # (no count stored: as configured)
        if lay.next is None:
            return lay
        try:
            return (yield from _reshard.begin(keys, lay.next, window_s(cfg)))
        except ReshardInProgress:
            continue  # another count began meanwhile: read again
    got = yield from _shards.read(keys)
    return got or _shards.Layout(cfg.shards)


def opened(keys: Keys, cfg: QueueConfig) -> Op[_shards.Layout]:
    """``shards.check_layout`` (ShardCountMismatch; a new queue's count stored), then a
    reshard that has begun finished (:func:`follow`): the layout a writer that has no
    earlier one routes by (a Spark partition, a cron tick)."""
    lay = yield from _shards.check_layout(keys, cfg.shards)
    if lay.next is not None:
        lay = yield from follow(keys, cfg)
    return lay


def route(keys: Keys, p: prod.Prepared, n: int) -> prod.Prepared:
    """``p`` routed by ``n`` shards: its home, record key and count. A dedup job keeps its key's
    shard (``shard_of(key, n)``): a drawn id is drawn again there; a given one that is not
    there raises InvalidDedup (nothing was written for it)."""
    if p.routed == n:
        return p
    jid = p.job_id
    if p.dedup is not None and n > 1:
        want = shard_of(p.dedup.key, n)
        if shard_of(jid, n) != want:
            if not p.drawn:
                raise InvalidDedup(f"job id {jid!r} is not in its dedup key's shard since the"
                                   f" queue {keys.queue!r} was resharded to {n}: enqueue it"
                                   " again with an id there, or let streamq draw it")
            while shard_of(jid, n) != want:
                jid = prod.new_job_id()
    jk = keys.for_job(jid, n)
    return p._replace(job_id=jid, key=jk.job(jid), shard=jk.shard, routed=n,
                      args=(jid, *p.args[1:]) if jid != p.job_id else p.args)


def look(keys: Keys, cfg: QueueConfig, layout: _shards.Layout, jobs: Sequence[prod.Prepared],
         retried: bool, tags: Sequence[str] | None = None) -> Op[dict[int, EnqueueResult]]:
    """The jobs (by index) whose id has a record in one of its old homes, answered as
    enqueue.lua answers a duplicate (``mine``: the record carries this very body and options,
    a retried call; with ``tags``, one writer tag per job: by :func:`writer_mine`). One step
    for all of them; none when no id moved."""
    if not layout.prev:
        return {}
    at: list[int] = []
    step: list[Cmd] = []
    for i, p in enumerate(jobs):
        for s in layout.old_homes(p.job_id):
            at.append(i)
            step.append(Cmd.of("HGETALL", keys.of_shard(s).job(p.job_id)))
    if not step:
        return {}
    replies = yield list(step)
    out: dict[int, EnqueueResult] = {}
    for i, r in zip(at, replies, strict=True):
        h = _record(ok(r))
        if i in out or not h:
            continue
        p = jobs[i]
        n = normalize_record(h)
        if tags is not None:
            mine = writer_mine(h.get(b"w"), tags[i])
        else:
            mine = int(b"s" in h and n.get(b"b") == _b(p.args[2]) and
                       n.get(b"op", b"") == _b(p.args[1]))
        reply = [b"duplicate", n.get(b"s", b""), n.get(b"r", b"") if n.get(b"s") ==
                 b"completed" else b"", n.get(b"error", b""), mine]
        out[i] = prod.parse_enqueue(cfg, [p], reply, retried=retried)[0]
    return out


_TAG = re.compile(r"^(.*):(\d+):(\d+)$")


def writer_mine(stored: bytes | None, tag: str) -> int:
    """_lib.lua's writer_mine, read-only: 1 when the record's writer tag ``stored`` says the
    row tagged ``tag`` (or an earlier attempt of its task) wrote it. (The script also moves
    the record's tag to the later attempt; a record in a frozen old home is left as it is,
    so a second row of the same id in that attempt counts as written too.)"""
    if not stored:
        return 0
    a, b = _TAG.match(stored.decode(errors="replace")), _TAG.match(tag)
    if a is None or b is None or a[1] != b[1]:
        return 0
    if int(a[2]) < int(b[2]):
        return 1
    return int(a[3] == b[3])


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def _record(r: Any) -> dict[bytes, bytes]:
    if isinstance(r, dict):
        return {_b(k): _b(v) for k, v in r.items()}
    it = iter(r or ())
    return {_b(k): _b(v) for k, v in zip(it, it, strict=True)}


class Send(NamedTuple):
    """Send ``batches`` (each one enqueue.lua call, jobs of one shard): the answer is each
    call's outcome, ``prepare.Part`` (results, replicas) or its error."""

    batches: list[Sequence[prod.Prepared]]
    retried: bool


Need = Send | list[Any]
"""A request of :func:`enqueue`: a Send, or a driver step (list of Cmd/Call)."""
Outcome = prod.Part | Exception
Sent = tuple[list[prod.Prepared], list[Sequence[prod.Prepared]], list[Outcome], _shards.Layout]
"""What :func:`enqueue` returns."""
Gen = Generator[Need, Any, Sent]


def enqueue(keys: Keys, cfg: QueueConfig, layout: _shards.Layout,
            prepared: Sequence[prod.Prepared], reread: bool = False) -> Gen:
    """Send ``prepared`` by ``layout``, following a reshard (the module docstring). Returns the
    jobs as last routed (in the caller's order), the calls that answered them and each call's
    outcome (``prepare.in_order`` puts their results in the caller's order; a call's error,
    LayoutChanged after ``ATTEMPTS`` rounds) and the layout it ended with.

    The common case (no earlier count to look in, every job routed by the current one, no
    refusal) is one Send and its answer as it came. ``reread``: read the layout first (a
    producer's layout with earlier counts is read again now and then: they are dropped once
    their records expired, and the looks with them)."""
    if reread:
        layout = yield from follow(keys, cfg)
    n = layout.shards
    jobs = list(prepared)
    if not layout.prev and all(p.routed == n for p in jobs):
        batches = prod.chunks(jobs)
        got: list[Outcome] = yield Send(batches, False)
        if not any(isinstance(o, Exception) and layout_changed(o, keys.queue) for o in got):
            return jobs, batches, got, layout
        outs, todo = _each(keys, jobs, batches, got)
        return (yield from _again(keys, cfg, (yield from follow(keys, cfg)), jobs, outs, todo,
                                  any(after_retry(o, keys) for o in got)))
    return (yield from _again(keys, cfg, layout, jobs, [None] * len(jobs),
                              list(range(len(jobs))), False))


RETRIED = "_streamq_after_retry"
"""Set on a refusal (resend.py) that answered a retried try: a try before it may have
written the job, so the resend is a retry too (a job found with its body answers 'queued')."""


def mark_retry(exc: BaseException, retried: bool) -> None:
    if retried:
        setattr(exc, RETRIED, True)


def after_retry(o: object, keys: Keys) -> bool:
    """Whether ``o`` is a refusal of a retried try (see RETRIED)."""
    return isinstance(o, Exception) and bool(getattr(o, RETRIED, False)) \
        and layout_changed(o, keys.queue) is not None


def _each(keys: Keys, jobs: list[prod.Prepared], batches: Sequence[Sequence[prod.Prepared]],
          got: Sequence[Outcome], outs: list[Outcome | None] | None = None,
          ) -> tuple[list[Outcome | None], list[int]]:
    """Each job's outcome from its call's (``outs``, filled in) and the refused jobs."""
    outs = outs if outs is not None else [None] * len(jobs)
    idx = {id(p): i for i, p in enumerate(jobs)}
    refused: list[int] = []
    for b, o in zip(batches, got, strict=True):
        lc = layout_changed(o, keys.queue) if isinstance(o, Exception) else None
        for k, p in enumerate(b):
            i = idx[id(p)]
            if lc is not None:
                refused.append(i)
                outs[i] = lc
            elif isinstance(o, Exception):
                outs[i] = o
            else:
                outs[i] = ([o[0][k]], o[1])
    return outs, sorted(refused)


def _again(keys: Keys, cfg: QueueConfig, layout: _shards.Layout, jobs: list[prod.Prepared],
           outs: list[Outcome | None], todo: list[int], retried: bool) -> Gen:
    """Route the jobs ``todo`` by ``layout``, look in their old homes, send the rest; again
    for the refused ones (``retried``: a refused call wrote nothing, an earlier try of it may
    have)."""
    for rnd in range(ATTEMPTS):
        n = layout.shards
        for i in todo:
            jobs[i] = route(keys, jobs[i], n)
        if layout.prev:
            found = yield from look(keys, cfg, layout, [jobs[i] for i in todo], retried)
            for j, r in found.items():
                outs[todo[j]] = ([r], cfg.min_replicas)  # a read: nothing to replicate
            todo = [i for j, i in enumerate(todo) if j not in found]
        if not todo:
            break
        part = [jobs[i] for i in todo]
        batches = prod.chunks(part)
        got: list[Outcome] = yield Send(batches, retried)
        outs, todo = _each(keys, jobs, batches, got, outs)
        if not todo or rnd == ATTEMPTS - 1:
            break
        # a refused call wrote nothing: the next round is a retry only when a refused try was
        # one (a try before it, whose reply was lost, may have written the job)
        retried = any(after_retry(o, keys) for o in got)
        layout = yield from follow(keys, cfg)
    final: list[Outcome] = []
    for x in outs:
        assert x is not None
        final.append(x)
    return jobs, [[p] for p in jobs], final, layout


def one(step: list[Any]) -> Op[list[Any]]:
    """A driver op of one step (a Need that is not a Send): its replies."""
    replies = yield step
    return replies


def run(gen: Generator[Need, Any, T], step: Callable[[list[Any]], list[Any]],
        send: Callable[[Send], list[Outcome]]) -> T:
    """Drive :func:`enqueue` with blocking ``step`` and ``send``."""
    try:
        need = next(gen)
        while True:
            need = gen.send(send(need) if isinstance(need, Send) else step(need))
    except StopIteration as stop:
        return cast(T, stop.value)


async def arun(gen: Generator[Need, Any, T], step: Callable[[list[Any]], Awaitable[list[Any]]],
               send: Callable[[Send], Awaitable[list[Outcome]]]) -> T:
    """:func:`run` with awaitable ``step`` and ``send``."""
    try:
        need = next(gen)
        while True:
            need = gen.send(await send(need) if isinstance(need, Send) else await step(need))
    except StopIteration as stop:
        return cast(T, stop.value)


def results(sent: Sent) -> list[EnqueueResult]:
    """A lone (auto-batched) enqueue's results in the caller's order; the first error among
    the calls' outcomes raised."""
    jobs, batches, outs, _ = sent
    flat: list[EnqueueResult] = []
    for o in outs:
        if isinstance(o, Exception):
            raise o
        flat.extend(o[0])
    return prod.in_order(jobs, batches, flat)
