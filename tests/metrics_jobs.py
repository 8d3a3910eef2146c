"""A registry module for the metrics tests (`streamq worker metrics_jobs:registry`)."""

from __future__ import annotations

import redis.asyncio as aredis

from streamq import Fail, Job, Registry

registry = Registry()


@registry.handler("ok")
async def ok(job: Job) -> None:
    return None


@registry.handler("bad")
async def bad(job: Job) -> None:
    raise Fail("no such address")


@registry.handler("hold")
async def hold(job: Job) -> None:
    """Runs until something is pushed to the list named in the payload (an in-flight job for
    the gauge)."""
    client = aredis.Redis.from_url(job.payload["url"])
    try:
        await client.blpop([job.payload["key"]], timeout=60)
    finally:
        await client.aclose()
