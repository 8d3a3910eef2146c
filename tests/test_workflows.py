"""Workflows (docs/workflows.md): jobs that wait for others, on one server."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import streamq
from streamq import JobRef, JobSpec, Queue, Registry, chain, chord, group
from streamq._core.driver import drive
from streamq._core.flow import repair
from streamq._core.scripts import SCRIPTS

from helpers import eventually, running, state



def _reg(log: list[Any] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("add")
    def add(job: streamq.Job) -> Any:
        prev = job.previous_result() or 0
        if log is not None:
            log.append((job.id, [d.job_id for d in job.dependency_results()]))
        return prev + int(job.payload)

    @reg.handler("collect")
    def collect(job: streamq.Job) -> Any:
        return [(d.state, d.result) for d in job.dependency_results()]

    @reg.handler("boom")
    def boom(job: streamq.Job) -> Any:
        raise streamq.Fail("boom")

    return reg


async def test_chain_of_three_passes_results(url: str, q: Queue, qname: str) -> None:
    flow = chain(JobSpec("add", 1), JobSpec("add", 10), JobSpec("add", 100))
    out = q.enqueue_flow(flow, flow_id="c3")
    assert out.job_ids == ["c3.0", "c3.1", "c3.2"]
    assert [state(q, i) for i in out.job_ids] == ["queued", "waiting", "waiting"]
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "c3.2") == "completed", 30)
    assert q.result("c3.2") == 111
