"""What type checkers see of lifecycle hooks and the worker context (checked by mypy: pyproject's
[tool.mypy] files). A refused call carries `# type: ignore[...]`."""

from __future__ import annotations

from typing import Any, assert_type

from streamq import Context, Job, Registry

registry = Registry()


class Pool:
    def size(self) -> int:
        return 1


@registry.on_startup
async def open_pool(ctx: Context) -> None:
    ctx.pool = Pool()


@registry.on_shutdown
def close_pool(ctx: Context) -> None:
    ctx.pop("pool", None)


assert_type(close_pool(Context()), None)  # the decorators keep the function as it is


@registry.handler("count", retry_on=(ConnectionError, TimeoutError), fail_on=KeyError)
def count(job: Job) -> int:
    assert_type(job.ctx, Context)
    assert_type(job.ctx.get_as("pool", Pool), Pool)
    assert_type(job.ctx.pool, Any)  # attribute access is untyped; get_as is the typed way
    return job.ctx.get_as("pool", Pool).size()


registry.on_startup(lambda: None)  # type: ignore[type-var]  # a hook takes the context
registry.handler("bad", retry_on="ConnectionError")  # type: ignore[arg-type]
