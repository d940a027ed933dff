"""The JSON shapes the API answers (views.py builds them; docs/api.md explains each field),
as JSON Schema for the OpenAPI document. Objects may gain fields, so none is closed."""

from __future__ import annotations

from profiler_server.assembly.states import VALUES


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: dict[str, dict], **optional: dict) -> dict:
    return {
        "type": "object",
        "required": list(required),
        "properties": required | optional,
    }


STRING = {"type": "string"}
INT = {"type": "integer"}
NUMBER = {"type": "number"}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_STRING = {"type": ["string", "null"]}

_SUMMARY = {
    "id": STRING,
    "service": STRING,
    "route": STRING,
    "method": STRING,
    "status": NULLABLE_INT,
    "start": {"type": "string", "format": "date-time"},
    "duration_ms": NUMBER,
    "truncated": {"type": "boolean"},
    "calls": INT,
}

_NODE = {
    "id": INT,
    "function": STRING,
    "start_ns": INT,
    "end_ns": INT,
    "self_ns": INT,
    "self_await_ns": INT,
    "self_ready_ns": INT,
    "active_ns": INT,
    "await_ns": INT,
    "ready_ns": INT,
    "max_slice_ns": INT,
    "suspensions": INT,
    "outcome": {"enum": ["return", "exception", "cancelled", "truncated"]},
    "children": {"type": "array", "items": _ref("Node")},
}

_FUNCTION_TOTALS = {
    "function": STRING,
    "file": STRING,
    "line": INT,
    "function_id": INT,
    "calls": INT,
    "total_ns": INT,
    "self_ns": INT,
    "active_ns": INT,
    "await_ns": INT,
    "ready_ns": INT,
    "max_ns": INT,
    "max_slice_ns": INT,
}

NULLABLE_NUMBER = {"type": ["number", "null"]}
_ROUTE = {
    "service": STRING,
    "route": STRING,
    "requests": INT,
    "rate_per_s": NUMBER,
    "errors": INT,
    "error_rate": NUMBER,
    "mean_ms": NUMBER,
    "p50_ms": NULLABLE_NUMBER,
    "p95_ms": NULLABLE_NUMBER,
    "p99_ms": NULLABLE_NUMBER,
    "sampled": INT,
    "sampled_share": NUMBER,
}

COMPONENTS: dict[str, dict] = {
    "Error": _object({"error": STRING}),
    "RequestSummary": _object(_SUMMARY),
    "RequestList": _object(
        {
            "requests": {"type": "array", "items": _ref("RequestSummary")},
            "total": INT,
            "total_capped": {"type": "boolean"},
        }
    ),
    "Services": _object(
        {
            "services": {
                "type": "array",
                "items": _object({"service": STRING, "routes": {"type": "array", "items": STRING}}),
            }
        }
    ),
    "Node": _object(
        _NODE,
        waits={
            "type": "array",
            "items": _object({"start_ns": INT, "ready_ns": NULLABLE_INT, "end_ns": INT}),
        },
        calls=INT,
        wall_ns=INT,
        hidden=INT,
    ),
    "Lane": _object(
        {
            "id": STRING,
            "kind": {"enum": ["main", "task", "thread", "executor"]},
            "name": STRING,
            "parent_lane": NULLABLE_STRING,
            "parent_node": NULLABLE_INT,
            "root": _ref("Node"),
        }
    ),
    "Request": _object(
        _SUMMARY
        | {
            "events": INT,
            "summarised": {"type": "boolean"},
            "lanes": {"type": "array", "items": _ref("Lane")},
            "functions": {
                "type": "array",
                "items": _object({"function": STRING, "file": STRING, "line": INT}),
            },
        }
    ),
    "Subtree": _object(
        {
            "id": STRING,
            "lane": NULLABLE_STRING,
            "summarised": {"type": "boolean"},
            "node": _ref("Node"),
        }
    ),
    "Functions": _object(
        {"functions": {"type": "array", "items": _object(_FUNCTION_TOTALS)}},
    ),
    "Routes": _object(
        {
            "since": {"type": "string", "format": "date-time"},
            "until": {"type": "string", "format": "date-time"},
            "seconds": INT,
            "routes": {"type": "array", "items": _object(_ROUTE)},
        }
    ),
    "Stacks": _object(
        {
            "value": {"type": "string", "enum": list(VALUES)},
            "unit": {"type": "string", "enum": sorted({v.unit for v in VALUES.values()})},
            "stacks": {
                "type": "array",
                "items": _object({"stack": STRING, "value": INT, "calls": INT}),
            },
        }
    ),
}


def ref(name: str) -> dict:
    """A reference to one of COMPONENTS."""
    if name not in COMPONENTS:
        raise KeyError(name)
    return _ref(name)
