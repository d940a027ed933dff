"""ASGI middleware: http requests and websocket connections are requests (each one counted,
the sampled ones recorded); lifespan and anything else pass through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from profiler_host import native, runtime
from profiler_host.recording import CURRENT, Request
from profiler_host.routes import ASGI_ROUTE
from profiler_host.runtime import Profiler, reset

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FORCE_HEADER = b"x-profiler-force"
_REQUESTS = frozenset(("http", "websocket"))
_counts = native.extension("_counts")


class ProfilerMiddleware:
    """Wrap an ASGI 3 app: `ProfilerMiddleware(app)`.

    Its work is `dispatch`, which returns what the server awaits: the app's own awaitable
    where there is nothing to do, a C awaitable (`Counted.run`) for a request that is not
    sampled, and a coroutine only for a recorded one. Where the host's C extensions are
    built, `dispatch` is `_counts.Dispatch`, which takes a request that is not sampled
    through without a Python frame and hands everything else to the Python dispatch it is
    the twin of (`python_dispatch`). `__call__` is a coroutine function around it for the
    servers that tell an ASGI 3 app by that (hypercorn asks `inspect`, which on 3.11 cannot
    be told a plain function is one); the servers the host wraps itself, after they have
    told the app's interface, call `dispatch` (see `integrations`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.dispatch: Callable[[Scope, Receive, Send], Awaitable[None]] = self.python_dispatch
        if _counts is not None:
            self.dispatch = _counts.Dispatch(
                app, vars(runtime), self.python_dispatch, self.sampled, ASGI_ROUTE, self
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.dispatch(scope, receive, send)

    def python_dispatch(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        profiler = runtime.STARTED
        kind = scope.get("type")
        if profiler is None or kind not in _REQUESTS:
            return self.app(scope, receive, send)
        # a request that is not sampled pays the sampler's C call and its `counted` (C: in
        # place of send it keeps the status; its awaitable counts the request when the
        # app's ends); headers are read only where a secret can force a request
        path = scope.get("path") or "/"
        forced = profiler.force_secret is not None and profiler.forced(_header(scope, FORCE_HEADER))
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        if forced or profiler.decide(path):
            return self.sampled(profiler, scope, receive, send, path, method, forced)
        return _counted(profiler, self.app, scope, receive, send, path, method)

    def sampled(
        self,
        profiler: Profiler,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        method: str,
        forced: bool,
    ) -> Awaitable[None]:
        """A request the sampler took (or a secret forced): recorded, unless the profiler
        has no room for it (then counted as one not sampled)."""
        request = profiler.open(path, method, forced)
        if request is not None:
            return _recorded(profiler, request, self.app, scope, receive, send)
        return _counted(profiler, self.app, scope, receive, send, path, method)


def _counted(
    profiler: Profiler,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    method: str,
) -> Awaitable[None]:
    """A request not recorded: the app awaited through the count table's awaitable, which
    counts it as it ends (`Counted.run`, C where built)."""
    return profiler.counts.counted(send, path, method).run(app, scope, receive, ASGI_ROUTE)


async def _recorded(
    profiler: Profiler,
    request: Request,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """A sampled request, recorded until the app returns."""
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
        await app(scope, receive, capture_status)
    except BaseException:
        status = status or 500
        raise
    finally:
        request.route = ASGI_ROUTE(scope) or request.route
        reset(token)
        profiler.end(request, status)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None
