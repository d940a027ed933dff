"""ASGI middleware: http requests and websocket connections are requests (each one counted,
the sampled ones recorded); lifespan and anything else pass through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from time import monotonic_ns
from typing import Any

from profiler_host import runtime
from profiler_host.recording import CURRENT
from profiler_host.routes import asgi_route
from profiler_host.runtime import reset

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FORCE_HEADER = b"x-profiler-force"
_REQUESTS = frozenset(("http", "websocket"))


class ProfilerMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        profiler = runtime.STARTED
        kind = scope.get("type")
        if profiler is None or kind not in _REQUESTS:
            await self.app(scope, receive, send)
            return
        # a request that is not sampled pays this frame, the sampler's C call, the status
        # closure and its count (C); headers are read only where a secret can force one
        path = scope.get("path") or "/"
        forced = profiler.force_secret is not None and profiler.forced(_header(scope, FORCE_HEADER))
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        request = profiler.open(path, method, forced) if forced or profiler.decide(path) else None
        started = monotonic_ns()
        status = 0

        def capture_status(message: Message) -> Awaitable[None]:
            # returns what `send` returns (no coroutine of its own for each message)
            nonlocal status
            kind = message.get("type")
            if kind == "http.response.start":
                status = int(message.get("status", 0))
            elif kind == "websocket.accept":
                status = 101
            return send(message)

        token = CURRENT.set(request.main) if request is not None else None
        try:
            await self.app(scope, receive, capture_status)
        except BaseException:
            status = status or 500
            raise
        finally:
            route = asgi_route(scope)
            if request is None:  # unsampled: only counted
                profiler.count(route or path, method, status, monotonic_ns() - started)
            else:
                request.route = route or request.route
                if token is not None:
                    reset(token)
                profiler.end(request, status)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None
