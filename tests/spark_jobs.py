"""Handlers for the Spark tests: image jobs whose id ends in 7 always fail."""

from __future__ import annotations

from streamq import Fail, Job, Registry

registry = Registry()


@registry.handler("image.process")
async def process(job: Job) -> int:
    if job.id.endswith("7"):
        raise Fail("corrupt image")
    return int(job.payload["size"])
