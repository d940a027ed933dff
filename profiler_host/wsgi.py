"""WSGI middleware: each sampled request is recorded until its response is closed; every
request is counted."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import monotonic_ns
from typing import Any

from profiler_host.recording import CURRENT, Request
from profiler_host.routes import wsgi_route
from profiler_host.runtime import Profiler, active, reset

FORCE_HEADER = "HTTP_X_PROFILER_FORCE"


class ProfilerMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        profiler = active()
        if profiler is None:
            return self.app(environ, start_response)
        # a request that is not sampled pays this, the sampler's C call and its count
        path, method = environ.get("PATH_INFO") or "/", environ.get("REQUEST_METHOD", "")
        forced = profiler.force_secret is not None and profiler.forced(environ.get(FORCE_HEADER))
        request = profiler.open(path, method, forced) if forced or profiler.decide(path) else None
        if request is None:
            return _counted(profiler, self.app, environ, start_response, path, method)
        token = CURRENT.set(request.main)
        response = _Response(profiler, request, token)

        def capture_status(status: str, headers: list, exc_info: Any = None) -> Callable:
            response.status = _status_code(status)
            response.route = wsgi_route(environ)  # Flask forgets it after the response
            if exc_info is None:
                return start_response(status, headers)
            return start_response(status, headers, exc_info)

        try:
            response.body = self.app(environ, capture_status)
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


def _counted(
    profiler: Profiler,
    app: Callable[..., Iterable[bytes]],
    environ: dict[str, Any],
    start_response: Callable,
    path: str,
    method: str,
) -> Iterable[bytes]:
    """An unsampled request: counted once the app returns its body (a streamed body's
    time is not in its duration)."""
    started = monotonic_ns()
    seen: list[Any] = [0, None]  # status, route

    def capture_status(status: str, headers: list, exc_info: Any = None) -> Callable:
        seen[0], seen[1] = _status_code(status), wsgi_route(environ)
        if exc_info is None:
            return start_response(status, headers)
        return start_response(status, headers, exc_info)

    try:
        body = app(environ, capture_status)
    except BaseException:
        seen[0] = seen[0] or 500
        raise
    finally:
        profiler.count(seen[1] or path, method, seen[0], monotonic_ns() - started)
    return body


def _status_code(status: str) -> int:
    try:
        return int(status.split(" ", 1)[0])
    except ValueError:
        return 0
