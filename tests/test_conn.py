"""One connection module for every component: the URL forms, and the clear error when a URL's
form does not match the server it reaches (against a real redis-server)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from streamq import ConnectionSetupError, InvalidArgument
from streamq._core.conn import PROTOCOL, async_client, averify, parse, sync_client, verify


def test_url_forms_name_the_topology_the_hosts_and_the_options() -> None:
    t = parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7001?socket_timeout=3")
    assert (t.kind, t.nodes, dict(t.options)) == (
        "cluster", (("10.0.0.1", 7000), ("10.0.0.2", 7001)), {"socket_timeout": 3.0})
    t = parse("rediss+sentinel://ada:s3cret@s1:26379,s2/orders/2?sentinel_password=x")
    assert (t.kind, t.tls, t.service, t.nodes) == (
        "sentinel", True, "orders", (("s1", 26379), ("s2", 26379)))
    assert dict(t.options) == {"db": 2, "username": "ada", "password": "s3cret",
                               "sentinel_password": "x"}
    assert "s3cret" not in t.redacted()
    assert parse("unix:///run/redis.sock?db=1").kind == "standalone"
    assert parse("redis://localhost:6379/0").kind == "standalone"


@pytest.mark.parametrize(("url", "says"), [
    ("localhost:6379", "expected a Redis URL"),
    ("http://localhost", "unknown URL scheme 'http'"),
    ("redis+cluster://h:port", "is not a number"),
    ("redis+cluster://h:7000/3", "only database 0"),
    ("redis+sentinel://h:26379", "name the primary"),
    ("redis+sentinel://h:26379/p/x", "database 'x'"),
    ("redis+cluster://h:7000?no_such=1", "unknown option 'no_such'"),
    ("redis+cluster://h:7000?protocol=3", "RESP2"),
    ("redis://h:6379?protocol=3", "RESP2"),
    ("redis://h:6379?decode_responses=true", "raw bytes"),
])
def test_bad_urls_are_refused_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        sync_client(url)


def test_standalone_client_is_pinned_and_verifies(url: str) -> None:
    client: Any = sync_client(url)
    try:
        assert client.connection_pool.connection_kwargs["protocol"] == PROTOCOL
        assert client.get_retry().get_retries() == 0  # redis-py's own retries are off
        verify(client, url)
    finally:
        client.close()


def test_a_cluster_url_at_a_standalone_server_is_one_clear_error(url: str) -> None:
    host_port = url.split("//")[1].split("/")[0]
    with pytest.raises(ConnectionSetupError, match="standalone server, not a Redis Cluster"):
        sync_client(f"redis+cluster://{host_port}")


async def test_async_cluster_url_at_a_standalone_server_is_one_clear_error(url: str) -> None:
    host_port = url.split("//")[1].split("/")[0]
    client = async_client(f"redis+cluster://{host_port}")
    try:
        with pytest.raises(ConnectionSetupError, match="standalone server, not a Redis Cluster"):
            await averify(client, f"redis+cluster://{host_port}")
    finally:
        await client.aclose()


def test_an_unreachable_seed_is_a_connection_error_not_a_setup_error() -> None:
    from streamq._core.server import free_port

    with pytest.raises(redis.ConnectionError):
        sync_client(f"redis+cluster://127.0.0.1:{free_port()}?socket_connect_timeout=0.5")


def test_the_old_cluster_flag_means_the_cluster_form_of_one_nodes_url() -> None:
    from streamq._core.conn import as_cluster_url

    assert as_cluster_url("redis://10.0.0.1:7000") == "redis+cluster://10.0.0.1:7000"
    assert as_cluster_url("redis://10.0.0.1:7000/0") == "redis+cluster://10.0.0.1:7000"
    assert (as_cluster_url("rediss://ada:s3cret@h:7000?socket_timeout=2")
            == "rediss+cluster://ada:s3cret@h:7000?socket_timeout=2")
    assert as_cluster_url("redis+cluster://a:1,b:2") == "redis+cluster://a:1,b:2"
    for bad, says in [("redis://h:7000/3", "only database 0"),
                      ("unix:///run/redis.sock", "cannot name a Redis Cluster"),
                      ("redis+sentinel://s:26379/p", "cannot name a Redis Cluster")]:
        with pytest.raises(InvalidArgument, match=says):
            as_cluster_url(bad)


def test_each_command_is_routed_by_its_key() -> None:
    from streamq._core.nodes import key_of

    assert key_of(("EVALSHA", "abc", 2, "k1", "k2", "arg")) == "k1"
    assert key_of(("EVALSHA", "abc", 0, "arg")) is None
    assert key_of(("XINFO", "GROUPS", "s")) == "s"
    assert key_of(("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "STREAMS", "s", ">")) == "s"
    assert key_of(("TIME",)) is None and key_of((b"ECHO", "")) is None
    assert key_of(("HGETALL", "h")) == "h"
