"""The aggregate as Grafana's nested-set frame, which its native Flame Graph panel draws:
one row per call-tree node in preorder with `level` (depth, the root 0), `value` (total: its
self plus its children's values), `self` and `label`. Served as a data frame in Grafana's
field layout (`{"fields": [{"name", "type", "values"}, ...]}`), the shape its JSON-reading
data sources and the TestData "raw frames" scenario take."""

from __future__ import annotations

from profiler_core.stacks import SEPARATOR
from profiler_server.exports.base import Aggregate, Format, Stacks, json_bytes

ROOT = "total"


class _Node:
    __slots__ = ("children", "self_ns", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.self_ns = 0
        self.value = 0


def _tree(stacks: Stacks) -> _Node:
    root = _Node()
    for sig, self_ns, _ in stacks:
        node = root
        node.value += self_ns
        for frame in sig.split(SEPARATOR):
            child = node.children.get(frame)
            if child is None:
                child = node.children[frame] = _Node()
            node = child
            node.value += self_ns
        node.self_ns += self_ns
    return root


def rows(stacks: Stacks) -> tuple[list[int], list[int], list[int], list[str]]:
    """(levels, values, selfs, labels) in preorder; children heaviest first."""
    levels: list[int] = []
    values: list[int] = []
    selfs: list[int] = []
    labels: list[str] = []
    todo = [(ROOT, _tree(stacks), 0)]
    while todo:
        label, node, level = todo.pop()
        levels.append(level)
        values.append(node.value)
        selfs.append(node.self_ns)
        labels.append(label)
        ranked = sorted(node.children.items(), key=lambda kv: (-kv[1].value, kv[0]))
        todo.extend((name, child, level + 1) for name, child in reversed(ranked))
    return levels, values, selfs, labels


def render_aggregate(aggregate: Aggregate) -> bytes:
    levels, values, selfs, labels = rows(aggregate.stacks)
    ns = {"unit": "ns" if aggregate.value.unit == "nanoseconds" else "short"}
    return json_bytes(
        {
            "name": f"{aggregate.title} ({aggregate.value.name})",
            "meta": {"preferredVisualisationType": "flamegraph"},
            "fields": [
                {"name": "level", "type": "number", "values": levels},
                {"name": "value", "type": "number", "values": values, "config": ns},
                {"name": "self", "type": "number", "values": selfs, "config": ns},
                {"name": "label", "type": "string", "values": labels},
            ],
        }
    )


FORMAT = Format("grafana", "application/json", "json", aggregate=render_aggregate)
