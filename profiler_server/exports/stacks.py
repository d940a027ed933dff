"""The aggregate as the API's own JSON: `{"stacks": [{"stack", "self_ns", "calls"}, ...]}`."""

from __future__ import annotations

from profiler_server.exports.base import Aggregate, Format, json_bytes


def render_aggregate(aggregate: Aggregate) -> bytes:
    return json_bytes(
        {"stacks": [{"stack": s, "self_ns": n, "calls": c} for s, n, c in aggregate.stacks]}
    )


FORMAT = Format("json", "application/json", "json", aggregate=render_aggregate)
