"""The HTTP API, declared once: each endpoint's path, parameters and answers. http.py
serves these (parsing every parameter through its definition) and openapi.py publishes
them, so the checks and the document cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from profiler_server import exports
from profiler_server.api.params import (
    Choice,
    FloatRange,
    IntRange,
    Param,
    Status,
    Text,
    Timestamp,
)
from profiler_server.api.schemas import ref
from profiler_server.assembly.states import VALUES
from profiler_server.storage import schema
from profiler_server.ui import STATIC

MAX_LIMIT = 1000
MAX_OFFSET = 10_000_000  # deeper pages: narrow the filters instead
MAX_DURATION_MS = 1e12  # ~31 years: its nanoseconds fit 64 bits
# a longer name cannot be stored, so cannot match
MAX_SERVICE = schema.requests.c.service.type.length
MAX_ROUTE = schema.requests.c.route.type.length
MAX_REQUEST_ID = schema.requests.c.id.type.length
MAX_FUNCTION = 2048
MAX_NODES = 200_000  # nodes in one answer: ~40 MB of JSON, a few seconds to draw
DEFAULT_MAX_NODES = 20_000  # a 10,000-call request comes whole, a bigger one summarised
MAX_NODE_INDEX = 2**31 - 1  # stored node indexes are 32-bit
MAX_FILE = 255


@dataclass(frozen=True)
class Answer:
    """One status of an endpoint: its content types, each with a schema (None: any)."""

    description: str
    content: dict[str, dict | None] = field(default_factory=dict)
    links: dict[str, dict] = field(default_factory=dict)  # OpenAPI links to other endpoints


@dataclass(frozen=True)
class Endpoint:
    name: str  # the handler's name in http.py, and the operationId
    path: str
    summary: str
    params: tuple[Param, ...] = ()
    answers: dict[int, Answer] = field(default_factory=dict)


SERVICE = Text(name="service", description="exact service name", max_chars=MAX_SERVICE)
ROUTE = Text(name="route", description="exact route, as stored", max_chars=MAX_ROUTE)
SINCE = Timestamp(name="since", description="from this time on (inclusive)")
UNTIL = Timestamp(name="until", description="before this time")
REQUEST_ID = Text(
    name="request_id",
    location="path",
    description="a request's `id` as listed",
    max_chars=MAX_REQUEST_ID,
)
RANGE = (SERVICE, ROUTE, SINCE, UNTIL)
STATUS = Status(name="status", description="a code (`404`) or a class (`5xx`)")
LIMIT = IntRange(name="limit", description="at most this many", high=MAX_LIMIT, default_value=100)

LIST_REQUESTS = (
    SERVICE,
    ROUTE,
    Text(name="function", description="`module:qualname` it called", max_chars=MAX_FUNCTION),
    FloatRange(name="min_duration_ms", description="at least this long", high=MAX_DURATION_MS),
    FloatRange(name="max_duration_ms", description="at most this long", high=MAX_DURATION_MS),
    STATUS,
    SINCE,
    UNTIL,
    Choice(name="order", description="slowest or newest first", choices=("duration", "start")),
    LIMIT,
    IntRange(
        name="offset",
        description="skip this many first (paging)",
        low=0,
        high=MAX_OFFSET,
        default_value=0,
    ),
)

JSON = "application/json"
ERROR = {JSON: ref("Error")}
BAD = {400: Answer("a parameter out of its range (the message names it)", ERROR)}
ROUTES = {JSON: ref("Routes")}
NOT_FOUND = {404: Answer("no such request", ERROR)}

FIRST_REQUEST = {
    f"first_{name}": {
        "operationId": name,
        "parameters": {"request_id": "$response.body#/requests/0/id"},
    }
    for name in ("get_request", "export_request")
}


def _formats(names: tuple[str, ...]) -> dict[str, dict | None]:
    return {exports.FORMATS[n].media_type: None for n in names}


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "list_requests",
        "/api/requests",
        "Stored requests, filtered and sorted",
        LIST_REQUESTS,
        {200: Answer("request summaries", {JSON: ref("RequestList")}, FIRST_REQUEST), **BAD},
    ),
    Endpoint(
        "get_request",
        "/api/requests/{request_id}",
        "One request with its call tree: whole, or summarised when bigger than max_nodes",
        (
            REQUEST_ID,
            IntRange(
                name="max_nodes",
                description="at most about this many nodes: a bigger tree comes summarised "
                "(calls on the same call path merged, heaviest expanded first)",
                high=MAX_NODES,
                default_value=DEFAULT_MAX_NODES,
            ),
            IntRange(
                name="node",
                description="only the summary under this node's call path (a node's `id`: "
                "expands a node with `hidden` calls)",
                low=0,
                high=MAX_NODE_INDEX,
                default_value=None,
            ),
        ),
        {
            200: Answer(
                "the request, or with `node` the summary under it",
                {JSON: {"anyOf": [ref("Request"), ref("Subtree")]}},
            ),
            **BAD,
            404: Answer("no such request, or no such node in it", ERROR),
        },
    ),
    Endpoint(
        "export_request",
        "/api/requests/{request_id}/export",
        "One request in another tool's format (an attachment)",
        (
            REQUEST_ID,
            Choice(name="format", description="file format", choices=exports.REQUEST_FORMATS),
        ),
        {
            200: Answer("the file", _formats(exports.REQUEST_FORMATS)),
            **BAD,
            **NOT_FOUND,
            422: Answer(f"a request of over {MAX_NODES:,} nodes: too big to export", ERROR),
        },
    ),
    Endpoint(
        "flamegraph",
        "/api/flamegraph",
        "The stacks of a range, summed (whole minutes)",
        (
            *RANGE,
            Choice(name="format", description="output format", choices=exports.AGGREGATE_FORMATS),
            Choice(
                name="value",
                description="what stacks are weighed by: "
                + "; ".join(f"{v.name}: {v.description}" for v in VALUES.values()),
                choices=tuple(VALUES),
            ),
        ),
        {200: Answer("the stacks", _formats(exports.AGGREGATE_FORMATS)), **BAD},
    ),
    Endpoint(
        "functions",
        "/api/functions",
        "Per-function totals over a range (whole minutes)",
        RANGE,
        {200: Answer("functions, most self time first", {JSON: ref("Functions")}), **BAD},
    ),
    Endpoint(
        "routes",
        "/api/routes",
        "Every request per service and route over a range (whole minutes), sampled or not",
        (
            *RANGE,
            IntRange(
                name="limit",
                description="at most this many routes, most requests first",
                high=MAX_LIMIT,
                default_value=MAX_LIMIT,
            ),
        ),
        {
            200: Answer(
                "per route: rate, errors, percentiles, share sampled", {JSON: ref("Routes")}
            ),
            **BAD,
        },
    ),
    Endpoint(
        "services",
        "/api/services",
        "Each service with the routes of its stored requests in a range",
        (SINCE, UNTIL),
        {200: Answer("services by name", {JSON: ref("Services")}), **BAD},
    ),
    Endpoint(
        "openapi",
        "/openapi.json",
        "This document",
        (),
        {200: Answer("OpenAPI 3.1", {JSON: {"type": "object"}})},
    ),
    Endpoint(
        "metrics",
        "/metrics",
        "Prometheus exposition",
        (),
        {200: Answer("metrics", {"text/plain": None})},
    ),
    Endpoint(
        "healthz",
        "/healthz",
        "Readiness",
        (),
        {
            200: Answer("ready: `ok`", {"text/plain": None}),
            503: Answer("starting", {"text/plain": None}),
        },
    ),
    Endpoint(
        "index",
        "/",
        "The web UI (served by profiler_server.ui)",
        (),
        {200: Answer("its page", {"text/html": None})},
    ),
    Endpoint(
        "ui_file",
        "/ui/{file}",
        "The web UI's scripts and styles (served by profiler_server.ui)",
        (
            Text(
                name="file",
                location="path",
                description="a file name",
                max_chars=MAX_FILE,
                examples=tuple(sorted(p.name for p in STATIC.iterdir())),
            ),
        ),
        {200: Answer("the file", {"*/*": None}), 404: Answer("no such file", ERROR)},
    ),
)
