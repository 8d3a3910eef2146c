from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from streamq._core.cluster_server import ClusterServer
from streamq._core.server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private server shared by the session; tests isolate themselves by queue name."""
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private server of this test's own, AOF on (appendfsync always), for restarts."""
    server = RedisServer(aof=True).start()
    yield server
    server.close()


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def qname() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, protocol=2)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServer]:
    """A loopback Redis Cluster (3 primaries, 3 replicas) shared by the session; tests isolate
    themselves by queue name, and a test that fails a node over restores the roles."""
    cluster = ClusterServer(primaries=3, replicas=1).start()
    yield cluster
    cluster.close()


@pytest.fixture
def cluster_url(redis_cluster: ClusterServer) -> str:
    return redis_cluster.url
