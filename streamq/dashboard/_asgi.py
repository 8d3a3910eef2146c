"""``create_app``: the ASGI application, its routes registered from ``_views.py`` and
``_actions.py`` (which import the shared state of ``_app.py``, never this module)."""

from __future__ import annotations

from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .._core.errors import InvalidArgument
from ..admin import AsyncAdmin
from . import _actions, _flow, _search, _views
from ._app import Dashboard, DashboardConfig, guarded
from ._security import Authorize, SecurityHeaders


def create_app(url: str | None = None, *, read_only: bool = False,
               authorize: Authorize | None = None, prefix: str | None = None,
               config: DashboardConfig | None = None, admin: AsyncAdmin | None = None,
               cluster: bool = False, **client_kwargs: Any) -> Starlette:
    """The dashboard as an ASGI app: run it with uvicorn, or mount it under a path.

    Give ``url`` in any form (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
    ``redis+sentinel://``; ``cluster=True`` turns one node's ``redis://`` URL into the
    ``redis+cluster://`` form) or an ``AsyncAdmin`` of your own. ``read_only`` and
    ``authorize`` override the same fields of ``config``; ``prefix`` is the key prefix."""
    cfg = config or DashboardConfig()
    if read_only:
        cfg = attrs.evolve(cfg, read_only=True)
    if authorize is not None:
        cfg = attrs.evolve(cfg, authorize=authorize)
    if prefix is not None:
        cfg = attrs.evolve(cfg, queue_config=attrs.evolve(cfg.queue_config, key_prefix=prefix))
    if admin is None:
        if url is None:
            raise InvalidArgument("create_app needs url= or admin=")
        admin = (AsyncAdmin.for_cluster if cluster else AsyncAdmin.from_url)(
            url, cfg.queue_config, **client_kwargs)
    dash = Dashboard(admin, cfg)
    routes: list[BaseRoute] = [Route(path, guarded(dash, fn), methods=[method])
                               for path, method, fn in [*_views.ROUTES, *_actions.ROUTES,
                                                         *_search.ROUTES, *_flow.ROUTES]]
    routes.append(Route("/live", _views.live(dash), methods=["GET"]))
    static = StaticFiles(packages=[("streamq.dashboard", "static")])
    routes.append(Mount("/static", app=static, name="static"))

    async def not_found(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        return dash.error(request, code, "no such page" if code == 404 else "error")

    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)],
                    exception_handlers={404: not_found, 405: not_found})
    app.state.dashboard = dash
    return app
