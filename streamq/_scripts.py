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


_pack: Any
try:  # hiredis packs a command in C, ~7x faster than redis-py's encoder on big script calls
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency; older ones lack it
    _pack = None


class Script:
    """One Lua script, addressed by its SHA1."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    @staticmethod
    def _plain(client: Any) -> bool:
        """A client we can pack for: one connection pool, no pinned connection (a
        RedisCluster client routes by slot itself)."""
        return (_pack is not None and getattr(client, "connection_pool", None) is not None
                and getattr(client, "connection", None) is None)

    def _evalsha(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        if not self._plain(client):
            return client.evalsha(self.sha, len(keys), *keys, *args)
        pool: Any = client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([_pack(("EVALSHA", self.sha, len(keys), *keys, *args))])
            return conn.read_response()
        except BaseException as exc:  # a broken or interrupted exchange: never reuse it
            if not isinstance(exc, ResponseError):
                conn.disconnect()
            raise
        finally:
            pool.release(conn)

    async def _aevalsha(self, client: aredis.Redis, keys: Sequence[str],
                        args: Sequence[Arg]) -> Any:
        if not self._plain(client):
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        pool: Any = client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(_pack(("EVALSHA", self.sha, len(keys), *keys,
                                                  *args)))
            return await conn.read_response()
        except BaseException as exc:  # a broken or cancelled exchange: never reuse it
            if not isinstance(exc, ResponseError):
                await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    def _packed(self, calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[bytes]:
        return [_pack(("EVALSHA", self.sha, len(k), *k, *a)) for k, a in calls]

    def run_many(self, client: redis.Redis,
                 calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[Any]:
        """Several calls of this script in one round trip (pipelined); replies in order.
        On NOSCRIPT (a restarted server) the script is loaded and the calls sent again."""
        if not self._plain(client):
            return [self(client, k, a) for k, a in calls]
        pool: Any = client.connection_pool
        for attempt in range(2):
            conn = pool.get_connection()
            try:
                conn.send_packed_command(self._packed(calls))
                return [conn.read_response() for _ in calls]
            except BaseException as exc:  # replies may be left unread: never reuse it
                conn.disconnect()
                if isinstance(exc, NoScriptError) and attempt == 0:
                    client.script_load(self.source)
                    continue
                if isinstance(exc, ResponseError):
                    raise ScriptError(f"{self.name}.lua failed: {exc}") from exc
                raise
            finally:
                pool.release(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_many_async(self, client: aredis.Redis,
                             calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[Any]:
        if not self._plain(client):
            return [await self.run_async(client, k, a) for k, a in calls]
        pool: Any = client.connection_pool
        for attempt in range(2):
            conn = await pool.get_connection()
            try:
                await conn.send_packed_command(b"".join(self._packed(calls)))
                return [await conn.read_response() for _ in calls]
            except BaseException as exc:
                await conn.disconnect()
                if isinstance(exc, NoScriptError) and attempt == 0:
                    await client.script_load(self.source)
                    continue
                if isinstance(exc, ResponseError):
                    raise ScriptError(f"{self.name}.lua failed: {exc}") from exc
                raise
            finally:
                await pool.release(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            try:
                return self._evalsha(client, keys, args)
            except NoScriptError:  # a restarted server lost its script cache
                client.script_load(self.source)
                return self._evalsha(client, keys, args)
        except ResponseError as exc:
            raise ScriptError(f"{self.name}.lua failed: {exc}") from exc

    async def run_async(
        self, client: aredis.Redis, keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        try:
            try:
                return await self._aevalsha(client, keys, args)
            except NoScriptError:
                await client.script_load(self.source)
                return await self._aevalsha(client, keys, args)
        except ResponseError as exc:
            raise ScriptError(f"{self.name}.lua failed: {exc}") from exc


def _load() -> dict[str, Script]:
    pkg = resources.files("streamq") / "lua"
    lib = (pkg / "_lib.lua").read_text()
    return {n: Script(n, lib + "\n" + (pkg / f"{n}.lua").read_text()) for n in _NAMES}


SCRIPTS = _load()
