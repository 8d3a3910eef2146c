"""What Queue and AsyncQueue share (sans-IO): the queue's keys, config and adopted layout,
the job-type check of ``require_handler``, and the helpers of the self-batching producer's
answers. The I/O of each flavour stays in queue.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from .._core import durable
from .._core import shards as _shards
from .._core.config import QueueConfig
from .._core.errors import LayoutChanged, ReplicationTimeout, UnknownJobType
from .._core.keys import Keys
from .._core.model import EnqueueResult, JobInfo
from .._core.retry import layout_changed
from . import prepare as prod
from . import relayout

Answer = EnqueueResult | ReplicationTimeout
"""An auto-batched enqueue's answer to one caller."""


def _shard(p: prod.Prepared) -> int:
    """A job's shard: the self-batching producer gathers each shard's jobs apart."""
    return p.shard


def _answered(answer: Answer) -> EnqueueResult:
    if isinstance(answer, ReplicationTimeout):
        raise answer
    return answer


def _counted(queue: str, answers: list[Answer]) -> list[Answer]:
    """Feed the enqueue metrics once for a gathered batch of single enqueues (a caller whose
    answer is a ReplicationTimeout is not counted: its call raises)."""
    prod.count(queue, [a for a in answers if not isinstance(a, ReplicationTimeout)])
    return answers


_TYPES_TTL_S = 30.0
"""With QueueConfig.require_handler: how long the published job types are cached."""


def unknown_job_type(queue: str, job_type: str, known: Iterable[str]) -> UnknownJobType:
    import difflib

    names = sorted(known)
    close = difflib.get_close_matches(job_type, names, n=3, cutoff=0.6)
    hint = ("did you mean " + " or ".join(repr(c) for c in close) + "?" if close else
            "registered: " + ", ".join(names[:20]) if names else
            "no worker of this queue has published its handlers yet")
    return UnknownJobType(f"no worker of queue {queue!r} has a handler for job type"
                          f" {job_type!r}; {hint}")


class _Base:
    def __init__(self, name: str, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self.keys = Keys(name, self.config.key_prefix)
        self.name = name
        self._noted = False
        """Added to the known queues (once per object, on the first enqueue)."""
        self._types: frozenset[str] = frozenset()
        self._types_at = -1e9
        self._barrier = self.keys.waiter_channel(durable.BARRIER_TAG)
        """With min_replicas: published before each WAIT (see durable.py)."""
        self._shards_checked = False
        """The stored shard count was compared with config.shards (once per object)."""
        self.layout = _shards.Layout(self.config.shards)
        """The queue's stored layout (shards.check_layout); jobs are routed by its count."""
        self._layout_at = 0.0

    def _adopt(self, layout: _shards.Layout) -> None:
        """Route by ``layout`` from now on: every routing path reads ``config.shards``."""
        self.layout = layout
        self._layout_at = time.monotonic()
        if layout.shards != self.config.shards:
            self.config = attrs.evolve(self.config, shards=layout.shards)

    def _following(self, prepared: Sequence[prod.Prepared]) -> relayout.Gen:
        return relayout.enqueue(self.keys, self.config, self.layout, prepared, bool(
            self.layout.prev) and time.monotonic() - self._layout_at > relayout.REREAD_S)

    def _sent(self, sent: relayout.Sent) -> list[EnqueueResult]:
        """A lone (auto-batched) enqueue's answer: the first error raised, else the results
        (ReplicationTimeout as ``durable.confirm`` says)."""
        self._adopt(sent[3])
        out = relayout.results(sent)
        durable.confirm(self.config, out, [o for o in sent[2] if not isinstance(o, Exception)])
        return out

    def _refused(self, exc: Exception) -> LayoutChanged:
        """A flow or batch call refused by a frozen shard (it wrote nothing): LayoutChanged,
        else ``exc`` raised. The caller re-reads the layout, so the next call follows it."""
        lc = layout_changed(exc, self.name)
        if lc is None:
            raise exc
        return lc

    def _unknown_types(self, job_types: Sequence[Any]) -> set[str]:
        """With ``require_handler``: the job types not in the cached published set."""
        if not self.config.require_handler:
            return set()
        wanted = {t for t in job_types if isinstance(t, str)} - self._types
        if wanted or time.monotonic() - self._types_at > _TYPES_TTL_S:
            return wanted or {""}
        return set()

    def _check_types(self, job_types: Sequence[Any], published: dict[str, int]) -> None:
        self._types, self._types_at = frozenset(published), time.monotonic()
        missing = sorted({t for t in job_types if isinstance(t, str)} - self._types)
        if missing:
            raise unknown_job_type(self.name, missing[0], self._types)




def _progressed(info: JobInfo, seen: list[Any], on_progress: Callable[[Any], None] | None
                ) -> None:
    if on_progress is not None and info.progress is not None and info.progress != seen[0]:
        seen[0] = info.progress
        on_progress(info.progress)
