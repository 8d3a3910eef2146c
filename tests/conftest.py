from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from streamq import Queue
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
def q(url: str, qname: str) -> Iterator[Queue]:
    """A queue of this test's own name (a module that needs another kind defines its own)."""
    queue = Queue.from_url(url, qname)
    yield queue
    queue.close()


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


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def where(request: pytest.FixtureRequest) -> Iterator[tuple[str, ClusterServer | None]]:
    """(url, cluster or None): the test runs twice, on the session's one server and on its
    Redis Cluster (marked ``cluster``)."""
    if request.param == "standalone":
        yield request.getfixturevalue("url"), None
    else:
        cluster: ClusterServer = request.getfixturevalue("redis_cluster")
        yield cluster.url, cluster


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for every test that needs one (a second builder in another
    file would get this one back from getOrCreate, with whatever settings came first)."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # local[2, 4]: 2 threads, and a failed task is tried up to 4 times, as on a cluster
    session = (SparkSession.builder.master("local[2,4]").appName("streamq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
