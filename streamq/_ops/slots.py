"""Where a sharded queue's shards live on a Redis Cluster, and what each one costs there.

Each shard's keys share one hash tag (``{Q}``, ``{Q#1}``, …), so each shard is one slot on one
primary. On a server with ``CLUSTER SLOT-STATS`` (Valkey 8.0+, Redis 8.2+; detected by
``_core/serverinfo.py``) one call per slot answers the slot's key count and, when the nodes
run with ``cluster-slot-stats-enabled yes``, the CPU time (µs) and network bytes in and out
spent on that slot since the counters were last reset (``CONFIG RESETSTAT``). On older
servers, or when that call is refused, ``CLUSTER COUNTKEYSINSLOT`` answers the key count
alone. On one server there are no slots: the view is empty.

These are node-addressed calls (each goes to the primary that owns the slot), not key-routed
ones, so they run outside the sans-IO driver: one blocking and one asyncio version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from redis.exceptions import NoPermissionError, ResponseError

from .._core.conn import is_cluster
from .._core.keys import Keys
from .._core.nodes import slot_of
from .._core.serverinfo import ServerInfo, adetect, detect

SLOT_STATS = "slot-stats"
COUNTKEYS = "countkeysinslot"


@attrs.frozen
class ShardSlot:
    """One shard of a queue on a Redis Cluster: its slot, the primary that owns it, and what
    the server reports for that slot (None where it reports nothing)."""

    shard: int
    slot: int
    node: str
    """``host:port`` of the primary that owns the slot."""
    keys: int | None
    """Keys in the slot (every key of the shard, and any other key with the same tag)."""
    cpu_usec: int | None = None
    """CPU µs spent on the slot's commands (``cluster-slot-stats-enabled`` only)."""
    network_bytes_in: int | None = None
    network_bytes_out: int | None = None
    source: str = COUNTKEYS
    """``'slot-stats'`` (CLUSTER SLOT-STATS) or ``'countkeysinslot'`` (the fallback)."""


def _i(v: Any) -> int:
    return int(v.decode() if isinstance(v, bytes) else v)


def _stats(reply: Any, slot: int) -> dict[str, int]:
    """``[[slot, [name, value, …]], …]`` (RESP2) -> the named values of ``slot``."""
    for entry in reply or ():
        if _i(entry[0]) == slot:
            it = iter(entry[1])
            return {(k.decode() if isinstance(k, bytes) else str(k)): _i(v)
                    for k, v in zip(it, it, strict=True)}
    return {}


def _row(shard: int, slot: int, node: Any, stats: dict[str, int] | None, keys: Any
         ) -> ShardSlot:
    name = f"{node.host}:{node.port}"
    if stats is not None:
        return ShardSlot(shard, slot, name, stats.get("key-count", 0), stats.get("cpu-usec"),
                         stats.get("network-bytes-in"), stats.get("network-bytes-out"),
                         SLOT_STATS)
    return ShardSlot(shard, slot, name, None if keys is None else _i(keys), source=COUNTKEYS)


def _where(client: Any, parts: Sequence[Keys]) -> list[tuple[int, int, Any]]:
    out = []
    for k in parts:
        slot = slot_of(k.stream)
        out.append((k.shard, slot, client.nodes_manager.get_node_from_slot(slot)))
    return out


def shard_slots(client: Any, parts: Sequence[Keys]) -> list[ShardSlot]:
    """Each shard's slot view over a blocking client; ``[]`` on one server."""
    if not is_cluster(client):
        return []
    info: ServerInfo = detect(client)
    rows = []
    for shard, slot, node in _where(client, parts):
        stats: dict[str, int] | None = None
        if info.slot_stats:
            try:
                stats = _stats(client.execute_command("CLUSTER SLOT-STATS", "SLOTSRANGE", slot,
                                                      slot, target_nodes=node), slot)
            except (ResponseError, NoPermissionError):
                stats = None  # refused (ACL, renamed): the fallback
        keys = None
        if stats is None:
            try:
                keys = client.execute_command("CLUSTER COUNTKEYSINSLOT", slot,
                                              target_nodes=node)
            except (ResponseError, NoPermissionError):
                keys = None
        rows.append(_row(shard, slot, node, stats, keys))
    return rows


async def ashard_slots(client: Any, parts: Sequence[Keys]) -> list[ShardSlot]:
    """:func:`shard_slots` over an asyncio client."""
    if not is_cluster(client):
        return []
    await client.initialize()  # the slot map, once per client
    info: ServerInfo = await adetect(client)
    rows = []
    for shard, slot, node in _where(client, parts):
        stats: dict[str, int] | None = None
        if info.slot_stats:
            try:
                stats = _stats(await client.execute_command(
                    "CLUSTER SLOT-STATS", "SLOTSRANGE", slot, slot, target_nodes=node), slot)
            except (ResponseError, NoPermissionError):
                stats = None
        keys = None
        if stats is None:
            try:
                keys = await client.execute_command("CLUSTER COUNTKEYSINSLOT", slot,
                                                    target_nodes=node)
            except (ResponseError, NoPermissionError):
                keys = None
        rows.append(_row(shard, slot, node, stats, keys))
    return rows
