"""Redis client construction: protocol pinned to RESP2, redis-py's own retries off.

redis-py retries commands by default; a retried XADD, EVALSHA or XREADGROUP ``>`` can run
twice. streamq turns that off and retries only where a call is idempotent (see _retry.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import InvalidArgument

PROTOCOL = 2
"""The RESP version every streamq connection speaks; reply parsing assumes it."""


def _check_pinned(url: str, extra: dict[str, Any]) -> None:
    """redis-py lets URL query options override arguments: refuse those that would unpin the
    protocol or decode replies (every reply parser here assumes RESP2 bytes)."""
    options = {**extra, **dict(parse_qsl(urlsplit(url).query))}
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


def sync_client(url: str, *, socket_timeout_s: float = 30.0, **extra: Any) -> redis.Redis:
    _check_pinned(url, extra)
    return redis.Redis.from_url(
        url, retry=Retry(NoBackoff(), 0), **_kwargs(socket_timeout_s, extra)
    )


def async_client(url: str, *, socket_timeout_s: float = 30.0, **extra: Any) -> aredis.Redis:
    _check_pinned(url, extra)
    from redis.asyncio.retry import Retry as AsyncRetry

    client: aredis.Redis = aredis.Redis.from_url(
        url, retry=AsyncRetry(NoBackoff(), 0), **_kwargs(socket_timeout_s, extra)
    )
    return client
