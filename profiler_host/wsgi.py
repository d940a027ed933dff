"""WSGI middleware: each sampled request is recorded until its response is closed; every
request is counted."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from profiler_host import runtime
from profiler_host.recording import CURRENT, Request
from profiler_host.request_counts import status_of
from profiler_host.routes import wsgi_route
from profiler_host.runtime import Profiler, reset

FORCE_HEADER = "HTTP_X_PROFILER_FORCE"


class ProfilerMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        profiler = runtime.STARTED
        if profiler is None:
            return self.app(environ, start_response)
        # a request that is not sampled pays this frame, the sampler's C call and its
        # `counted` (C: in place of start_response it keeps the status and reads the route)
        path = environ.get("PATH_INFO") or "/"
        forced = profiler.force_secret is not None and profiler.forced(environ.get(FORCE_HEADER))
        if forced or profiler.decide(path):
            request = profiler.open(path, environ.get("REQUEST_METHOD", ""), forced)
            if request is not None:
                return _recorded(profiler, request, self.app, environ, start_response)
        counted = profiler.counts.counted(
            start_response, path, environ.get("REQUEST_METHOD", ""), environ, wsgi_route
        )
        try:
            return self.app(environ, counted)
        except BaseException:
            counted.fail()
            raise
        finally:  # counted once the app returns its body (a streamed body's time is not in it)
            counted.end()


def _recorded(
    profiler: Profiler,
    request: Request,
    app: Callable[..., Iterable[bytes]],
    environ: dict[str, Any],
    start_response: Callable,
) -> Iterable[bytes]:
    """A sampled request, recorded until the server closes its response."""
    token = CURRENT.set(request.main)
    response = _Response(profiler, request, token)

    def capture_status(status: str, headers: list, exc_info: Any = None) -> Callable:
        response.status = status_of(status)
        response.route = wsgi_route(environ)  # Flask forgets it after the response
        if exc_info is None:
            return start_response(status, headers)
        return start_response(status, headers, exc_info)

    try:
        response.body = app(environ, capture_status)
    except BaseException:
        response.status = response.status or 500
        response.close()
        raise
    return response


class _Response:
    """Wraps the body so the request ends when the server closes it (streamed bodies run
    inside the request)."""

    def __init__(self, profiler: Profiler, request: Request, token: Any) -> None:
        self.profiler = profiler
        self.request = request
        self.token = token
        self.status = 0
        self.route: str | None = None
        self.body: Iterable[bytes] = ()
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.request.route = self.route or self.request.route
            reset(self.token)
            self.profiler.end(self.request, self.status)
