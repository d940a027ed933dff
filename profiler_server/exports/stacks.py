"""The aggregate as the API's own JSON: `{"value", "unit", "stacks": [{"stack", "value",
"calls"}, ...]}`, `value` naming what each stack's value is (states.VALUES)."""

from __future__ import annotations

from profiler_server.exports.base import Aggregate, Format, json_bytes


def render_aggregate(aggregate: Aggregate) -> bytes:
    return json_bytes(
        {
            "value": aggregate.value.name,
            "unit": aggregate.value.unit,
            "stacks": [{"stack": s, "value": n, "calls": c} for s, n, c in aggregate.stacks],
        }
    )


FORMAT = Format("json", "application/json", "json", aggregate=render_aggregate)
