"""Batches with callbacks (docs/workflows.md#batches-with-callbacks), over the one workflow
primitive.

A batch is a record in state ``waiting`` that never runs (batch_open.lua). Its callbacks are
waiting jobs in its slot whose first dependency (index 0) is the batch itself:

- ``on_success``: policy ``fail`` on every job (a dead job dead-letters it, naming the job; a
  re-drive of that job that completes re-opens it);
- ``on_complete``: policy ``continue`` (runs once every job ended, failures included);
- ``on_death``: policy ``death`` (the first dead-lettered job releases it at once; when every
  job ended without one it ends ``cancelled``).

``add`` puts each new job into each waiting callback's pending SET first (adopt.lua, refused
once the batch's own edge left it: closed), then enqueues the jobs, then links every edge in the
job's slot (link_many.lua). ``close`` ends the batch record (batch_close.lua), which resolves its
edge in every callback in the same script: no callback can be released before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from .._core.config import QueueConfig
from .._core.driver import Call, Cmd, Op, adrive, drive, ok
from .._core.errors import BatchClosed, InvalidArgument, JobNotFound
from .._core.flow import JobRef, link, link_call, member, shard_counts
from .._core.keys import Keys, check_job_id, shard_of
from .._core.locate import locate
from .._core.model import CancelResult, Job
from .._core.retry import acall, call
from .._core.shards import Layout
from .flows import FlowResult, Group, JobSpec, compile_flow, enqueue_flow, enqueue_waiting
from .prepare import new_job_id


class Queue(Protocol):
    """What a batch needs of its ``Queue`` (typed here, so this module never imports queue.py,
    which imports it)."""

    client: Any
    keys: Keys
    config: QueueConfig
    layout: Layout

    def _check(self) -> None: ...
    def _note(self) -> None: ...
    def _drive_flow(self, op: Any) -> Any: ...
    def cancel(self, job_id: str) -> CancelResult: ...


class AsyncQueue(Protocol):
    """What a batch needs of its ``AsyncQueue``."""

    client: Any
    keys: Keys
    config: QueueConfig
    layout: Layout

    async def _check(self) -> None: ...
    async def _note(self) -> None: ...
    async def _drive_flow(self, op: Any) -> Any: ...
    async def cancel(self, job_id: str) -> CancelResult: ...

BATCH_TYPE = "streamq.batch"
"""The job type of a batch's own record (it never runs: no stream entry)."""
BATCH_HEADER = "streamq-batch"
"""Header of a batch's jobs and callbacks: the batch id (``Job.batch_id``)."""
KINDS: dict[str, str] = {"on_success": "fail", "on_complete": "continue", "on_death": "death"}
"""Callback kind -> the policy of its edges to the batch's jobs."""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _callback_id(batch_id: str, kind: str, shards: int) -> str:
    """``<batch id>.<kind>``, with a suffix on a sharded queue until it is in the batch's
    shard (deterministic: every producer finds the same)."""
    base = cid = f"{batch_id}.{kind}"
    n = 0
    while shard_of(cid, shards) != shard_of(batch_id, shards):
        n += 1
        cid = f"{base}.{n}"
    return cid


def _with_header(spec: JobSpec, batch_id: str) -> JobSpec:
    opts = dict(spec.options)
    opts["headers"] = {**(opts.get("headers") or {}), BATCH_HEADER: batch_id}
    return JobSpec(spec.type, spec.payload, queue=spec.queue, job_id=spec.job_id, **opts)


def parse_bc(raw: Any) -> dict[str, str]:
    """A batch record's 'bc' field: callback kind -> job id."""
    out: dict[str, str] = {}
    for w in _s(raw or b"").split():
        k, _, v = w.partition("=")
        if k in KINDS and v:
            out[k] = v
    return out


def batch_config(keys: Keys, cfg: QueueConfig, batch_id: str, layout: Layout | None
                 ) -> Op[QueueConfig]:
    """``cfg`` with the shard count the batch was opened under: a batch opened before a
    reshard keeps its record and callbacks in its home under that count (they are in one
    slot: batch_close.lua resolves them in one script). ``layout``: the queue's; the first of
    its homes under the layout's counts (``Layout.prev``) holding the record wins, the
    current one first (no I/O for an id that did not move)."""
    homes: dict[int, int] = {}
    for n in (cfg.shards, *(layout.prev if layout is not None else ())):
        homes.setdefault(shard_of(batch_id, n), n)
    if len(homes) == 1:
        return cfg
    got = yield [Cmd.of("EXISTS", keys.of_shard(s).job(batch_id)) for s in homes]
    for n, v in zip(homes.values(), got, strict=True):
        if ok(v):
            return cfg if n == cfg.shards else attrs.evolve(cfg, shards=n)
    return cfg


def open_batch(keys: Keys, cfg: QueueConfig, batch_id: str,
               callbacks: dict[str, JobSpec | None], layout: Layout | None = None
               ) -> Op[dict[str, str]]:
    """Open a batch (its record, then each callback waiting for it). Returns kind -> callback
    job id. A repeat (same id) writes nothing new and returns the ids it was opened with."""
    cfg = yield from batch_config(keys, cfg, batch_id, layout)
    ids: dict[str, str] = {}
    for kind, spec in callbacks.items():
        if spec is None:
            continue
        if not isinstance(spec, JobSpec):
            raise InvalidArgument(f"{kind} must be a JobSpec, got {type(spec).__name__}")
        if spec.queue not in (None, keys.queue):
            raise InvalidArgument(f"{kind}: a batch's callbacks are in its own queue")
        cid = spec.job_id or _callback_id(batch_id, kind, cfg.shards)
        check_job_id(cid)
        if shard_of(cid, cfg.shards) != shard_of(batch_id, cfg.shards):
            raise InvalidArgument(f"{kind}: job id {cid!r} is not in the batch's shard (leave"
                                  " job_id out: one is chosen that is)")
        ids[kind] = cid
    if not ids:
        raise InvalidArgument("a batch needs at least one of on_success, on_complete, on_death")
    bk = keys.for_job(batch_id, cfg.shards)
    body = f"{BATCH_TYPE} ".encode() + cfg.serde.dumps({"batch": batch_id, "callbacks": ids})
    bc = " ".join(f"{k}={v}" for k, v in ids.items())
    (r,) = yield [Call("batch_open", [bk.job(batch_id), bk.events, bk.stats],
                       [batch_id, body, bc, cfg.events_arg, cfg.shards])]
    if _s(ok(r)[0]) == "exists":
        (got,) = yield [Cmd.of("HGET", bk.job(batch_id), "bc")]
        if ok(got) is None:
            raise InvalidArgument(f"job {batch_id!r} exists and is not a batch")
        ids = parse_bc(ok(got))
    for kind, cid in ids.items():
        spec = callbacks.get(kind)
        if spec is None:
            continue
        spec = _with_header(spec, batch_id)
        yield from enqueue_waiting(keys, cfg, spec.type, spec.payload, {  # (in its home)
            **spec.options, "job_id": cid,
            "depends_on": [JobRef(keys.queue, batch_id, KINDS[kind])]})  # type: ignore[arg-type]
    return ids


def add_id_of(batch_id: str, specs: Sequence[JobSpec], cfg: QueueConfig) -> str:
    """A call id from the content of an ``add`` (a repeat of the same list is the same call)."""
    h = hashlib.sha1(batch_id.encode())
    for s in specs:
        h.update(repr((s.type, s.queue, s.job_id, sorted(s.options.items()))).encode())
        h.update(cfg.serde.dumps(s.payload))
    return h.hexdigest()[:12]


def add_to_batch(keys: Keys, cfg: QueueConfig, batch_id: str, specs: Sequence[JobSpec],
                 call_id: str, inside: bool = False, layout: Layout | None = None
                 ) -> Op[FlowResult]:
    """Add jobs to an open batch (see the module). Raises BatchClosed once it is closed. The
    new jobs follow the current layout; the batch's record and callbacks stay in its home
    (``batch_config``)."""
    specs = list(specs)
    if not specs or not all(isinstance(s, JobSpec) for s in specs):
        raise InvalidArgument("Batch.add takes a non-empty list of JobSpec")
    specs = [_with_header(s, batch_id) for s in specs]
    bk = yield from locate(keys, layout or Layout(cfg.shards), batch_id)
    (r,) = yield [Cmd.of("HMGET", bk.job(batch_id), "s", "bc")]
    st, raw = ok(r)
    cbs = parse_bc(raw)
    if not cbs:
        raise JobNotFound(f"no batch {batch_id!r} in queue {keys.queue!r}")
    flow_id = f"{batch_id}.{call_id}"
    nodes = compile_flow(Group(tuple(specs)), keys.queue, flow_id)
    calls: list[Cmd | Call] = []
    for kind, cid in cbs.items():
        letter = member(JobRef(keys.queue, batch_id, KINDS[kind]), 0)  # type: ignore[arg-type]
        calls.append(Call("adopt", [bk.job(cid), bk.deps(cid), bk.dep_results(cid)],
                          [call_id, ("@@" if inside else "@") + letter,
                           *(f"{letter[0]} {n.ref.queue} {n.ref.job_id}" for n in nodes)]))
    got = yield calls
    bases: dict[str, int] = {}
    closed = False
    for (kind, _cid), v in zip(cbs.items(), got, strict=True):
        code = _s(ok(v)[0])
        closed = closed or code == "closed"
        if code == "ok":
            bases[kind] = int(ok(v)[1])
    if closed and not bases:
        raise BatchClosed(f"batch {batch_id!r} is closed: nothing was added")
    # (an add that raced the close, accepted by some callbacks only, goes on: those wait for
    # the jobs, which must then exist)
    if not bases:  # (every callback has fired or ended: the batch is over)
        raise BatchClosed(f"batch {batch_id!r} is {_s(st) if st else 'gone'}: nothing was"
                          " added")
    out = yield from enqueue_flow(keys, cfg, Group(tuple(specs)), flow_id, layout)
    sh = yield from shard_counts(keys.prefix, (n.ref.queue for n in nodes),
                                 {keys.queue: cfg.shards})
    yield from link([link_call(keys.prefix, sh, bk.job(cbs[kind]), cbs[kind],
                               JobRef(n.ref.queue, n.ref.job_id, KINDS[kind]),  # type: ignore[arg-type]
                               base + i)
                     for kind, base in bases.items() for i, n in enumerate(nodes)])
    return out


def close_batch(keys: Keys, cfg: QueueConfig, batch_id: str, retried: bool = False,
                layout: Layout | None = None) -> Op[bool]:
    """Close a batch: True when this call closed it, False when it was closed before (a
    retried call after a lost reply that finds it closed: True)."""
    bk = yield from locate(keys, layout or Layout(cfg.shards), batch_id)
    (r,) = yield [Call("batch_close", [bk.job(batch_id), bk.events],
                       [batch_id, cfg.serde.dumps(batch_id), cfg.events_arg])]
    code = _s(ok(r)[0])
    if code == "not_found":
        raise JobNotFound(f"no batch {batch_id!r} in queue {keys.queue!r}")
    return code == "closed" or (retried and _s(ok(r)[1]) == "completed")


def callbacks_of(keys: Keys, cfg: QueueConfig, batch_id: str, layout: Layout | None = None
                 ) -> Op[dict[str, str]]:
    bk = yield from locate(keys, layout or Layout(cfg.shards), batch_id)
    (r,) = yield [Cmd.of("HGET", bk.job(batch_id), "bc")]
    return parse_bc(ok(r))


@attrs.define
class Batch:
    """A batch of a ``Queue`` (``q.batch(...)``, ``q.batch_ref(id)``): ``add``, ``close``,
    ``cancel``; as a context manager it closes on a clean exit
    (docs/workflows.md#batches-with-callbacks)."""

    queue: Queue
    batch_id: str
    callbacks: dict[str, str] = attrs.field(factory=dict)
    """Callback kind (on_success, on_complete, on_death) -> its job id."""

    @classmethod
    def open(cls, q: Queue, batch_id: str | None, on_success: JobSpec | None,
             on_complete: JobSpec | None, on_death: JobSpec | None) -> Batch:
        """``Queue.batch``."""
        q._check()  # (the shard count, as every write does)
        bid = new_job_id() if batch_id is None else check_job_id(batch_id)
        specs = callback_specs(on_success, on_complete, on_death)
        ids = call(lambda _r: q._drive_flow(open_batch(q.keys, q.config, bid, specs,
                                                               q.layout)))
        q._note()
        return cls(q, bid, ids)

    def _run(self, op: Any) -> Any:
        q = self.queue
        return call(lambda _r: q._drive_flow(op()))

    def add(self, specs: Sequence[JobSpec], *, add_id: str | None = None,
            from_job: Job | None = None) -> FlowResult:
        """Add jobs (``JobSpec``) to the open batch; BatchClosed once closed. A job without
        ``job_id`` gets ``<batch id>.<add id>.<n>``; ``add_id`` defaults to a hash of the
        list's content, so repeating the same call adds nothing new. ``from_job``: the
        running job of this batch that adds them (its handler's ``job``): accepted after the
        close too, as long as the callbacks wait (they wait for that job)."""
        q = self.queue
        q._check()  # (the shard count, as every write does)
        aid = add_id or add_id_of(self.batch_id, specs, q.config)
        inside = _inside(from_job, self.batch_id)
        return self._run(lambda: add_to_batch(  # type: ignore[no-any-return]
            q.keys, q.config, self.batch_id, specs, check_job_id(aid), inside, q.layout))

    def close(self) -> bool:
        """Close the batch: its callbacks may fire from now on. True when this call closed
        it, False when it was closed (or cancelled) before."""
        q = self.queue
        q._check()
        return call(lambda retried: drive(q.client, close_batch(
            q.keys, q.config, self.batch_id, retried, q.layout)))

    def cancel(self) -> list[CancelResult]:
        """Cancel the batch's waiting callbacks; that cancels, as for any waiting job, the
        batch record and the batch's jobs that have not started and that nothing else waits
        for (docs/workflows.md#cancelling-a-flow)."""
        q = self.queue
        q._check()
        cbs = self.callbacks or self._run(lambda: callbacks_of(q.keys, q.config, self.batch_id,
                                                               q.layout))
        return [q.cancel(cid) for cid in cbs.values()]

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()


@attrs.define
class AsyncBatch:
    """``Batch`` of an ``AsyncQueue``: the same methods, awaited."""

    queue: AsyncQueue
    batch_id: str
    callbacks: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    async def open(cls, q: AsyncQueue, batch_id: str | None, on_success: JobSpec | None,
                   on_complete: JobSpec | None, on_death: JobSpec | None) -> AsyncBatch:
        """``AsyncQueue.batch``."""
        await q._check()
        bid = new_job_id() if batch_id is None else check_job_id(batch_id)
        specs = callback_specs(on_success, on_complete, on_death)
        ids = await acall(lambda _r: q._drive_flow(open_batch(q.keys, q.config, bid, specs,
                                                               q.layout)))
        await q._note()
        return cls(q, bid, ids)

    async def _run(self, op: Any) -> Any:
        q = self.queue
        return await acall(lambda _r: q._drive_flow(op()))

    async def add(self, specs: Sequence[JobSpec], *, add_id: str | None = None,
                  from_job: Job | None = None) -> FlowResult:
        """See ``Batch.add``."""
        q = self.queue
        await q._check()
        aid = add_id or add_id_of(self.batch_id, specs, q.config)
        inside = _inside(from_job, self.batch_id)
        return await self._run(lambda: add_to_batch(  # type: ignore[no-any-return]
            q.keys, q.config, self.batch_id, specs, check_job_id(aid), inside, q.layout))

    async def close(self) -> bool:
        """See ``Batch.close``."""
        q = self.queue
        await q._check()
        return await acall(lambda retried: adrive(
            q.client, close_batch(q.keys, q.config, self.batch_id, retried, q.layout)))

    async def cancel(self) -> list[CancelResult]:
        """See ``Batch.cancel``."""
        q = self.queue
        await q._check()
        cbs = self.callbacks or await self._run(
            lambda: callbacks_of(q.keys, q.config, self.batch_id, q.layout))
        return [await q.cancel(cid) for cid in cbs.values()]

    async def __aenter__(self) -> AsyncBatch:
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            await self.close()


def _inside(job: Job | None, batch_id: str) -> bool:
    if job is None:
        return False
    if job.batch_id != batch_id:
        raise InvalidArgument(f"from_job: job {job.id!r} is not a job of batch {batch_id!r}")
    return True


def callback_specs(on_success: JobSpec | None, on_complete: JobSpec | None,
                   on_death: JobSpec | None) -> dict[str, JobSpec | None]:
    return {"on_success": on_success, "on_complete": on_complete, "on_death": on_death}
