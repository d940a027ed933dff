"""Stored records -> the API's JSON shapes (DESIGN.md §2) and folded stacks."""

from __future__ import annotations

from datetime import UTC, datetime

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
    """Nests each lane's pre-order node columns into node dicts."""
    names = list(tree.functions)
    depth = tree.depth
    fn = tree.function
    start = tree.start_ns
    end = tree.end_ns
    self_ns = tree.self_ns
    active = tree.active_ns
    await_ns = tree.await_ns
    ready = tree.ready_ns
    slices = tree.max_slice_ns
    susp = tree.suspensions
    outcome = tree.outcome
    out = []
    for lane in tree.lanes:
        stack: list[list] = []
        root = None
        for i in range(lane.first_node, lane.first_node + lane.node_count):
            node = {
                "id": i,
                "function": names[fn[i]],
                "start_ns": start[i],
                "end_ns": end[i],
                "self_ns": self_ns[i],
                "active_ns": active[i],
                "await_ns": await_ns[i],
                "ready_ns": ready[i],
                "max_slice_ns": slices[i],
                "suspensions": susp[i],
                "outcome": _OUTCOMES.get(outcome[i], "truncated"),
                "children": [],
            }
            d = depth[i]
            del stack[d:]
            if stack:
                stack[-1].append(node)
            else:
                root = node
            stack.append(node["children"])
        parent_lane = tree.lanes[lane.parent_lane].id if lane.parent_lane >= 0 else None
        out.append(
            {
                "id": lane.id,
                "kind": _LANE_KINDS.get(lane.kind, "thread"),
                "name": lane.name,
                "parent_lane": parent_lane,
                "parent_node": lane.parent_node if lane.parent_node >= 0 else None,
                "root": root,
            }
        )
    return out


def folded(stacks: list[tuple[str, int, int]]) -> str:
    """flamegraph.pl input: `frame;frame;frame <self_ns>` per line (zero-self stacks skipped)."""
    return "".join(f"{sig} {self_ns}\n" for sig, self_ns, _ in stacks if self_ns > 0)
