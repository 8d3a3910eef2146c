"""Cancelling a job, shared by ``Queue.cancel`` and the admin API: cancel.lua's keys and
arguments, its reply, and ``wait_s`` (waiting until a running job's cancel settles)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import attrs

from .args import seconds
from .config import QueueConfig
from .keys import GROUP, Keys, check_job_id
from .model import TERMINAL, CancelResult
from .scripts import Arg


def cancel_call(keys: Keys, cfg: QueueConfig, job_id: str) -> tuple[list[str], list[Arg]]:
    """cancel.lua's keys and arguments. ``keys``: the keys of the shard that holds the job
    (``locate.locate``: after a reshard it may be its home under an earlier count)."""
    check_job_id(job_id)
    return ([keys.job(job_id), keys.stream, keys.delayed, keys.stats, keys.events,
             *keys.group_keys, keys.levels, *keys.level_streams],
            [GROUP, job_id, cfg.events_arg, keys.cancel_channel, cfg.group_arg])


def parse_cancel(job_id: str, reply: list[bytes], *, retried: bool) -> CancelResult:
    code, state = reply[0].decode(), reply[1].decode()
    if code == "cancelled":
        return CancelResult(job_id, True, state, code=code, final_state="cancelled")
    if code == "cancel_requested":
        return CancelResult(job_id, False, state, "job is running: its worker was asked to"
                            " stop it", code=code, final_state="active")
    if code == "not_found":
        return CancelResult(job_id, False, "", "job not found (never enqueued, or expired)",
                            code=code)
    if retried and state == "cancelled":
        return CancelResult(job_id, True, state, code="cancelled", final_state=state)
    return CancelResult(job_id, False, state, f"job is {state}; only waiting, scheduled, queued,"
                        " retrying or active jobs can be cancelled", code=code,
                        final_state=state)


def check_cancel_wait(wait_s: float | None) -> None:
    if wait_s is not None:
        seconds("wait_s", wait_s, allow_zero=True)


def cancel_settled(res: CancelResult, state: str) -> CancelResult | None:
    """The result of a cancel of a running job once it settled in ``state`` (``cancel(wait_s=)``),
    or None while it still runs ('' = its record is gone: expired or deleted)."""
    if state and state not in TERMINAL:
        return None
    if state == "cancelled":
        return attrs.evolve(res, cancelled=True, reason="", final_state=state)
    if not state:
        return attrs.evolve(res, reason="job finished and its record is gone (result_ttl=0:"
                            " it completed before the cancel reached it)", final_state="")
    return attrs.evolve(res, reason=f"job {state} before the cancel reached its handler",
                        final_state=state)


_CANCEL_POLL_S = 0.05


def wait_cancel(res: CancelResult, wait_s: float | None, state: Callable[[], str]
                ) -> CancelResult:
    """``cancel(wait_s=)`` of a running job: poll its state (``state()``; '' = no record)
    until it settles or ``wait_s`` passes."""
    if not wait_s or res.code != "cancel_requested":
        return res
    end = time.monotonic() + wait_s
    while True:
        now = state()
        done = cancel_settled(res, now)
        if done is not None:
            return done
        if time.monotonic() >= end:
            return attrs.evolve(res, final_state=now)
        time.sleep(min(_CANCEL_POLL_S, max(0.0, end - time.monotonic())))


async def await_cancel(res: CancelResult, wait_s: float | None,
                       state: Callable[[], Awaitable[str]]) -> CancelResult:
    """:func:`wait_cancel`, awaitable."""
    if not wait_s or res.code != "cancel_requested":
        return res
    end = time.monotonic() + wait_s
    while True:
        now = await state()
        done = cancel_settled(res, now)
        if done is not None:
            return done
        if time.monotonic() >= end:
            return attrs.evolve(res, final_state=now)
        await asyncio.sleep(min(_CANCEL_POLL_S, max(0.0, end - time.monotonic())))
