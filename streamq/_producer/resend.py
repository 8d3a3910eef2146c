"""The I/O side of relayout.py's :class:`relayout.Send`: enqueue.lua calls over a blocking or an
asyncio client, each call's outcome kept (a shard's refusal is an outcome, not an error)."""

from __future__ import annotations

from typing import Any

from .._core import durable
from .._core.config import QueueConfig
from .._core.keys import Keys
from .._core.retry import acall, aeach, call, each, layout_changed
from .._core.scripts import SCRIPTS
from . import prepare as prod
from .relayout import Outcome, Send, mark_retry


def lone(client: Any, keys: Keys, cfg: QueueConfig, barrier: str, need: Send
         ) -> list[Outcome]:
    """Each call of ``need`` in turn (the self-batching producer's path); an error other
    than a layout refusal is raised."""
    outs: list[Outcome] = []
    for batch in need.batches:
        k, a = prod.enqueue_call(keys, cfg, batch, handoff=cfg.handoff)

        last = [need.retried]

        def once(retried: bool, b: Any = batch, k: Any = k, a: Any = a,
                 last: list[bool] = last) -> Any:
            last[0] = retried or need.retried
            (reply,), (n,) = durable.run(SCRIPTS["enqueue"], client, [(k, a)], cfg,
                                         barrier)  # min_replicas: WAIT
            return prod.parse_enqueue(cfg, b, reply, retried=retried or need.retried), n

        try:
            outs.append(call(once))
        except Exception as exc:
            if layout_changed(exc, keys.queue) is None:
                raise
            mark_retry(exc, last[0])
            outs.append(exc)
    return outs


async def alone(client: Any, keys: Keys, cfg: QueueConfig, barrier: str, need: Send
                ) -> list[Outcome]:
    """:func:`lone` over an asyncio client."""
    outs: list[Outcome] = []
    for batch in need.batches:
        k, a = prod.enqueue_call(keys, cfg, batch, handoff=cfg.handoff)

        last = [need.retried]

        async def once(retried: bool, b: Any = batch, k: Any = k, a: Any = a,
                       last: list[bool] = last) -> Any:
            last[0] = retried or need.retried
            (reply,), (n,) = await durable.arun(SCRIPTS["enqueue"], client, [(k, a)], cfg,
                                                barrier)  # + WAIT
            return prod.parse_enqueue(cfg, b, reply, retried=retried or need.retried), n

        try:
            outs.append(await acall(once))
        except Exception as exc:
            if layout_changed(exc, keys.queue) is None:
                raise
            mark_retry(exc, last[0])
            outs.append(exc)
    return outs


def many(client: Any, keys: Keys, cfg: QueueConfig, barrier: str, need: Send
         ) -> list[Outcome]:
    """The calls of ``need`` at once (enqueue_many's path): a failed node fails only its own
    calls (retried alone, then given to their jobs); min_replicas: a WAIT per node."""
    batches = need.batches
    calls = [prod.enqueue_call(keys, cfg, b, handoff=cfg.handoff) for b in batches]

    def once(todo: list[int], retried: bool) -> list[Outcome]:
        replies, acks = durable.run_each(SCRIPTS["enqueue"], client, [calls[i] for i in todo],
                                         cfg, barrier)
        return marked(prod.parsed_each(cfg, [batches[i] for i in todo], replies, acks,
                                       retried or need.retried), retried or need.retried)

    return each(once, len(calls))


async def amany(client: Any, keys: Keys, cfg: QueueConfig, barrier: str, need: Send
                ) -> list[Outcome]:
    """:func:`many` over an asyncio client."""
    batches = need.batches
    calls = [prod.enqueue_call(keys, cfg, b, handoff=cfg.handoff) for b in batches]

    async def once(todo: list[int], retried: bool) -> list[Outcome]:
        replies, acks = await durable.arun_each(SCRIPTS["enqueue"], client,
                                                [calls[i] for i in todo], cfg, barrier)
        return marked(prod.parsed_each(cfg, [batches[i] for i in todo], replies, acks,
                                       retried or need.retried), retried or need.retried)

    return await aeach(once, len(calls))


def marked(outs: list[Outcome], retried: bool) -> list[Outcome]:
    """The outcomes of one try, each error marked when the try was a retry (relayout.py's
    RETRIED: a refusal then may follow a try that wrote)."""
    for o in outs:
        if isinstance(o, Exception):
            mark_retry(o, retried)
    return outs
