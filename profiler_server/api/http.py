"""HTTP: JSON API, /openapi.json, /metrics, /healthz, web UI (Starlette; sync endpoints run
in its thread pool). The endpoints and their parameters are spec.py's: each handler gets
its parameters parsed and range-checked, a bad one is answered 400 here and counted."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from profiler_server import exports
from profiler_server.api import openapi, params, spec, views
from profiler_server.assembly import request_tree, summary
from profiler_server.assembly.states import VALUES
from profiler_server.metrics.health import ServerHealth
from profiler_server.storage import queries, route_stats
from profiler_server.ui import routes as ui_routes


class FastJSONResponse(JSONResponse):
    """Compact UTF-8 JSON like Starlette's, encoded by orjson: a call tree of 10,000 nodes
    (2 MB) takes 3-6 ms instead of 40-80 ms. What orjson refuses (an integer beyond 64 bits,
    say a sum over a very long range) falls back to the stdlib encoder."""

    def render(self, content: Any) -> bytes:
        return exports.json_bytes(content)


_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


def _attachment(filename: str) -> dict[str, str]:
    """A download with a name any browser and shell take as is."""
    safe = _UNSAFE_IN_FILENAME.sub("_", filename)
    return {"Content-Disposition": f'attachment; filename="{safe}"'}


def build_app(
    engine: Engine,
    registry: CollectorRegistry,
    health: ServerHealth,
    ready: Callable[[], bool],
) -> Starlette:
    for endpoint in spec.ENDPOINTS:  # every refusal a series at 0 from the start
        for param in endpoint.params:
            for reason in param.REASONS:
                health.api_rejected.labels(param.name, reason)

    def list_requests(a: dict) -> FastJSONResponse:
        min_ms, max_ms = a["min_duration_ms"], a["max_duration_ms"]
        f = queries.RequestFilter(
            service=a["service"],
            route=a["route"],
            min_duration_ns=None if min_ms is None else int(min_ms * 1e6),
            max_duration_ns=None if max_ms is None else int(max_ms * 1e6),
            status=a["status"],
            since_ns=a["since"],
            until_ns=a["until"],
            function=a["function"],
            order=a["order"],
            limit=a["limit"],
            offset=a["offset"],
        )
        rows, total = queries.list_requests(engine, f)
        return FastJSONResponse(
            {
                "requests": [views.summary(r) for r in rows],
                "total": min(total, queries.MAX_COUNT),
                "total_capped": total > queries.MAX_COUNT,
            }
        )

    def services(a: dict) -> FastJSONResponse:
        found = queries.service_routes(engine, a["since"], a["until"])
        return FastJSONResponse({"services": found})

    def _stored(request_id: str) -> tuple[dict, request_tree.RequestTree]:
        found = queries.get_request(engine, request_id)
        if found is None:
            raise HTTPException(404, "no such request")
        row, stored = found
        return row, request_tree.read(stored)

    def get_request(a: dict) -> FastJSONResponse:
        row, tree = _stored(a["request_id"])
        max_nodes, node = a["max_nodes"], a["node"]
        if node is not None:
            if node >= len(tree):
                raise HTTPException(404, f"no node {node} in this request")
            below = summary.subtree(tree, node, max_nodes)
            lane = summary.lane_of(tree, node)
            return FastJSONResponse(
                {"id": row["id"], "lane": lane, "summarised": True, "node": views.node(below)}
            )
        body = views.summary(row)
        body["events"] = row["events"]
        body["summarised"] = len(tree) > max_nodes
        if body["summarised"]:
            body["lanes"] = views.lanes(summary.summarise(tree, max_nodes))
        else:
            body["lanes"] = views.whole_lanes(tree)
        body["functions"] = [
            {"function": r.pop("name"), **r}
            for r in queries.function_sources(engine, tree.functions)
        ]
        return FastJSONResponse(body)

    def _range(a: dict) -> dict:
        return {
            "service": a["service"],
            "route": a["route"],
            "since_ns": a["since"],
            "until_ns": a["until"],
        }

    def export_request(a: dict) -> Response:
        fmt = exports.FORMATS[a["format"]]
        row, tree = _stored(a["request_id"])
        if len(tree) > spec.MAX_NODES:  # every call becomes an object: memory bounded
            message = f"{len(tree):,} nodes: over {spec.MAX_NODES:,}, too big to export"
            raise HTTPException(422, message)
        body = fmt.request(exports.RequestProfile(views.summary(row), tree.whole()))
        filename = f"request-{row['id']}.{fmt.extension}"
        return Response(body, media_type=fmt.media_type, headers=_attachment(filename))

    def _sources(names: list[str]) -> dict[str, tuple[str, int]]:
        return {r["name"]: (r["file"], r["line"]) for r in queries.function_sources(engine, names)}

    def flamegraph(a: dict) -> Response:
        fmt = exports.FORMATS[a["format"]]
        where = _range(a)
        aggregate = exports.Aggregate(
            queries.stack_totals(engine, **where, value=VALUES[a["value"]]),
            title=" ".join(filter(None, (where["service"], where["route"]))) or "all requests",
            since_ns=where["since_ns"],
            until_ns=where["until_ns"],
            sources=_sources,
            value=VALUES[a["value"]],
        )
        binary = fmt.media_type == "application/octet-stream"
        headers = _attachment(f"flamegraph.{fmt.extension}") if binary else None
        return Response(fmt.aggregate(aggregate), media_type=fmt.media_type, headers=headers)

    def functions(a: dict) -> FastJSONResponse:
        rows = queries.function_totals(engine, **_range(a))
        return FastJSONResponse({"functions": [{"function": r.pop("name"), **r} for r in rows]})

    def routes(a: dict) -> FastJSONResponse:
        stats, first, last = route_stats.route_stats(engine, **_range(a), limit=a["limit"])
        return FastJSONResponse(views.routes(stats, first, last))

    published = openapi.document()

    def openapi_json(_: dict) -> FastJSONResponse:
        return FastJSONResponse(published)

    def metrics(_: dict) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def healthz(_: dict) -> PlainTextResponse:
        if not ready():
            return PlainTextResponse("starting\n", status_code=503)
        return PlainTextResponse("ok\n")

    handlers: dict[str, Callable[[dict], Response]] = {
        "list_requests": list_requests,
        "get_request": get_request,
        "export_request": export_request,
        "flamegraph": flamegraph,
        "functions": functions,
        "routes": routes,
        "services": services,
        "openapi": openapi_json,
        "metrics": metrics,
        "healthz": healthz,
    }

    def route(endpoint: spec.Endpoint) -> Route:
        handler = handlers[endpoint.name]

        def run(request: Request) -> Response:
            try:
                args = params.parse_all(endpoint.params, request.query_params, request.path_params)
            except params.BadParameter as bad:
                health.api_rejected.labels(bad.name, bad.reason).inc()
                return FastJSONResponse({"error": str(bad)}, status_code=400)
            return handler(args)

        return Route(endpoint.path, run, methods=["GET"], name=endpoint.name)

    async def http_error(_: Request, exc: Exception) -> FastJSONResponse:
        assert isinstance(exc, HTTPException)
        return FastJSONResponse(
            {"error": exc.detail}, status_code=exc.status_code, headers=exc.headers
        )

    return Starlette(
        routes=[route(e) for e in spec.ENDPOINTS if e.name in handlers] + ui_routes(),
        exception_handlers={HTTPException: http_error},
    )
