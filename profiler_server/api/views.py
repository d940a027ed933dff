"""Stored records -> the API's JSON shapes (docs/api.md)."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from operator import attrgetter

from profiler_server.assembly.request_tree import (
    MERGED_BY,
    Lane,
    LaneHead,
    Node,
    RequestTree,
    Wait,
)
from profiler_server.storage.route_stats import RouteStats


def iso(ns: int) -> str:
    return (
        datetime.fromtimestamp(ns / 1e9, UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


def summary(row: dict) -> dict:
    return {
        "id": row["id"],
        "service": row["service"],
        "route": row["route"],
        "method": row["method"],
        "status": row["status"],
        "start": iso(row["start_ns"]),
        "duration_ms": row["duration_ns"] / 1e6,
        "truncated": bool(row["truncated"]),
        "calls": row["calls"],
    }


def routes(stats: list[RouteStats], first_minute: int, last_minute: int) -> dict:
    """Rates are over the whole minutes of the range; the share sampled may pass 1 where
    a host's last counts were lost (its requests were stored, its report was not)."""
    seconds = (last_minute - first_minute + 1) * 60
    return {
        "since": iso(first_minute * 60_000_000_000),
        "until": iso((last_minute + 1) * 60_000_000_000),
        "seconds": seconds,
        "routes": [
            {
                "service": s.service,
                "route": s.route,
                "requests": s.requests,
                "rate_per_s": s.requests / seconds,
                "errors": s.errors,
                "error_rate": s.errors / s.requests,
                "mean_ms": s.duration_ns / s.requests / 1e6,
                "p50_ms": s.percentile_ms(0.5),
                "p95_ms": s.percentile_ms(0.95),
                "p99_ms": s.percentile_ms(0.99),
                "sampled": s.sampled,
                "sampled_share": s.sampled / s.requests,
            }
            for s in stats
            if s.requests > 0
        ],
    }


_NODE_FIELDS = tuple(f.name for f in fields(Node) if f.name not in ("children", "waits", "merged"))
assert ("id", *MERGED_BY) == _NODE_FIELDS  # whole_lanes builds them from the columns
_node_values = attrgetter(*_NODE_FIELDS)
_WHOLE_KEYS = (*_NODE_FIELDS, "children")
_WAIT_FIELDS = tuple(f.name for f in fields(Wait))
_wait_values = attrgetter(*_WAIT_FIELDS)


def node(top: Node) -> dict:
    """A node and everything under it as JSON dicts, the fields named as in `Node` (waits
    only where kept; a summary's count, summed wall and hidden calls only in summaries).
    Iterative: call trees can be deeper than Python's recursion limit."""
    out = _node_dict(top)
    todo = [(top, out)]
    while todo:
        current, shown = todo.pop()
        children = shown["children"]
        for child in current.children:
            child_dict = _node_dict(child)
            children.append(child_dict)
            todo.append((child, child_dict))
    return out


def _node_dict(n: Node) -> dict:
    out = dict(zip(_NODE_FIELDS, _node_values(n), strict=True))
    out["children"] = []
    if n.waits is not None:
        out["waits"] = _waits(n.waits)
    if n.merged is not None:
        out["calls"] = n.merged.calls
        out["wall_ns"] = n.merged.wall_ns
        out["hidden"] = n.merged.hidden
    return out


def _waits(waits: list[Wait]) -> list[dict]:
    return [dict(zip(_WAIT_FIELDS, _wait_values(w), strict=True)) for w in waits]


def lanes(shown: list[Lane]) -> list[dict]:
    """Each lane with its nodes nested under its root."""
    return [_lane(lane, node(lane.root)) for lane in shown]


def whole_lanes(tree: RequestTree) -> list[dict]:
    """`lanes(tree.whole())`, built from the columns without `Node` objects in between (half
    the time for a 10,000-call request; tests compare the two)."""
    columns = [tree.labelled(name, getattr(tree, name).tolist()) for name in MERGED_BY]
    size = len(tree)
    empty_lists = ([] for _ in range(size))
    rows = zip(range(size), *columns, empty_lists, strict=True)
    nodes = [dict(zip(_WHOLE_KEYS, row, strict=True)) for row in rows]
    for i, waits in tree.waits.items():
        nodes[i]["waits"] = _waits(waits)
    for shown, parent in zip(nodes, tree.parent.tolist(), strict=True):
        if parent >= 0:
            nodes[parent]["children"].append(shown)
    return [_lane(head, nodes[head.root]) for head in tree.lanes]


def _lane(lane: Lane | LaneHead, root: dict) -> dict:
    return {
        "id": lane.id,
        "kind": lane.kind,
        "name": lane.name,
        "parent_lane": lane.parent_lane,
        "parent_node": lane.parent_node,
        "root": root,
    }
