"""Every Redis client streamq uses is built here, from one URL form for all three topologies.

* ``redis://host:port/db``, ``rediss://…`` (TLS), ``unix:///path/to.sock?db=0``: one server.
* ``redis+cluster://host:port[,host:port…]`` (``rediss+cluster://`` for TLS): a Redis
  Cluster; the hosts are seed nodes (one is enough, more survive a seed that is down). The
  client learns the slot map, sends each key's commands and scripts to the node that owns its
  slot, and follows MOVED and ASK (a redirected command was not run, so following it is never
  a repeat).
* ``redis+sentinel://host:26379[,host:port…]/primary-name[/db]`` (``rediss+sentinel://``):
  the primary that the sentinels name ``primary-name``. Every new connection asks the
  sentinels where the primary is; a connection to a demoted primary is dropped (READONLY
  becomes a connection error, which is transient), so work follows a failover. Reads never go
  to a replica.

Query options apply to the data connections (``?socket_timeout=5&username=…``);
``sentinel_username`` / ``sentinel_password`` authenticate to the sentinels themselves.

The protocol is pinned (RESP2: every reply parser here assumes it) and redis-py's own retries
are off: a retried XADD, EVALSHA or XREADGROUP ``>`` could run twice. streamq retries only
where a call is idempotent or repeat-safe (``retry.py``); following a cluster redirect is not a
retry. An already-built client is used as given (``Queue(client, …)``, ``Admin(client)``).
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import attrs
import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from .errors import ConnectionSetupError, InvalidArgument

PROTOCOL = 2
"""The RESP version every streamq connection speaks; reply parsing assumes it."""

Kind = Literal["standalone", "cluster", "sentinel"]
_SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("standalone", False), "rediss": ("standalone", True), "unix": ("standalone", False),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
}
_INT_OPTIONS = frozenset({"db", "health_check_interval", "max_connections"})
_FLOAT_OPTIONS = frozenset({"socket_timeout", "socket_connect_timeout"})
_BOOL_OPTIONS = frozenset({"ssl_check_hostname"})
_STR_OPTIONS = frozenset({"username", "password", "client_name", "ssl_cert_reqs", "ssl_ca_certs",
                          "ssl_certfile", "ssl_keyfile"})
_SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password"})


@attrs.frozen
class Target:
    """What a URL names: the topology, where to reach it, and the connection options."""

    kind: Kind
    url: str
    """The URL as given (a standalone URL goes to redis-py's own parser unchanged)."""
    nodes: tuple[tuple[str, int], ...] = ()
    """Cluster seed nodes, or the sentinels."""
    service: str = ""
    """The Sentinel primary name."""
    tls: bool = False
    options: tuple[tuple[str, Any], ...] = ()
    """Connection options from the query string (and, for Sentinel, user/password/db)."""

    def redacted(self) -> str:
        """The URL without its password, for logs and errors."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))


def _hosts(netloc: str, default_port: int, url: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.rpartition("@")[2].split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        host = host.strip("[]")
        if not host:
            raise InvalidArgument(f"no host in {item!r} of {url!r}")
        try:
            hosts.append((host, int(port) if port else default_port))
        except ValueError:
            raise InvalidArgument(f"port {port!r} of {url!r} is not a number") from None
    return tuple(hosts)


def _options(query: str, url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        try:
            if key in _INT_OPTIONS:
                out[key] = int(value)
            elif key in _FLOAT_OPTIONS:
                out[key] = float(value)
            elif key in _BOOL_OPTIONS:
                out[key] = value.lower() in ("1", "true", "yes", "on")
            elif key in _STR_OPTIONS or key in _SENTINEL_OPTIONS:
                out[key] = value
            elif key in ("protocol", "decode_responses"):
                out[key] = value  # checked (and refused unless pinned) by _check_pinned
            else:
                raise InvalidArgument(f"unknown option {key!r} in {url!r}")
        except ValueError as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidArgument(f"option {key}={value!r} of {url!r} is not a number") from None
    return out


def parse(url: str) -> Target:
    """Read a streamq URL (any of the forms in the module docstring); bad URLs raise
    :class:`InvalidArgument` naming what is wrong."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(f"expected a Redis URL such as redis://localhost:6379/0, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidArgument(f"unknown URL scheme {parts.scheme!r} in {url!r}: use one of "
                              + ", ".join(f"{s}://" for s in _SCHEMES))
    kind, tls = _SCHEMES[scheme]
    if kind == "standalone":
        return Target(kind, url, tls=tls)  # redis-py's own URL parser reads the options
    opts = _options(parts.query, url)
    if parts.username:
        opts.setdefault("username", unquote(parts.username))
    if parts.password:
        opts.setdefault("password", unquote(parts.password))
    if kind == "cluster":
        if parts.path.strip("/") not in ("", "0"):
            raise InvalidArgument(f"Redis Cluster has only database 0: remove the path of {url!r}")
        return Target(kind, url, _hosts(parts.netloc, 6379, url), tls=tls,
                      options=tuple(sorted(opts.items())))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise InvalidArgument(f"name the primary: redis+sentinel://host:26379/primary-name[/db],"
                              f" got {url!r}")
    if len(path) == 2:
        try:
            opts["db"] = int(path[1])
        except ValueError:
            raise InvalidArgument(f"database {path[1]!r} of {url!r} is not a number") from None
    return Target(kind, url, _hosts(parts.netloc, 26379, url), unquote(path[0]), tls,
                  tuple(sorted(opts.items())))


def _check_pinned(options: dict[str, Any]) -> None:
    """redis-py lets options override arguments: refuse those that would unpin the protocol
    or decode replies (every reply parser here assumes RESP2 bytes)."""
    if str(options.get("protocol", PROTOCOL)) != str(PROTOCOL):
        raise InvalidArgument(f"streamq speaks RESP{PROTOCOL}: remove protocol= from the URL")
    if str(options.get("decode_responses", False)).lower() not in ("false", "0", "no", "off"):
        raise InvalidArgument("streamq reads raw bytes: remove decode_responses= from the URL")


def _kwargs(socket_timeout_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "protocol": PROTOCOL,
        "decode_responses": False,
        "socket_connect_timeout": 10.0,
        "socket_timeout": socket_timeout_s,
        "health_check_interval": 30,
    }
    kw.update(extra)
    return kw


def _split(target: Target, socket_timeout_s: float,
           extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(data connection kwargs, sentinel connection kwargs)."""
    opts = dict(target.options)
    sentinel = {k.removeprefix("sentinel_"): opts.pop(k) for k in list(opts)
                if k in _SENTINEL_OPTIONS}
    kw = _kwargs(socket_timeout_s, {**opts, **extra})
    _check_pinned(kw)
    if target.tls:
        kw["ssl"] = True
        sentinel["ssl"] = True
    sentinel.update(protocol=PROTOCOL, socket_connect_timeout=kw["socket_connect_timeout"],
                    socket_timeout=min(5.0, socket_timeout_s))
    return kw, sentinel


def sync_client(url: str | Target, *, socket_timeout_s: float = 30.0, **extra: Any) -> Any:
    """A blocking client for ``url``: ``redis.Redis`` (standalone or the Sentinel primary) or
    ``redis.cluster.RedisCluster``. A standalone or Sentinel client connects at its first
    command; a cluster client reads the slot map from a seed node at once."""
    target = url if isinstance(url, Target) else parse(url)
    no_retry = Retry(NoBackoff(), 0)
    if target.kind == "standalone":
        _check_pinned({**dict(parse_qsl(urlsplit(target.url).query)), **extra})
        return redis.Redis.from_url(target.url, retry=no_retry,
                                    **_kwargs(socket_timeout_s, extra))
    kw, sentinel_kw = _split(target, socket_timeout_s, extra)
    if target.kind == "cluster":
        from redis.cluster import ClusterNode

        from .nodes import cluster_class

        kw.pop("health_check_interval", None)
        try:
            nodes = [ClusterNode(h, p) for h, p in target.nodes]  # type: ignore[no-untyped-call]
            return cluster_class()(startup_nodes=nodes, retry=no_retry, **kw)
        except (redis.RedisError, RedisClusterException) as exc:
            raise _setup_error(target, exc) from exc
    sentinels = _sentinels(target, False)(list(target.nodes), sentinel_kwargs=sentinel_kw)
    return sentinels.master_for(target.service, retry=no_retry, **kw)


def server_address(url: str | Target) -> tuple[str, int] | None:
    """(host, port) of the Redis server a URL names (a cluster's first seed node), for the
    spans' ``server.address``/``server.port``; None for Sentinel (the primary is found at
    run time) and a Unix socket."""
    target = url if isinstance(url, Target) else parse(url)
    if target.kind == "cluster":
        return target.nodes[0] if target.nodes else None
    parts = urlsplit(target.url)
    if target.kind != "standalone" or parts.scheme.lower() == "unix":
        return None
    try:
        port = parts.port or 6379
    except ValueError:
        return None
    return parts.hostname or "localhost", port


def async_client(url: str | Target, *, socket_timeout_s: float = 30.0, **extra: Any) -> Any:
    """The asyncio client for ``url``: ``redis.asyncio.Redis`` (standalone or the Sentinel
    primary) or ``redis.asyncio.cluster.RedisCluster`` (learns the slot map on first use)."""
    from redis.asyncio.retry import Retry as AsyncRetry

    target = url if isinstance(url, Target) else parse(url)
    no_retry = AsyncRetry(NoBackoff(), 0)
    if target.kind == "standalone":
        _check_pinned({**dict(parse_qsl(urlsplit(target.url).query)), **extra})
        client: aredis.Redis = aredis.Redis.from_url(target.url, retry=no_retry,
                                                     **_kwargs(socket_timeout_s, extra))
        return client
    kw, sentinel_kw = _split(target, socket_timeout_s, extra)
    if target.kind == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        kw.pop("health_check_interval", None)
        nodes = [ClusterNode(h, p) for h, p in target.nodes]
        return RedisCluster(startup_nodes=nodes, retry=no_retry, **kw)
    sentinels = _sentinels(target, True)(list(target.nodes), sentinel_kwargs=sentinel_kw)
    return sentinels.master_for(target.service, retry=no_retry, **kw)


def _sentinels(target: Target, asyncio: bool) -> Any:
    """redis-py's Sentinel (sync or asyncio) that tells a primary name no sentinel knows
    (:class:`ConnectionSetupError`, permanent: raised by the first command of any component)
    from sentinels that cannot be reached or a primary that is down (MasterNotFoundError, a
    connection error: transient, retried while a failover runs)."""
    if asyncio:
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        class _Async(AsyncSentinel):
            async def discover_master(self, service_name: str) -> Any:
                try:
                    return await super().discover_master(service_name)
                except redis.RedisError as exc:
                    import asyncio as aio

                    await aio.to_thread(_raise_setup, target, exc)
                    raise

        return _Async
    from redis.sentinel import Sentinel

    class _Sync(Sentinel):
        def discover_master(self, service_name: str) -> Any:
            try:
                return super().discover_master(service_name)  # type: ignore[no-untyped-call]
            except redis.RedisError as exc:
                _raise_setup(target, exc)
                raise

    return _Sync


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (sync or asyncio)."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncCluster))


def _setup_error(target: Target, exc: BaseException) -> Exception:
    """A cluster URL that reaches a standalone server is a setup error (permanent); a seed
    that cannot be reached is a connection error (transient: it may come up later)."""
    text = str(exc)
    if "cluster" in text.lower() and "not enabled" in text.lower():
        return ConnectionSetupError(
            f"{target.redacted()} is a standalone server, not a Redis Cluster node: use "
            "redis:// (or rediss://) for it")
    return redis.ConnectionError(f"cannot reach the cluster {target.redacted()}: {text}")


def as_cluster_url(url: str) -> str:
    """The ``redis+cluster://`` form of a node's URL (what the old ``cluster=True`` flags and
    ``--cluster`` meant); a URL already in cluster form is returned as is."""
    target = parse(url)
    if target.kind == "cluster":
        return url
    if target.kind != "standalone" or url.lower().startswith("unix:"):
        raise InvalidArgument(f"{target.redacted()} cannot name a Redis Cluster: use "
                              "redis+cluster://host:port[,host:port…]")
    parts = urlsplit(url)
    if parts.path.strip("/") not in ("", "0"):
        raise InvalidArgument(f"Redis Cluster has only database 0: remove the path of {url!r}")
    scheme = "rediss+cluster" if target.tls else "redis+cluster"
    return urlunsplit(parts._replace(scheme=scheme, path=""))


def standalone_on_cluster(url: str | Target | None) -> ConnectionSetupError:
    """The error for a standalone URL that reached a node of a Redis Cluster (a ``MOVED``
    reply on a plain client says the same)."""
    target = parse(url) if isinstance(url, str) else url
    return _standalone_on_cluster(target or Target("standalone", "the server"))


def _standalone_on_cluster(target: Target) -> ConnectionSetupError:
    return ConnectionSetupError(
        f"{target.redacted()} is a node of a Redis Cluster: use redis+cluster://host:port (one "
        "or more seed nodes) so each queue's keys go to the node that owns them")


def verify(client: Any, url: str | Target | None = None) -> None:
    """Check that the URL's form matches the server (blocking): a standalone URL that reaches
    a cluster node, a cluster URL that reaches a standalone server, or a Sentinel primary name
    the sentinels do not know raise :class:`ConnectionSetupError`. Connection errors pass
    through (they are transient: the server may come up later)."""
    target = url if isinstance(url, Target) or url is None else parse(url)
    try:
        info = client.info("cluster")
    except redis.exceptions.NoPermissionError:
        return  # an ACL user without INFO: not checked here (a MOVED reply later says it)
    except (redis.RedisError, RedisClusterException) as exc:
        _raise_setup(target, exc)
        raise
    if not is_cluster(client) and info.get("cluster_enabled") in (1, "1"):
        raise _standalone_on_cluster(target or Target("standalone", "the server"))


async def averify(client: Any, url: str | Target | None = None) -> None:
    """:func:`verify` for an asyncio client."""
    target = url if isinstance(url, Target) or url is None else parse(url)
    try:
        info = await client.info("cluster")
    except redis.exceptions.NoPermissionError:
        return  # an ACL user without INFO: not checked here (a MOVED reply later says it)
    except (redis.RedisError, RedisClusterException) as exc:
        import asyncio

        await asyncio.to_thread(_raise_setup, target, exc)
        raise
    if not is_cluster(client) and info.get("cluster_enabled") in (1, "1"):
        raise _standalone_on_cluster(target or Target("standalone", "the server"))


def _unknown_primary(target: Target) -> bool:
    """True when a sentinel answers and does not know ``target.service`` (a wrong name, which
    is permanent); False when none answers (which is transient)."""
    _, sentinel_kw = _split(target, 5.0, {})
    for host, port in target.nodes:
        probe = redis.Redis(host, port, **sentinel_kw)
        try:
            return probe.sentinel_get_master_addr_by_name(target.service) is None
        except redis.RedisError:
            continue
        finally:
            probe.close()
    return False


def _raise_setup(target: Target | None, exc: Exception) -> None:
    from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
    from redis.sentinel import MasterNotFoundError

    if (isinstance(exc, MasterNotFoundError | AsyncMasterNotFound) and target is not None
            and target.kind == "sentinel" and _unknown_primary(target)):
        raise ConnectionSetupError(
            f"no sentinel of {target.redacted()} knows a primary named {target.service!r}"
            " (check the name: SENTINEL MASTERS lists them)") from exc
    if isinstance(exc, RedisClusterException) and target is not None:
        raise _setup_error(target, exc) from exc
