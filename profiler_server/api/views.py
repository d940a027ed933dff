"""Stored records -> the API's JSON shapes (docs/api.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import accumulate

from profiler_core.model import LaneKind, Outcome
from profiler_core.wire import tree_pb2
from profiler_server.storage.route_stats import RouteStats

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


def lanes(tree: tree_pb2.StoredTree) -> list[dict]:
    """Nests the stored columns into each lane's node dicts.

    The hot path of `GET /api/requests/{id}` (10,000 nodes and more, ~1 µs each): one pass
    zips the columns into node dicts, sparse columns patch the few nodes they name, and one
    more pass hangs each node under its parent."""
    names = tree.functions
    function_names = [names[f] for f in tree.function]
    nodes = [
        {
            "id": i,
            "function": name,
            "start_ns": start,
            "end_ns": start + d,
            "self_ns": self_ns,
            "self_await_ns": 0,
            "self_ready_ns": 0,
            "active_ns": d,
            "await_ns": 0,
            "ready_ns": 0,
            "max_slice_ns": d,
            "suspensions": 0,
            "outcome": "return",
            "children": [],
        }
        for i, name, start, d, self_ns in zip(
            range(len(function_names)),
            function_names,
            accumulate(tree.start_delta_ns),
            tree.duration_ns,
            tree.self_ns,
            strict=True,
        )
    ]
    for i, active, await_ns, ready, max_slice, suspensions in zip(
        tree.suspended_node,
        tree.active_ns,
        tree.await_ns,
        tree.ready_ns,
        tree.max_slice_ns,
        tree.suspensions,
        strict=True,
    ):
        node = nodes[i]
        node["active_ns"] = active
        node["await_ns"] = await_ns
        node["ready_ns"] = ready
        node["max_slice_ns"] = max_slice
        node["suspensions"] = suspensions
    for i, awaiting, ready in zip(
        tree.charged_node, tree.charged_await_ns, tree.charged_ready_ns, strict=True
    ):
        nodes[i]["self_await_ns"] = awaiting
        nodes[i]["self_ready_ns"] = ready
    for i, outcome in zip(tree.outcome_node, tree.outcome, strict=True):
        nodes[i]["outcome"] = _OUTCOMES.get(outcome, "truncated")
    for i, start, ready, length in zip(
        tree.wait_node, tree.wait_start_ns, tree.wait_ready_ns, tree.wait_ns, strict=True
    ):
        nodes[i].setdefault("waits", []).append(
            {
                "start_ns": start,
                "ready_ns": None if ready < 0 else start + ready,
                "end_ns": start + length,
            }
        )
    for node, p in zip(nodes, tree.parent, strict=True):
        if p >= 0:
            nodes[p]["children"].append(node)
    shown = _lanes_shown(tree, nodes)
    return [
        {
            "id": lane.id,
            "kind": _LANE_KINDS.get(lane.kind, "thread"),
            "name": lane.name,
            "parent_lane": str(lane.parent_lane) if lane.parent_lane >= 0 else None,
            "parent_node": lane.parent_node if lane.parent_node >= 0 else None,
            "root": nodes[lane.root],
        }
        for lane in shown
    ]


def _lanes_shown(tree: tree_pb2.StoredTree, nodes: list[dict]) -> list[tree_pb2.StoredLane]:
    """The main lane, and every lane that recorded a call or spawned a lane shown: a pool's
    worker thread started by the request, or a task that ran nothing instrumented, is noise
    (lanes come parents first, so one pass from the end sees children first)."""
    spawned_shown: set[int] = set()
    shown = []
    for lane in reversed(tree.lanes):
        own_id = int(lane.id) if lane.id.isdigit() else -2
        if lane.parent_lane < 0 or nodes[lane.root]["children"] or own_id in spawned_shown:
            shown.append(lane)
            spawned_shown.add(lane.parent_lane)
    return shown[::-1]
