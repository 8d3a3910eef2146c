"""A registry module for the CLI tests (`streamq worker cli_jobs:registry`)."""

from __future__ import annotations

from streamq import Job, Registry

registry = Registry()
not_a_registry = {"type": "dict"}


@registry.handler("echo")
async def echo(job: Job) -> object:
    return job.payload
