"""The server each client talks to, detected once (``_core/serverinfo.py``), and the paths that
depend on it: CLUSTER SLOT-STATS for the per-shard view of a sharded queue on a cluster
(Valkey 8.0+, Redis 8.2+) with CLUSTER COUNTKEYSINSLOT as the fallback.

The suite runs against Redis 7.0 (the fallback runs), Valkey 8.1 (the new path runs) and,
outside CI, Valkey 9.1 and Redis 7.4 (``make test-valkey9``, ``make test-redis74``); the
fallback is also forced on any server (``assume(client, UNKNOWN)``), so both paths run in
every leg. An ACL user without INFO gets the oldest paths.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from streamq import Queue, QueueConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import async_client, sync_client
from streamq._core.keys import shard_keys
from streamq._core.server import RedisServer
from streamq._core.serverinfo import (
    UNKNOWN,
    ServerInfo,
    adetect,
    assume,
    cached,
    detect,
    forget,
    oldest,
    parse,
)
from streamq._ops.slots import COUNTKEYS, SLOT_STATS
from streamq.admin import Admin, AsyncAdmin

REDIS_70 = ("# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n"
            "redis_mode:standalone\r\n")
VALKEY_81 = {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.8",
             "valkey_release_stage": "ga", "redis_mode": "standalone"}
VALKEY_91 = {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.1.2"}
REDIS_74 = {"redis_version": "7.4.1", "redis_mode": "standalone"}
REDIS_82 = {"redis_version": "8.2.1", "redis_mode": "cluster"}


def on_valkey() -> bool:
    return "valkey" in os.environ.get("STREAMQ_REDIS_SERVER", "")


def test_parse_names_the_server_and_its_paths() -> None:
    r70, v81, v91, r82 = (parse(x) for x in (REDIS_70, VALKEY_81, VALKEY_91, REDIS_82))
    assert (r70.name, r70.version) == ("redis", (7, 0, 15))
    r74 = parse(REDIS_74)  # HEXPIRE but no HSETEX, no SLOT-STATS: every fallback
    assert r74.version == (7, 4, 1) and not any(r74.features().values())
    assert (v81.name, v81.version) == ("valkey", (8, 1, 8))  # not its redis_version 7.2.4
    assert (v91.name, v91.version) == ("valkey", (9, 1, 2))
    assert [i.slot_stats for i in (r70, v81, v91, r82)] == [False, True, True, True]
    assert [i.hash_field_ttl for i in (r70, v81, v91, r82)] == [False, False, True, True]
    assert [i.xackdel for i in (r70, v81, v91, r82)] == [False, False, False, True]
    assert parse(REDIS_70.encode()) == r70
    assert v81.describe() == "valkey 8.1.8"
    assert parse({}) is UNKNOWN and parse("no version here") is UNKNOWN
    assert parse({"redis_version": "garbage"}) is UNKNOWN
    assert not any(UNKNOWN.features().values())


def test_a_cluster_takes_a_path_only_when_every_node_has_it() -> None:
    v80, v81 = ServerInfo("valkey", (8, 0, 2)), ServerInfo("valkey", (8, 1, 8))
    assert oldest([v81, v80]) == v80
    assert oldest([v81, UNKNOWN]) is UNKNOWN
    mixed = oldest([v81, ServerInfo("redis", (8, 2, 0))])
    assert mixed.name == "mixed" and not any(mixed.features().values())
    assert oldest([]) is UNKNOWN


def test_detect_asks_once_per_client(redis_server: RedisServer) -> None:
    client = redis.Redis(port=redis_server.port, protocol=2)
    try:
        assert cached(client) is None
        info = detect(client)
        assert info.detected and info.name == ("valkey" if on_valkey() else "redis")
        assert info == parse(client.info("server"))
        assert detect(client) is info  # cached: no second INFO
        if on_valkey():
            assert info.slot_stats
        assume(client, UNKNOWN)
        assert detect(client) is UNKNOWN
        forget(client)
        assert detect(client) == info
    finally:
        client.close()


def test_detected_paths_match_the_commands_the_server_has(r: redis.Redis) -> None:
    """Each newer path is detected exactly where the running server has its commands, on any
    leg: Redis 7.0, Redis 7.4 (HEXPIRE without HSETEX: no hash-field TTL path), Valkey 8.1
    and 9.1. A version bound named too early or too late in ``serverinfo`` fails here."""
    client: Any = r  # execute_command is untyped

    def has(*names: str) -> bool:
        # "COMMAND INFO" as one word: redis-py's COMMAND callback cannot parse a nil entry
        return all(entry is not None for entry in client.execute_command("COMMAND INFO", *names))

    info = detect(r)
    assert info.detected
    assert info.slot_stats == has("cluster|slot-stats")
    assert info.hash_field_ttl == has("hexpire", "hsetex")
    assert info.xackdel == has("xackdel")


async def test_adetect_matches_detect(redis_server: RedisServer) -> None:
    client = async_client(redis_server.url)
    try:
        plain = redis.Redis(port=redis_server.port, protocol=2)
        assert await adetect(client) == detect(plain)
        plain.close()
    finally:
        await client.aclose()


@pytest.fixture
def no_info_user(redis_server: RedisServer, r: redis.Redis) -> Iterator[str]:
    user = f"noinfo-{uuid.uuid4().hex[:8]}"
    r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["~*"],
                  commands=["+@all", "-info"])
    yield f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0"
    r.acl_deluser(user)


def test_info_refused_means_the_oldest_paths(no_info_user: str) -> None:
    client = sync_client(no_info_user)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.info("server")
        info = detect(client)
        assert info is UNKNOWN and not info.detected and not info.slot_stats
        assert "INFO refused" in info.describe()
        admin = Admin(client)
        assert admin.server() is UNKNOWN
    finally:
        client.close()


def test_one_server_has_no_slot_view(url: str) -> None:
    name = f"sv-{uuid.uuid4().hex[:8]}"
    cfg = QueueConfig(shards=3)
    with Queue.from_url(url, name, cfg) as q:
        q.enqueue("t", {})
    admin = Admin.from_url(url, cfg)
    try:
        assert admin.shard_slots(name) == []
    finally:
        admin.close()


# ------------------------------------------------------------------------------ on a cluster


def fresh(cluster: ClusterServer, shards: int) -> str:
    """A queue whose shards sit on every primary, in slots that hold no key yet (the cluster
    is shared with the session's other tests: a slot per-slot counts read must be this
    queue's alone, or they count another test's keys that SCAN by this queue's tag does not)."""
    while True:
        name = f"sv-{uuid.uuid4().hex[:10]}"
        keys = shard_keys(name, shards)
        if len({cluster.owner(k.stream) for k in keys}) == min(shards, 3) and all(
                _slot_empty(cluster, k.stream) for k in keys):
            return name


def _slot_empty(cluster: ClusterServer, key: str) -> bool:
    node: Any = cluster.node(cluster.owner(key))
    try:
        return int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(key.encode()))) == 0
    finally:
        node.close()


def filled(cluster: ClusterServer, shards: int, jobs: int) -> tuple[str, QueueConfig]:
    name, cfg = fresh(cluster, shards), QueueConfig(shards=shards)
    with Queue.from_url(cluster.url, name, cfg) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(jobs)])
    return name, cfg


def expected_keys(cluster: ClusterServer, name: str, shards: int) -> dict[int, int]:
    """Each shard's keys, counted by SCAN on the node that owns them (no slot command)."""
    out: dict[int, int] = {}
    for k in shard_keys(name, shards):
        node = cluster.node(cluster.owner(k.stream))
        try:
            out[k.shard] = sum(1 for _ in node.scan_iter(match=f"*{{{k.shard_tag}}}*",
                                                         count=1000))
        finally:
            node.close()
    return out


@pytest.fixture
def slot_stats_on(redis_cluster: ClusterServer) -> Iterator[bool]:
    """``cluster-slot-stats-enabled yes`` on every primary where the server has it (restored
    after); False where it does not (Redis 7.0)."""
    nodes = [redis_cluster.node(p) for p in redis_cluster.ports]
    try:
        try:
            for n in nodes:
                n.config_set("cluster-slot-stats-enabled", "yes")
            enabled = True
        except redis.ResponseError:
            enabled = False
        yield enabled
        if enabled:
            for n in nodes:
                n.config_set("cluster-slot-stats-enabled", "no")
    finally:
        for n in nodes:
            n.close()


@pytest.mark.cluster
def test_shard_slots_new_path_and_fallback_agree(redis_cluster: ClusterServer,
                                                 slot_stats_on: bool) -> None:
    name, cfg = filled(redis_cluster, 3, 30)
    want = expected_keys(redis_cluster, name, 3)
    primaries = {f"127.0.0.1:{redis_cluster.owner(k.stream)}" for k in shard_keys(name, 3)}
    admin = Admin.from_url(redis_cluster.url, cfg)
    try:
        info = admin.server()
        assert info.detected
        if on_valkey():
            assert info.slot_stats and slot_stats_on  # the Valkey leg runs the new path
        rows = admin.shard_slots(name)
        assert [r.shard for r in rows] == [0, 1, 2]
        assert {r.node for r in rows} == primaries
        assert {r.shard: r.keys for r in rows} == want
        assert all(r.source == (SLOT_STATS if info.slot_stats else COUNTKEYS) for r in rows)
        if info.slot_stats and slot_stats_on:
            assert all(r.cpu_usec is not None and r.network_bytes_in is not None
                       and r.network_bytes_out is not None for r in rows)
            assert sum(r.cpu_usec or 0 for r in rows) > 0  # the enqueues ran in these slots
        if not info.slot_stats:
            assert all(r.cpu_usec is None for r in rows)
        assume(admin.client, UNKNOWN)  # the fallback, forced on any server
        old = admin.shard_slots(name)
        assert [(r.shard, r.slot, r.node, r.keys, r.source) for r in old] == [
            (r.shard, r.slot, r.node, r.keys, COUNTKEYS) for r in rows]
        assert all(r.cpu_usec is None and r.network_bytes_in is None for r in old)
    finally:
        admin.close()


@pytest.mark.cluster
async def test_async_shard_slots_both_paths(redis_cluster: ClusterServer) -> None:
    name, cfg = filled(redis_cluster, 3, 12)
    want = expected_keys(redis_cluster, name, 3)
    admin = AsyncAdmin.from_url(redis_cluster.url, cfg)
    try:
        info = await admin.server()
        rows = await admin.shard_slots(name)
        assert {r.shard: r.keys for r in rows} == want
        assert {r.source for r in rows} == {SLOT_STATS if info.slot_stats else COUNTKEYS}
        assume(admin.client, UNKNOWN)
        old = await admin.shard_slots(name)
        assert {r.shard: r.keys for r in old} == want and {r.source for r in old} == {COUNTKEYS}
    finally:
        await admin.close()


@pytest.mark.cluster
async def test_dashboard_shows_the_shards_of_a_cluster_queue(redis_cluster: ClusterServer
                                                            ) -> None:
    import httpx

    from streamq.dashboard import DashboardConfig, create_app

    name, cfg = filled(redis_cluster, 3, 9)
    for forced in (False, True):
        admin = AsyncAdmin.from_url(redis_cluster.url, cfg)
        if forced:
            assume(admin.client, UNKNOWN)  # the fallback on any server
        app = create_app(config=DashboardConfig(queues=(name,), queue_config=cfg),
                         admin=admin)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://dash") as c:
            page = await c.get("/queue", params={"q": name, "tab": "workers"})
            assert page.status_code == 200, page.text
            assert 'id="shard-slots"' in page.text
            sources: list[Any] = [s for s in (SLOT_STATS, COUNTKEYS)
                                  if f'data-source="{s}"' in page.text]
            assert len(sources) == 1 and page.text.count(f'data-source="{sources[0]}"') == 3
            if forced:
                assert sources == [COUNTKEYS] and "CLUSTER COUNTKEYSINSLOT" in page.text
            elif on_valkey():
                assert sources == [SLOT_STATS]
            ready = await c.get("/queue", params={"q": name, "tab": "ready"})
            assert 'id="shard-slots"' not in ready.text  # the workers tab only
        await admin.close()
