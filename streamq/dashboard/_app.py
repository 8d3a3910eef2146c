"""The dashboard's configuration, shared state, rendering and error pages (``_asgi.py`` builds
the ASGI app over them, with the routes of ``_views.py`` and ``_actions.py``)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import jinja2
from redis import exceptions as rx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .._core.config import QueueConfig
from .._core.errors import InvalidArgument, JobNotFound, StreamqError, UnknownQueue
from .._version import VERSION
from ..admin import AsyncAdmin
from ._live import BulkTask, Hub
from ._security import Authorize, Csrf, Identify, allowed, default_identify

log = logging.getLogger("streamq.dashboard")
Handler = Callable[[Request], Awaitable[Response]]
OVERVIEW_PAGE = 100
"""Queues per overview page (and per live overview stream)."""


def _page_size(_inst: object, _att: object, v: int) -> None:
    if not isinstance(v, int) or not 1 <= v <= 1000:
        raise InvalidArgument(f"page_size must be 1-1000, got {v!r}")


def _interval(_inst: object, _att: object, v: float) -> None:
    if not isinstance(v, int | float) or not 0.05 <= v <= 3600:
        raise InvalidArgument(f"poll_interval_s must be 0.05-3600 seconds, got {v!r}")


@attrs.frozen
class DashboardConfig:
    """How the dashboard behaves; ``create_app(..., config=DashboardConfig(...))``."""

    read_only: bool = False
    """Hide every action and refuse every POST."""
    authorize: Authorize | None = None
    identify: Identify | None = None
    """Who acts, for the audit event (default: the host app's authenticated user, else the
    client address)."""
    secret: bytes | None = None
    """Signs CSRF tokens; give the same one to every process behind a load balancer."""
    queue_config: QueueConfig = attrs.field(factory=QueueConfig)
    poll_interval_s: float = attrs.field(default=1.0, validator=_interval)
    page_size: int = attrs.field(default=50, validator=_page_size)
    queues: tuple[str, ...] = ()
    """Queues to show besides those in the ``streamq:queues`` set (producer-only queues)."""
    title: str = "streamq"
    links: tuple[tuple[str, str], ...] = ()
    """Extra header links: (label, path under the dashboard's root)."""


class Dashboard:
    """State shared by the requests of one app: the admin client, the live hub, templates."""

    def __init__(self, admin: AsyncAdmin, cfg: DashboardConfig) -> None:
        self.admin = admin
        self.cfg = cfg
        self.csrf = Csrf(cfg.secret)
        self.identify = cfg.identify or default_identify
        self.tasks: dict[str, BulkTask] = {}
        self.hub = Hub(admin, self.queue_names, cfg.poll_interval_s, self.tasks)
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("streamq.dashboard", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
            lstrip_blocks=True)
        self.env.filters.update(ms=fmt_ms, when=fmt_dt, num=lambda n: f"{n:,}", pretty=pretty)

    async def queue_names(self, after: str | None = None) -> tuple[list[str], str | None, int]:
        """One overview page: the configured queues first (on the first page), then the known
        ones by name after ``after``; the cursor of the next page; how many there are."""
        pinned = list(dict.fromkeys(self.cfg.queues))
        rest = sorted(set(await self.admin.queues()) - set(pinned))
        total = len(pinned) + len(rest)
        if after is None:
            page, more = pinned + rest[:OVERVIEW_PAGE], rest[OVERVIEW_PAGE:]
        else:
            later = [n for n in rest if n > after]
            page, more = later[:OVERVIEW_PAGE], later[OVERVIEW_PAGE:]
        return page, (page[-1] if more and page else None), total

    async def can(self, request: Request, action: str, queue: str | None) -> bool:
        if action != "view" and self.cfg.read_only:
            return False
        return await allowed(self.cfg.authorize, request, action, queue)

    def render(self, request: Request, template: str, status: int = 200, **ctx: Any
               ) -> HTMLResponse:
        cookie = self.csrf.cookie_of(request)
        fresh = cookie is None
        if cookie is None:
            cookie = self.csrf.new_cookie()
        root = request.scope.get("root_path", "")
        html = self.env.get_template(template).render(
            request=request, root=root, csrf=self.csrf.token(cookie), cfg=self.cfg,
            version=VERSION, here=str(request.url.path) + (
                f"?{request.url.query}" if request.url.query else ""), **ctx)
        resp = HTMLResponse(html, status_code=status)
        resp.headers["cache-control"] = "no-store"
        if fresh:
            resp.set_cookie("streamq_csrf", cookie, httponly=True, samesite="strict",
                            path=root or "/", secure=request.url.scheme == "https")
        return resp

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "message.html", status=status, title=f"{status}",
                           message=message, back=None)

    async def aclose(self) -> None:
        await self.hub.close()
        await self.admin.close()


def fmt_ms(ms: Any) -> str:
    """Epoch ms as UTC; anything else (damaged data) as text."""
    if not ms:
        return "-"
    try:
        return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError, TypeError):
        return str(ms)


def fmt_dt(d: dt.datetime | None) -> str:
    return "-" if d is None else fmt_ms(int(d.timestamp() * 1000))


PRETTY_MAX = 64 * 1024


def pretty(value: Any) -> str:
    """JSON for people, cut at 64 KiB (escaped by the template like any other text)."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (ValueError, RecursionError):
        text = repr(value)
    if len(text) > PRETTY_MAX:
        text = text[:PRETTY_MAX] + f"\n… ({len(text) - PRETTY_MAX:,} more characters not shown)"
    return text


def guarded(dash: Dashboard, fn: Callable[[Dashboard, Request], Awaitable[Response]]
            ) -> Handler:
    """A handler whose expected failures become clear 4xx/503 pages, never a traceback."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(dash, request)
        except (JobNotFound, UnknownQueue) as exc:
            return dash.error(request, 404, str(exc))
        except (InvalidArgument, UnicodeError) as exc:
            return dash.error(request, 400, str(exc))
        except HTTPException as exc:
            return dash.error(request, exc.status_code, str(exc.detail))
        except (rx.ConnectionError, rx.TimeoutError) as exc:
            log.warning("dashboard: Redis unavailable: %s", exc)
            return dash.error(request, 503, "Redis is unreachable; try again shortly")
        except (StreamqError, rx.ResponseError) as exc:
            log.warning("dashboard: %s", exc)
            return dash.error(request, 503, f"Redis answered with an error: {exc}")

    return handler
