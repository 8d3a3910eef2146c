"""What makes the dashboard safe to expose: CSRF tokens, the authorize hook, who did what,
and the security headers (a strict Content-Security-Policy) on every response."""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Authorize = Callable[[Request, str, "str | None"], "bool | Awaitable[bool]"]
"""``authorize(request, action, queue)``: True allows. ``action`` is ``view`` for every page
(``queue`` None on pages about all queues) or the name of an action (``pause``, ``redrive``,
...) for a POST and for deciding whether to show its button."""

Identify = Callable[[Request], str]

ACTIONS = ("pause", "resume", "redrive", "redrive-all", "purge-dead", "run-now", "cancel",
           "requeue")
COOKIE = "streamq_csrf"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
       " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()),
           (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"same-origin"),
           (b"x-frame-options", b"DENY")]


class SecurityHeaders:
    """ASGI middleware: the security headers on every response (errors included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((k, v) for k, v in HEADERS if k not in names)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Csrf:
    """Signed double-submit tokens: a random cookie (HttpOnly, SameSite=Strict) and, in every
    form, HMAC(secret, cookie). A cross-site page can neither read the cookie nor forge the
    token; the secret is per process unless given (tokens then die with a restart)."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    def cookie_of(self, request: Request) -> str | None:
        value = request.cookies.get(COOKIE)
        return value if value and len(value) == 64 and value.isalnum() else None

    def new_cookie(self) -> str:
        return secrets.token_hex(32)

    def token(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, request: Request, token: str | None) -> bool:
        cookie = self.cookie_of(request)
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token(cookie), token)


def default_identify(request: Request) -> str:
    """The authenticated user when the host app set one (Starlette AuthenticationMiddleware),
    else the client address."""
    user = request.scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        return f"dashboard:{getattr(user, 'display_name', '') or 'user'}"
    client = request.client.host if request.client else "unknown"
    return f"dashboard@{client}"


async def allowed(authorize: Authorize | None, request: Request, action: str,
                  queue: str | None) -> bool:
    if authorize is None:
        return True
    verdict: Any = authorize(request, action, queue)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return verdict is True
