"""Who may use the dashboard: a token (as a bearer token or the basic-auth password) when one
is set, and a CSRF token on every form that changes anything."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["Csrf", "TokenGuard", "is_loopback"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TokenGuard:
    """ASGI middleware: every request carries ``token`` (``Authorization: Bearer <token>``, or
    basic auth with it as the password), else 401 and the browser asks for it."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"www-authenticate", b'Basic realm="ackwise dashboard"'),
                    (b"content-type", b"text/plain; charset=utf-8"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"401: this dashboard needs its token\n"})

    def _allowed(self, scope: Scope) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        kind, _, value = header.partition(b" ")
        if kind.lower() == b"bearer":
            return hmac.compare_digest(value.strip(), self._token)
        if kind.lower() == b"basic":
            try:
                _, _, password = base64.b64decode(value.strip()).partition(b":")
            except ValueError:
                return False
            return hmac.compare_digest(password, self._token)
        return False


class Csrf:
    """The token every form that changes something carries (one per dashboard process)."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self.token = hmac.new(self._secret, b"ackwise-dashboard-csrf", hashlib.sha256).hexdigest()

    def valid(self, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given, self.token)
