"""ASGI middleware: http requests and websocket connections are requests; lifespan and
anything else pass through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from profiler_host.recording import CURRENT
from profiler_host.runtime import active, reset

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FORCE_HEADER = b"x-profiler-force"


class ProfilerMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        profiler = active()
        kind = scope.get("type")
        if profiler is None or kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        # headers are read only where a secret can force a request: every request pays this
        forced = bool(profiler.settings.force_secret) and profiler.forced(
            _header(scope, FORCE_HEADER)
        )
        request = profiler.begin(scope.get("path") or "/", method, forced)
        if request is None:
            await self.app(scope, receive, send)
            return
        status = 0

        async def capture_status(message: Message) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 0))
            elif message.get("type") == "websocket.accept":
                status = 101
            await send(message)

        token = CURRENT.set(request.main)
        try:
            await self.app(scope, receive, capture_status)
        except BaseException:
            status = status or 500
            raise
        finally:
            request.route = getattr(scope.get("route"), "path", None) or request.route
            reset(token)
            profiler.end(request, status)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None
