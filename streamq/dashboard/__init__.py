"""The streamq web dashboard (``pip install 'streamq[dashboard]'``).

``create_app(url=...)`` returns an ASGI app: run it with ``streamq dashboard`` or uvicorn, or
mount it in FastAPI / Starlette under a path prefix. See docs/dashboard.md.
"""

from __future__ import annotations

from ._app import Dashboard, DashboardConfig
from ._asgi import create_app
from ._security import ACTIONS, Authorize, Identify

__all__ = ["ACTIONS", "Authorize", "Dashboard", "DashboardConfig", "Identify", "create_app"]
