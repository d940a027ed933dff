"""Stored records -> the API's JSON shapes (DESIGN.md §2) and folded stacks."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import accumulate

from profiler_core.model import LaneKind, Outcome
from profiler_core.wire import tree_pb2

_OUTCOMES = {o.value: o.label for o in Outcome}
_LANE_KINDS = {k.value: k.label for k in LaneKind}


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


def lanes(tree: tree_pb2.StoredTree) -> list[dict]:
    """Nests the stored columns into each lane's node dicts."""
    names = tree.functions
    function, parent = tree.function, tree.parent
    start = list(accumulate(tree.start_delta_ns))
    duration, self_ns = tree.duration_ns, tree.self_ns
    nodes = [
        {
            "id": i,
            "function": names[function[i]],
            "start_ns": start[i],
            "end_ns": start[i] + duration[i],
            "self_ns": self_ns[i],
            "active_ns": duration[i],
            "await_ns": 0,
            "ready_ns": 0,
            "max_slice_ns": duration[i],
            "suspensions": 0,
            "outcome": "return",
            "children": [],
        }
        for i in range(len(function))
    ]
    for k, i in enumerate(tree.suspended_node):
        node = nodes[i]
        node["active_ns"] = tree.active_ns[k]
        node["await_ns"] = tree.await_ns[k]
        node["ready_ns"] = tree.ready_ns[k]
        node["max_slice_ns"] = tree.max_slice_ns[k]
        node["suspensions"] = tree.suspensions[k]
    for i, outcome in zip(tree.outcome_node, tree.outcome, strict=True):
        nodes[i]["outcome"] = _OUTCOMES.get(outcome, "truncated")
    for i, p in enumerate(parent):
        if p >= 0:
            nodes[p]["children"].append(nodes[i])
    return [
        {
            "id": lane.id,
            "kind": _LANE_KINDS.get(lane.kind, "thread"),
            "name": lane.name,
            "parent_lane": str(lane.parent_lane) if lane.parent_lane >= 0 else None,
            "parent_node": lane.parent_node if lane.parent_node >= 0 else None,
            "root": nodes[lane.root],
        }
        for lane in tree.lanes
    ]


def folded(stacks: list[tuple[str, int, int]]) -> str:
    """flamegraph.pl input: `frame;frame;frame <self_ns>` per line (zero-self stacks skipped)."""
    return "".join(f"{sig} {self_ns}\n" for sig, self_ns, _ in stacks if self_ns > 0)
