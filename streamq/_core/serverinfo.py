"""Which server a client talks to (Redis or Valkey, and its version), detected once per client.

``INFO server`` names it: Valkey 8+ answers ``server_name:valkey`` and ``valkey_version``
(its ``redis_version`` stays 7.2.4, the Redis API level it kept), Redis answers
``redis_version`` only. The answer is cached per client object (a weak reference: the cache
dies with the client), so a path that depends on it costs one INFO per client, not one per
call. On a cluster every primary is asked and the oldest answer wins (a rolling upgrade runs
old and new nodes side by side: a path is taken only when every node has it).

When INFO is refused (an ACL user without ``+info``) or its answer names no version, the
server counts as :data:`UNKNOWN`, which offers nothing newer: every caller takes the path
that works on the oldest supported server (Redis 6.2). A connection error is not an answer
(it is raised and nothing is cached: the next call asks again).

The newer paths (docs/scaling.md#server-versions):

* ``slot_stats``: ``CLUSTER SLOT-STATS`` (Valkey 8.0+, Redis 8.2+), one call per slot for
  its key count and, with ``cluster-slot-stats-enabled``, CPU and network use; the fallback
  is ``CLUSTER COUNTKEYSINSLOT``.
* ``hash_field_ttl``: ``HEXPIRE``/``HSETEX`` (Redis 7.4+ for HEXPIRE, 8.0+ for HSETEX;
  Valkey 9.0+): detected and reported, not used (docs/performance.md says why).
* ``xackdel``: ``XACKDEL`` (Redis 8.2+; no Valkey release has it): detected, not used.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from redis.exceptions import NoPermissionError, ResponseError

from .conn import is_cluster


@attrs.frozen
class ServerInfo:
    """A server's name and version, and the newer commands streamq may use on it."""

    name: str
    """``'redis'``, ``'valkey'``, ``'mixed'`` (a cluster of both) or ``'unknown'``."""
    version: tuple[int, ...]
    """``(8, 1, 8)``; ``()`` when unknown."""
    detected: bool = True
    """False when INFO was refused or named no version (then every newer path is off)."""

    def at_least(self, name: str, *version: int) -> bool:
        return self.name == name and self.version >= version

    @property
    def slot_stats(self) -> bool:
        """``CLUSTER SLOT-STATS``: Valkey 8.0+, Redis 8.2+."""
        return self.at_least("valkey", 8, 0) or self.at_least("redis", 8, 2)

    @property
    def hash_field_ttl(self) -> bool:
        """``HEXPIRE`` and ``HSETEX``: Redis 8.0+ (HEXPIRE alone since 7.4), Valkey 9.0+."""
        return self.at_least("valkey", 9, 0) or self.at_least("redis", 8, 0)

    @property
    def xackdel(self) -> bool:
        """``XACKDEL``: Redis 8.2+ (no Valkey release has it yet)."""
        return self.at_least("redis", 8, 2)

    def describe(self) -> str:
        """``'valkey 8.1.8'``; ``'unknown (INFO refused or without a version)'``."""
        if not self.detected:
            return f"{self.name} (INFO refused or without a version: the oldest paths)"
        return f"{self.name} {'.'.join(map(str, self.version))}"

    def features(self) -> dict[str, bool]:
        """Each newer path and whether this server offers it (for views and logs)."""
        return {"slot_stats": self.slot_stats, "hash_field_ttl": self.hash_field_ttl,
                "xackdel": self.xackdel}


UNKNOWN = ServerInfo("unknown", (), detected=False)
"""A server that did not say what it is: the oldest paths everywhere."""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _version(text: Any) -> tuple[int, ...]:
    out: list[int] = []
    for part in _s(text).strip().split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def parse(info: Mapping[Any, Any] | bytes | str) -> ServerInfo:
    """A :class:`ServerInfo` from an ``INFO server`` reply: redis-py's dict or the raw text."""
    if isinstance(info, (bytes, str)):
        fields: dict[str, Any] = {}
        for line in _s(info).splitlines():
            k, sep, v = line.partition(":")
            if sep and not line.startswith("#"):
                fields[k.strip()] = v.strip()
    else:
        fields = {_s(k): v for k, v in info.items()}
    name = _s(fields.get("server_name") or "").strip().lower()
    if name == "valkey" or "valkey_version" in fields:
        version = _version(fields.get("valkey_version", ""))
        return ServerInfo("valkey", version) if version else UNKNOWN
    version = _version(fields.get("redis_version", ""))
    return ServerInfo(name or "redis", version) if version else UNKNOWN


def oldest(infos: Iterable[ServerInfo]) -> ServerInfo:
    """The one answer for several nodes: the oldest version of one server kind; ``mixed``
    (nothing newer) for Redis and Valkey nodes together; UNKNOWN if any node is unknown."""
    got = list(infos)
    if not got or any(not i.detected for i in got):
        return UNKNOWN
    if len({i.name for i in got}) > 1:
        return ServerInfo("mixed", min(i.version for i in got))
    return min(got, key=lambda i: i.version)


_CACHE: weakref.WeakKeyDictionary[Any, ServerInfo] = weakref.WeakKeyDictionary()


def assume(client: Any, info: ServerInfo) -> None:
    """Use ``info`` for ``client`` from now on without asking it (tests force the fallback
    paths with ``assume(client, UNKNOWN)``; an operator who knows better can too)."""
    _CACHE[client] = info


def forget(client: Any) -> None:
    """Ask again on the next :func:`detect` (after the server was upgraded in place)."""
    _CACHE.pop(client, None)


def cached(client: Any) -> ServerInfo | None:
    return _CACHE.get(client)


def _from_reply(client: Any, reply: Any) -> ServerInfo:
    if is_cluster(client):  # {node name: INFO dict} from every primary asked
        replies = reply.values() if isinstance(reply, dict) and all(
            isinstance(v, dict) for v in reply.values()) else [reply]
        return oldest(parse(r) for r in replies)
    return parse(reply)


def detect(client: Any) -> ServerInfo:
    """The server behind a blocking client (cached per client)."""
    found = _CACHE.get(client)
    if found is not None:
        return found
    try:
        if is_cluster(client):
            reply = client.execute_command("INFO", "server",
                                           target_nodes=client.get_primaries())
        else:
            reply = client.info("server")
        found = _from_reply(client, reply)
    except (NoPermissionError, ResponseError):  # refused by ACL, or INFO renamed away
        found = UNKNOWN
    _CACHE[client] = found
    return found


async def adetect(client: Any) -> ServerInfo:
    """:func:`detect` for an asyncio client."""
    found = _CACHE.get(client)
    if found is not None:
        return found
    try:
        if is_cluster(client):
            await client.initialize()  # the slot map (and so the primaries), once
            reply = await client.execute_command("INFO", "server",
                                                 target_nodes=client.get_primaries())
        else:
            reply = await client.info("server")
        found = _from_reply(client, reply)
    except (NoPermissionError, ResponseError):  # refused by ACL, or INFO renamed away
        found = UNKNOWN
    _CACHE[client] = found
    return found
