"""Cancelling a waiting job cancels its unstarted dependencies that no other job waits for
(docs/workflows.md#cancelling-a-flow), shared by ``Queue.cancel`` and the admin API.

cancel.lua ends a waiting job ``cancelled`` and keeps its pending SET (for an hour at most:
``CASCADE_KEEP_MS`` in _flow.lua's ``settled``). The caller then walks it (SSCAN, pages of
``PAGE``) and runs cancel.lua on each pending dependency in the dependency's own slot, in
cascade mode (its ARGV[6]: the cancelled job's member of the dependency's parents SET): the
member leaves the parents SET, and the dependency is cancelled only when that SET is then
empty and it has not started (waiting, scheduled, queued, retrying). A dependency cancelled
from ``waiting`` is walked the same way. The pending SET is deleted once walked.

Safe to repeat: a second walk finds members already gone from the parents SETs and jobs
already cancelled (``not_cancellable``); a caller that died half-way is finished by a repeat
of the cancel (its retry) while the SET is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cancel import cancel_call
from .config import QueueConfig
from .driver import Call, Cmd, Op, ok
from .keys import Keys
from .locate import locate_refs, read_layouts
from .shards import Layout

PAGE = 500
"""Pending dependencies read (and cancel calls sent) per round trip."""
MAX_NODES = 100_000
"""Dependencies one cancel walks at most (the rest stays in the kept pending SETs)."""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def cascade(keys: Keys, cfg: QueueConfig, job_id: str,
            known: Mapping[str, Layout] | None = None) -> Op[list[tuple[str, str]]]:
    """Walk a cancelled job's kept pending SET (see the module). ``keys``: the keys of the
    shard that holds the job (``locate``); ``known``: layouts already read, by queue (the
    others are read when a dependency of theirs is met: a dependency written before a
    reshard is found in its own shard, ``locate_refs``). Returns the (queue, job id) of
    each dependency this call cancelled."""
    todo = [(keys, job_id)]
    layouts = dict(known or {})
    done: list[tuple[str, str]] = []
    seen = 0
    while todo and seen < MAX_NODES:
        k, jid = todo.pop()
        (st,) = yield [Cmd.of("HGET", k.job(jid), "s")]
        if ok(st) != b"x":  # (only a cancelled job's pending SET is walked)
            continue
        cur = 0
        while True:
            (r,) = yield [Cmd.of("SSCAN", k.deps(jid), cur, "COUNT", PAGE)]
            nxt, members = ok(r)
            cur = int(nxt)
            edges: list[tuple[str, str, str]] = []
            for m in members:
                parts = _s(m).split(" ", 2)
                if len(parts) == 3:
                    edges.append((parts[1], parts[2], f"{parts[0]} {k.job(jid)} {jid}"))
            seen += len(edges)
            if edges:
                layouts = yield from read_layouts(keys.prefix, (e[0] for e in edges), layouts)
                shards = yield from locate_refs(keys.prefix, layouts,
                                                [(e[0], e[1]) for e in edges])
                calls: list[Cmd | Call] = []
                for (cq, cid, member), sh in zip(edges, shards, strict=True):
                    ks, args = cancel_call(Keys(cq, keys.prefix, sh), cfg, cid)
                    calls.append(Call("cancel", ks, [*args, member]))
                got = yield calls
                for (cq, cid, _m), sh, v in zip(edges, shards, got, strict=True):
                    code, was = (_s(x) for x in ok(v)[:2])
                    if code == "cancelled":
                        done.append((cq, cid))
                        if was == "waiting":
                            todo.append((Keys(cq, keys.prefix, sh), cid))
            if cur == 0 or seen >= MAX_NODES:
                break
        if cur == 0:
            yield [Cmd.of("DEL", k.deps(jid))]
    return done
