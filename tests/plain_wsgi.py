"""A WSGI app on no framework: the host names its requests by their path, so whatever a
client puts in a path (a NUL, say) reaches the profiling server as the route."""

from __future__ import annotations


def answer(path: str) -> tuple[str, bytes]:
    if path in ("/health", "/ok"):
        return "200 OK", b"ok"
    return "404 Not Found", b"not found"


def app(environ: dict, start_response) -> list[bytes]:
    status, body = answer(environ.get("PATH_INFO", "/"))
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
