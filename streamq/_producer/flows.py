"""The producer side of workflows (docs/workflows.md): ``enqueue(..., depends_on=[...])`` and
``enqueue_flow`` over the one primitive of streamq/_core/flow.py, and the sugar that compiles
to it: ``JobSpec``, ``chain``, ``group``, ``chord``.

Order of writes, so that a producer dying at any point leaves nothing stranded: every waiting
job first (wait.lua: its record and pending set, in its own slot), then the jobs that have no
dependencies (enqueue.lua), then every edge (link_many.lua, in the dependency's
slot; one already ended is resolved at once). A waiting job whose edges never got linked is
found by the repair sweep; a repeat of the same flow with the same ``flow_id`` writes nothing
new (deterministic ids) and links what is missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .._core import search
from .._core.config import QueueConfig
from .._core.driver import Call, Cmd, Op, ok
from .._core.errors import InvalidArgument
from .._core.flow import (
    DEPS_HEADER,
    JobRef,
    link,
    link_at,
    member,
    refs,
    shard_counts,
    wk_of,
)
from .._core.keys import DEFAULT_PRIORITY, Keys
from .._core.locate import locate, locate_refs, read_layouts
from .._core.model import EnqueueResult
from .._core.shards import Layout
from . import prepare as prod


class JobSpec:
    """A job to enqueue as part of a flow: ``JobSpec(type, payload, queue=..., job_id=...,
    **options)`` with the options of ``enqueue`` (``priority``, ``delay``, ``result_ttl``,
    ``max_attempts``, ...). ``queue``: another queue than the one ``enqueue_flow`` is called
    on (None: that one). ``job_id``: None gets a deterministic id from the flow's id."""

    __slots__ = ("job_id", "options", "payload", "queue", "type")

    def __init__(self, type: str, payload: Any = None, *, queue: str | None = None,
                 job_id: str | None = None, **options: Any) -> None:
        if "depends_on" in options or "group" in options or "dedup" in options:
            raise InvalidArgument("a JobSpec takes its dependencies from the flow (chain,"
                                  " group, chord); group= and dedup= are not supported in"
                                  " flows yet")
        self.type = type
        self.payload = payload
        self.queue = queue
        self.job_id = job_id
        self.options = options

    def __repr__(self) -> str:
        return f"JobSpec({self.type!r}, queue={self.queue!r}, job_id={self.job_id!r})"


@attrs.frozen
class Chain:
    """Steps run one after the other; each step waits for the previous one (its results in
    ``job.dependency_results()``)."""

    steps: tuple[Any, ...]


@attrs.frozen
class Group:
    """Members run in parallel; what follows a group waits for every member."""

    members: tuple[Any, ...]


@attrs.frozen
class Chord:
    """A group, then a callback that waits for every member (its results in order)."""

    header: Group
    body: Any


Flow = JobSpec | Chain | Group | Chord


def chain(*steps: Flow) -> Chain:
    if not steps:
        raise InvalidArgument("chain() needs at least one step")
    return Chain(tuple(_check(s) for s in steps))


def group(members: Iterable[Flow]) -> Group:
    ms = tuple(_check(m) for m in members)
    if not ms:
        raise InvalidArgument("group() needs at least one member")
    return Group(ms)


def chord(header: Group | Iterable[Flow], callback: Flow) -> Chord:
    return Chord(header if isinstance(header, Group) else group(header), _check(callback))


def _check(x: Any) -> Flow:
    if not isinstance(x, (JobSpec, Chain, Group, Chord)):
        raise InvalidArgument(f"a flow node must be a JobSpec, chain, group or chord, got"
                              f" {type(x).__name__} (typed tasks: task.spec(...))")
    return x


@attrs.frozen
class FlowResult:
    """What ``enqueue_flow`` wrote: every node, in the order the flow names them."""

    refs: list[JobRef]
    results: list[EnqueueResult]

    @property
    def job_ids(self) -> list[str]:
        return [r.job_id for r in self.refs]

    @property
    def last(self) -> JobRef:
        """The node the flow ends with (a chain's last step, a chord's callback)."""
        return self.refs[-1]


@attrs.frozen
class _Node:
    ref: JobRef
    spec: JobSpec
    deps: list[JobRef]


def compile_flow(flow: Flow, queue: str, flow_id: str) -> list[_Node]:
    """The nodes of a flow with their dependencies, in the order the flow names them; a node
    without a job id gets '<flow_id>.<n>' (n: its place in that order)."""
    nodes: list[_Node] = []

    def build(x: Flow, ins: list[JobRef]) -> list[JobRef]:
        if isinstance(x, JobSpec):
            ref = JobRef(x.queue or queue, x.job_id or f"{flow_id}.{len(nodes)}")
            nodes.append(_Node(ref, x, list(ins)))
            return [ref]
        if isinstance(x, Chain):
            out = ins
            for s in x.steps:
                out = build(s, out)
            return out
        if isinstance(x, Group):
            return [r for m in x.members for r in build(m, ins)]
        return build(x.body, build(x.header, ins))

    build(_check(flow), [])
    seen = {(n.ref.queue, n.ref.job_id) for n in nodes}
    if len(seen) != len(nodes):
        raise InvalidArgument("a flow names the same job twice")
    return nodes


def _prepared(keys: Keys, cfg: QueueConfig, job_type: str, payload: Any,
              options: Mapping[str, Any], waiting: bool) -> tuple[prod.Prepared, int]:
    opts = dict(options)
    if opts.get("group") is not None or opts.get("dedup") is not None:
        raise InvalidArgument("a job with dependencies cannot have a group or a dedup key yet")
    if waiting:
        opts["headers"] = {**(opts.get("headers") or {}), DEPS_HEADER: "1"}
    p = prod.prepare(keys, cfg, job_type, payload, **opts)
    return p, p.level


def wait_call(keys: Keys, cfg: QueueConfig, p: prod.Prepared, deps: Sequence[JobRef]) -> Call:
    """wait.lua's call for a prepared job and its dependencies."""
    jid = p.job_id
    jk = keys.of_shard(p.shard)
    a = p.args  # id, options, body, max_attempts, ttl, deadline, delay, run_at, notify
    ix_keys, ix_args = search.parts(jk, cfg, [p]) if cfg.search is not None else ([], [])
    return Call("wait", [jk.job(jid), jk.deps(jid), jk.waiting, jk.events, jk.stats, *ix_keys],
                [jid, a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                 "" if p.level == DEFAULT_PRIORITY else p.level,
                 wk_of(jk, jid, p.level, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                       cfg.handoff),
                 cfg.events_arg, p.routed, *(member(d, i) for i, d in enumerate(deps)),
                 *ix_args])


def _waited(cfg: QueueConfig, jid: str, reply: Any) -> tuple[EnqueueResult, bool]:
    """wait.lua's answer, and whether the caller links the edges (a new job, or this very
    job written by an earlier try)."""
    v = ok(reply)
    if (v[0].decode() if isinstance(v[0], bytes) else v[0]) == "waiting":
        return EnqueueResult(jid, "waiting", "waiting"), True
    state = v[1].decode()
    res = cfg.serde.loads(v[2]) if v[2] else None
    err = cfg.serde.loads(v[3]) if v[3] else None
    return EnqueueResult(jid, "duplicate", state, res, err), int(v[4]) == 1


def enqueue_waiting(keys: Keys, cfg: QueueConfig, job_type: str, payload: Any,
                    options: dict[str, Any], layout: Layout | None = None
                    ) -> Op[EnqueueResult]:
    """``enqueue(job_type, payload, depends_on=[...], **options)``. ``layout``: the queue's;
    with earlier shard counts (``Layout.prev``), an id that moved home in a reshard is looked
    for in its old homes first (found: a duplicate, nothing written), and each dependency is
    linked in the shard that holds it (one written before a reshard may be in its home under
    an earlier count, ``locate_refs``)."""
    deps = refs(keys.queue, options.pop("depends_on"))
    p, _ = _prepared(keys, cfg, job_type, payload, options, True)
    if layout is not None and layout.prev:
        found = yield from _old_homes(keys, cfg, layout.prev, [p])
        if found:
            return found[0]
    (r,) = yield [wait_call(keys, cfg, p, deps)]
    result, mine = _waited(cfg, p.job_id, r)
    if mine:
        lays = yield from read_layouts(keys.prefix, (d.queue for d in deps),
                                       {keys.queue: layout or Layout(cfg.shards)})
        at = yield from locate_refs(keys.prefix, lays, [(d.queue, d.job_id) for d in deps])
        pkey = keys.of_shard(p.shard).job(p.job_id)
        yield from link([link_at(keys.prefix, s, pkey, p.job_id, d, i)
                         for i, (d, s) in enumerate(zip(deps, at, strict=True))])
    return result


def _old_homes(keys: Keys, cfg: QueueConfig, prev: tuple[int, ...],
               nodes: Sequence[prod.Prepared], waiting: Sequence[bool] | None = None
               ) -> Op[dict[int, EnqueueResult]]:
    """The nodes (by index) found in their old homes after a reshard (relayout.look: one
    step, none when no id moved), answered as a repeat of the flow is: a waiting node (all
    of them when ``waiting`` is None) 'duplicate', a leaf this very flow wrote 'queued'."""
    from . import relayout  # (relayout imports prepare, as this module does)

    found = yield from relayout.look(keys, cfg, Layout(cfg.shards, prev), nodes, True)
    return {i: EnqueueResult(r.job_id, "duplicate", r.state, r.result, r.error)
            if (waiting is None or waiting[i]) and r.status != "duplicate" else r
            for i, r in found.items()}


def enqueue_flow(keys: Keys, cfg: QueueConfig, flow: Flow, flow_id: str,
                 layout: Layout | None = None) -> Op[FlowResult]:
    """Every node of a flow: waiting ones, then the ones without dependencies, then edges.
    ``layout``: see ``enqueue_waiting`` (the nodes of this queue are looked for in their old
    homes). An edge to a node written now is linked in the shard it was written to; one to a
    node that was there before (a repeat of the flow, possibly from before a reshard) in the
    shard that holds it (``locate_refs``)."""
    prev = layout.prev if layout is not None else ()
    nodes = compile_flow(flow, keys.queue, flow_id)
    sh = yield from shard_counts(keys.prefix, (n.ref.queue for n in nodes),
                                 {keys.queue: cfg.shards})
    cfgs = {q: cfg if q == keys.queue else attrs.evolve(cfg, shards=n) for q, n in sh.items()}
    qkeys = {q: keys if q == keys.queue else Keys(q, keys.prefix) for q in sh}
    preps = [_prepared(qkeys[n.ref.queue], cfgs[n.ref.queue], n.spec.type, n.spec.payload,
                       {**n.spec.options, "job_id": n.ref.job_id}, bool(n.deps))[0]
             for n in nodes]
    results: list[EnqueueResult | None] = [None] * len(nodes)
    if prev:  # a repeat after a reshard: this queue's nodes written before it are kept
        own = [i for i, n in enumerate(nodes) if n.ref.queue == keys.queue]
        found = yield from _old_homes(keys, cfg, prev, [preps[i] for i in own],
                                      [bool(nodes[i].deps) for i in own])
        for j, res in found.items():
            results[own[j]] = res
    relink: list[int] = []
    waits = [i for i, n in enumerate(nodes) if n.deps and results[i] is None]
    if waits:
        r = yield [wait_call(qkeys[nodes[i].ref.queue], cfgs[nodes[i].ref.queue], preps[i],
                             nodes[i].deps) for i in waits]
        for i, v in zip(waits, r, strict=True):
            results[i], mine = _waited(cfgs[nodes[i].ref.queue], preps[i].job_id, v)
            if mine:
                relink.append(i)
    leaves: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        if not n.deps and results[i] is None:
            leaves.setdefault(n.ref.queue, []).append(i)
    for q, idx in leaves.items():
        batch = [preps[i] for i in idx]
        chunks = prod.chunks(batch)
        calls: list[Cmd | Call] = [Call("enqueue", *prod.enqueue_call(qkeys[q], cfgs[q], c))
                                   for c in chunks]
        replies = yield calls
        flat = [res for c, v in zip(chunks, replies, strict=True)
                for res in prod.parse_enqueue(cfgs[q], c, ok(v), retried=True)]
        for i, res in zip(idx, prod.in_order(batch, chunks, flat), strict=True):
            results[i] = res
    # where each node's record is: written now -> its shard; a duplicate -> located
    at = {(n.ref.queue, n.ref.job_id): preps[i].shard for i, (n, res) in
          enumerate(zip(nodes, results, strict=True))
          if res is not None and res.status != "duplicate"}
    ask = sorted({(d.queue, d.job_id) for i in relink for d in nodes[i].deps} - at.keys())
    if ask:
        lays = yield from read_layouts(keys.prefix, (q for q, _ in ask),
                                       {keys.queue: layout or Layout(cfg.shards)}, sh)
        at.update(zip(ask, (yield from locate_refs(keys.prefix, lays, ask)), strict=True))
    links: list[Call] = []
    for i in relink:
        n = nodes[i]
        pk = qkeys[n.ref.queue].of_shard(preps[i].shard).job(n.ref.job_id)
        links.extend(link_at(keys.prefix, at[(d.queue, d.job_id)], pk, n.ref.job_id, d, j)
                     for j, d in enumerate(n.deps))
    yield from link(links)
    return FlowResult([n.ref for n in nodes], [r for r in results if r is not None])


def add_children(keys: Keys, cfg: QueueConfig, parent_id: str, specs: Sequence[JobSpec],
                 policy: str, call_id: str, layout: Layout | None = None
                 ) -> Op[list[JobRef]]:
    """``Queue.add_children``: the running job ``parent_id`` takes ``specs`` as children
    (docs/workflows.md#dynamic-children). Its edges first (adopt.lua, in its slot), then the
    children (as ``enqueue_flow`` writes a group), then every edge in each child's slot
    (link_many.lua; one already ended is resolved at once: recorded on the running job)."""
    specs = list(specs)
    if not specs or not all(isinstance(s, JobSpec) for s in specs):
        raise InvalidArgument("add_children takes a non-empty list of JobSpec")
    if policy not in ("fail", "continue", "ignore", "remove"):
        raise InvalidArgument(f"policy must be fail, continue, ignore or remove, got"
                              f" {policy!r}")
    flow_id = f"{parent_id}.{call_id}"
    nodes = compile_flow(Group(tuple(specs)), keys.queue, flow_id)
    kids = [JobRef(n.ref.queue, n.ref.job_id, policy) for n in nodes]  # type: ignore[arg-type]
    layout = layout or Layout(cfg.shards)
    pk = yield from locate(keys, layout, parent_id)  # (written before a reshard: an old home)
    (lv,) = yield [Cmd.of("HGET", pk.job(parent_id), "p")]
    level = int(ok(lv) or DEFAULT_PRIORITY)
    (r,) = yield [Call("adopt", [pk.job(parent_id), pk.deps(parent_id),
                                 pk.dep_results(parent_id)],
                       [call_id, wk_of(pk, parent_id, level, cfg.events_arg, cfg.dead_ttl_s,
                                       cfg.dead_maxlen, cfg.handoff),
                        *(f"{member(k, 0)[0]} {k.queue} {k.job_id}" for k in kids)])]
    code = ok(r)[0]
    code = code.decode() if isinstance(code, bytes) else str(code)
    if code != "ok":
        why = "it is in a group" if code == "grouped" else \
            f"it is {(ok(r)[1] or b'').decode() or 'not found'}, not running"
        raise InvalidArgument(f"job {parent_id!r} cannot take children: {why}")
    base = int(ok(r)[1])
    yield from enqueue_flow(keys, cfg, Group(tuple(specs)), flow_id, layout)
    lays = yield from read_layouts(keys.prefix, (k.queue for k in kids), {keys.queue: layout})
    at = yield from locate_refs(keys.prefix, lays, [(k.queue, k.job_id) for k in kids])
    yield from link([link_at(keys.prefix, s, pk.job(parent_id), parent_id, k, base + i)
                     for i, (k, s) in enumerate(zip(kids, at, strict=True))])
    return kids


def written(out: Any) -> tuple[list[str], list[EnqueueResult]]:
    """The job ids (and EnqueueResults, where the operation has them) that a workflow
    operation wrote: what a ReplicationTimeout names (``QueueConfig.min_replicas``)."""
    if isinstance(out, FlowResult):
        return out.job_ids, out.results
    if isinstance(out, EnqueueResult):
        return [out.job_id], [out]
    if isinstance(out, dict):  # a batch's callbacks: kind -> job id
        return [str(v) for v in out.values()], []
    if isinstance(out, list):  # add_children: JobRefs
        return [r.job_id for r in out if isinstance(r, JobRef)], []
    return [], []

