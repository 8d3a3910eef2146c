"""The script registry: loads each ``lua/*.lua`` once, runs it with EVALSHA, falls back on NOSCRIPT.

``lua/_lib.lua`` (helper functions only) is prepended to every script, so shared logic such as
dead-lettering lives in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError, ResponseError

from ._errors import ScriptError

Arg = str | bytes | int | float

_NAMES = ("enqueue", "promote", "start", "finish", "renew", "release", "cancel", "heartbeat",
          "prune", "fire", "requeue", "redrive", "purge")


class Script:
    """One Lua script, addressed by its SHA1."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:  # a restarted server lost its script cache
                client.script_load(self.source)
                return client.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            raise ScriptError(f"{self.name}.lua failed: {exc}") from exc

    async def run_async(
        self, client: aredis.Redis, keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        try:
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                await client.script_load(self.source)
                return await client.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            raise ScriptError(f"{self.name}.lua failed: {exc}") from exc


def _load() -> dict[str, Script]:
    pkg = resources.files("streamq") / "lua"
    lib = (pkg / "_lib.lua").read_text()
    return {n: Script(n, lib + "\n" + (pkg / f"{n}.lua").read_text()) for n in _NAMES}


SCRIPTS = _load()
