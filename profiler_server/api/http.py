"""HTTP: JSON API, /metrics, /healthz, web UI (Starlette; sync endpoints run in its thread pool)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from profiler_server import exports
from profiler_server.api import views
from profiler_server.storage import queries
from profiler_server.ui import routes as ui_routes

MAX_LIMIT = 1000


class FastJSONResponse(JSONResponse):
    """Compact UTF-8 JSON like Starlette's, encoded by orjson: a call tree of 10,000 nodes
    (2 MB) takes 3-6 ms instead of 40-80 ms. What orjson refuses (an integer beyond 64 bits,
    say a sum over a very long range) falls back to the stdlib encoder."""

    def render(self, content: Any) -> bytes:
        return exports.json_bytes(content)


def _time_ns(value: str | None, name: str) -> int | None:
    """ISO-8601 (`2026-11-22T10:00:00Z`) or epoch seconds."""
    if value is None or value == "":
        return None
    try:
        return int(float(value) * 1e9)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(
            400, f"{name}: expected ISO-8601 or epoch seconds, got {value!r}"
        ) from None
    if parsed.tzinfo is None:
        raise HTTPException(400, f"{name}: give a time zone (e.g. a trailing Z for UTC)")
    return int(parsed.timestamp() * 1e9)


def _number(value: str | None, name: str, default: float | None = None) -> float | None:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise HTTPException(400, f"{name}: expected a number, got {value!r}") from None


def _choice(value: str | None, name: str, allowed: tuple[str, ...]) -> str:
    if value is None or value == "":
        return allowed[0]
    if value not in allowed:
        raise HTTPException(400, f"{name}: expected one of {', '.join(allowed)}")
    return value


def _status(value: str | None) -> tuple[int, int] | None:
    """`404` (exactly) or a class like `5xx`, as a [low, high) range."""
    if value is None or value == "":
        return None
    if len(value) == 3 and value[0] in "12345" and value[1:].lower() == "xx":
        low = int(value[0]) * 100
        return low, low + 100
    if value.isdigit():
        return int(value), int(value) + 1
    raise HTTPException(400, f"status: expected a code like 404 or a class like 5xx, got {value!r}")


_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


def _attachment(filename: str) -> dict[str, str]:
    """A download with a name any browser and shell take as is."""
    safe = _UNSAFE_IN_FILENAME.sub("_", filename)
    return {"Content-Disposition": f'attachment; filename="{safe}"'}


def build_app(engine: Engine, registry: CollectorRegistry, ready: Callable[[], bool]) -> Starlette:
    def list_requests(request: Request) -> FastJSONResponse:
        q = request.query_params
        min_ms = _number(q.get("min_duration_ms"), "min_duration_ms")
        max_ms = _number(q.get("max_duration_ms"), "max_duration_ms")
        limit = int(_number(q.get("limit"), "limit", 100) or 100)
        f = queries.RequestFilter(
            service=q.get("service") or None,
            route=q.get("route") or None,
            min_duration_ns=None if min_ms is None else int(min_ms * 1e6),
            max_duration_ns=None if max_ms is None else int(max_ms * 1e6),
            status=_status(q.get("status")),
            since_ns=_time_ns(q.get("since"), "since"),
            until_ns=_time_ns(q.get("until"), "until"),
            function=q.get("function") or None,
            order=_choice(q.get("order"), "order", ("duration", "start")),
            limit=max(1, min(limit, MAX_LIMIT)),
        )
        rows = queries.list_requests(engine, f)
        return FastJSONResponse({"requests": [views.summary(r) for r in rows]})

    def get_request(request: Request) -> FastJSONResponse:
        found = queries.get_request(engine, request.path_params["request_id"])
        if found is None:
            raise HTTPException(404, "no such request")
        row, tree = found
        body = views.summary(row)
        body["events"] = row["events"]
        body["lanes"] = views.lanes(tree)
        body["functions"] = [
            {"function": r.pop("name"), **r}
            for r in queries.function_sources(engine, list(tree.functions))
        ]
        return FastJSONResponse(body)

    def _range(request: Request) -> dict:
        q = request.query_params
        return {
            "service": q.get("service") or None,
            "route": q.get("route") or None,
            "since_ns": _time_ns(q.get("since"), "since"),
            "until_ns": _time_ns(q.get("until"), "until"),
        }

    def export_request(request: Request) -> Response:
        choice = _choice(request.query_params.get("format"), "format", exports.REQUEST_FORMATS)
        fmt = exports.FORMATS[choice]
        found = queries.get_request(engine, request.path_params["request_id"])
        if found is None:
            raise HTTPException(404, "no such request")
        row, tree = found
        body = fmt.request(exports.RequestProfile(views.summary(row), views.lanes(tree)))
        filename = f"request-{row['id']}.{fmt.extension}"
        return Response(body, media_type=fmt.media_type, headers=_attachment(filename))

    def _sources(names: list[str]) -> dict[str, tuple[str, int]]:
        return {r["name"]: (r["file"], r["line"]) for r in queries.function_sources(engine, names)}

    def flamegraph(request: Request) -> Response:
        choice = _choice(request.query_params.get("format"), "format", exports.AGGREGATE_FORMATS)
        fmt = exports.FORMATS[choice]
        where = _range(request)
        aggregate = exports.Aggregate(
            queries.stack_totals(engine, **where),
            title=" ".join(filter(None, (where["service"], where["route"]))) or "all requests",
            since_ns=where["since_ns"],
            until_ns=where["until_ns"],
            sources=_sources,
        )
        binary = fmt.media_type == "application/octet-stream"
        headers = _attachment(f"flamegraph.{fmt.extension}") if binary else None
        return Response(fmt.aggregate(aggregate), media_type=fmt.media_type, headers=headers)

    def functions(request: Request) -> FastJSONResponse:
        rows = queries.function_totals(engine, **_range(request))
        return FastJSONResponse({"functions": [{"function": r.pop("name"), **r} for r in rows]})

    def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def healthz(_: Request) -> PlainTextResponse:
        if not ready():
            return PlainTextResponse("starting\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def http_error(_: Request, exc: Exception) -> FastJSONResponse:
        assert isinstance(exc, HTTPException)
        return FastJSONResponse({"error": exc.detail}, status_code=exc.status_code)

    return Starlette(
        routes=[
            Route("/api/requests", list_requests),
            Route("/api/requests/{request_id}", get_request),
            Route("/api/requests/{request_id}/export", export_request),
            Route("/api/flamegraph", flamegraph),
            Route("/api/functions", functions),
            Route("/metrics", metrics),
            Route("/healthz", healthz),
            *ui_routes(),
        ],
        exception_handlers={HTTPException: http_error},
    )
