"""WSGI middleware: each sampled request is recorded until its response is closed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from profiler_host.recording import CURRENT, Request
from profiler_host.runtime import Profiler, active, reset

FORCE_HEADER = "HTTP_X_PROFILER_FORCE"


class ProfilerMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        profiler = active()
        if profiler is None:
            return self.app(environ, start_response)
        request = profiler.begin(
            environ.get("PATH_INFO") or "/",
            environ.get("REQUEST_METHOD", ""),
            profiler.forced(environ.get(FORCE_HEADER)),
        )
        if request is None:
            return self.app(environ, start_response)
        token = CURRENT.set(request.main)
        response = _Response(profiler, request, token)

        def capture_status(status: str, headers: list, exc_info: Any = None) -> Callable:
            response.status = _status_code(status)
            response.route = _route_template(environ)  # Flask forgets it after the response
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


def _status_code(status: str) -> int:
    try:
        return int(status.split(" ", 1)[0])
    except ValueError:
        return 0


def _route_template(environ: dict[str, Any]) -> str | None:
    """Flask/Werkzeug keep the matched rule on the request they store in the environ."""
    rule = getattr(environ.get("werkzeug.request"), "url_rule", None)
    return getattr(rule, "rule", None)
