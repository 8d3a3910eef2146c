"""Handlers of the example app (``streamq worker myapp.tasks:registry``)."""

from __future__ import annotations

import logging

from streamq import Context, Job, Registry

log = logging.getLogger("myapp")
registry = Registry()


@registry.on_startup
def connect(ctx: Context) -> None:
    ctx.greeting = "hello"  # stands for a database pool or an HTTP client, built once


@registry.handler("greet")
async def greet(job: Job) -> str:
    return f"{job.ctx.greeting} {job.payload}"


@registry.handler("ping")
def ping(job: Job) -> None:
    log.info("ping %s", job.id)
