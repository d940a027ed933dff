"""The stored form of each request's call tree (a `StoredTree` blob), for a whole forest at
once: the per-node columns are encoded with NumPy, the few other fields by protobuf."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from profiler_core.wire import framing, tree_pb2
from profiler_server.assembly import packed
from profiler_server.assembly.calltree import LANE_ROOT
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.totals import groups

_FIELDS = tree_pb2.StoredTree.DESCRIPTOR.fields_by_name
_PARENT, _FUNCTION, _START, _DURATION, _SELF = (
    _FIELDS[name].number
    for name in ("parent", "function", "start_delta_ns", "duration_ns", "self_ns")
)


def _local_functions(
    forest: Forest, names_of: Sequence[Callable[[int], str]]
) -> tuple[np.ndarray, list]:
    """Per node, its index in its request's `functions` (the request's functions by id,
    then its lanes' names); and those lists."""
    owner = forest.owner()
    calls = np.flatnonzero(forest.function != LANE_ROOT)
    local = np.zeros(len(forest), dtype=np.int64)
    counts = np.zeros(len(forest.requests), dtype=np.int64)
    distinct: list[int] = []
    if len(calls):
        number, first = groups(owner[calls], forest.function[calls])
        first_owner = owner[calls][first]
        counts = np.bincount(first_owner, minlength=len(forest.requests))
        begins = np.cumsum(counts) - counts
        local[calls] = number - begins[owner[calls]]
        distinct = forest.function[calls][first].tolist()
    names = []
    taken = 0
    bases = forest.offsets.tolist()
    for base, lanes, count, name in zip(
        bases, forest.lanes, counts.tolist(), names_of, strict=False
    ):
        functions = [name(f) for f in distinct[taken : taken + count]]
        taken += count
        for i, lane in enumerate(lanes):
            local[base + lane.root] = count + i
        names.append(functions + [lane.name for lane in lanes])
    return local, names


def _head(
    forest: Forest,
    r: int,
    names: list[str],
    extras: slice,
    outcomes: slice,
    waits: slice,
    charged: slice,
) -> bytes:
    """Request r's fields but the per-node columns: names, lanes, sparse columns."""
    first = int(forest.offsets[r])
    head = tree_pb2.StoredTree(functions=names)
    for lane in forest.lanes[r]:
        head.lanes.add(
            id=str(lane.lane_id),
            kind=lane.kind,
            name=lane.name,
            root=lane.root,
            parent_lane=-1 if lane.parent_lane is None else lane.parent_lane,
            parent_node=-1 if lane.parent_node is None else lane.parent_node,
        )
    if extras.stop > extras.start:
        head.suspended_node.extend((forest.extra_node[extras] - first).tolist())
        active, waiting, ready, max_slice, suspensions = forest.extras[:, extras].tolist()
        head.active_ns.extend(active)
        head.await_ns.extend(waiting)
        head.ready_ns.extend(ready)
        head.max_slice_ns.extend(max_slice)
        head.suspensions.extend(suspensions)
    if outcomes.stop > outcomes.start:
        head.outcome_node.extend((forest.outcome_node[outcomes] - first).tolist())
        head.outcome = forest.outcome[outcomes].tobytes()
    if waits.stop > waits.start:
        suspended, ready, resumed = forest.waits[:, waits]
        head.wait_node.extend((forest.wait_node[waits] - first).tolist())
        head.wait_start_ns.extend((suspended - forest.requests[r].start).tolist())
        head.wait_ready_ns.extend(np.where(ready >= 0, ready - suspended, -1).tolist())
        head.wait_ns.extend((resumed - suspended).tolist())
    if charged.stop > charged.start:
        head.charged_node.extend((forest.charged_node[charged] - first).tolist())
        awaiting, ready = forest.charged[:, charged].tolist()
        head.charged_await_ns.extend(awaiting)
        head.charged_ready_ns.extend(ready)
    return head.SerializeToString()


def stored_trees(forest: Forest, names_of: Sequence[Callable[[int], str]]) -> list[bytes]:
    """Every request's StoredTree, serialized; `names_of[r]` gives the name of a function
    of request r's session."""
    offsets = forest.offsets
    local_function, names = _local_functions(forest, names_of)
    owner = forest.owner()
    parent = np.where(forest.parent >= 0, forest.parent - offsets[:-1][owner], -1)
    previous = np.empty(len(forest), dtype=np.int64)
    previous[1:] = forest.start[:-1]
    previous[offsets[:-1]] = [r.start for r in forest.requests]
    columns = (
        (_PARENT, packed.zigzag(parent)),
        (_FUNCTION, local_function),
        (_START, packed.zigzag(forest.start - previous)),
        (_DURATION, forest.end - forest.start),
        (_SELF, forest.self_ns),
    )
    encoded = []
    for number, values in columns:
        data, ends = packed.varints(values)
        encoded.append((number, data, np.concatenate([[0], ends])[offsets].tolist()))
    extras_at = np.searchsorted(forest.extra_node, offsets).tolist()
    outcomes_at = np.searchsorted(forest.outcome_node, offsets).tolist()
    waits_at = np.searchsorted(forest.wait_node, offsets).tolist()
    charged_at = np.searchsorted(forest.charged_node, offsets).tolist()
    trees = []
    for r in range(len(forest.requests)):
        extras = slice(extras_at[r], extras_at[r + 1])
        outcomes = slice(outcomes_at[r], outcomes_at[r + 1])
        waits = slice(waits_at[r], waits_at[r + 1])
        charged = slice(charged_at[r], charged_at[r + 1])
        parts = [_head(forest, r, names[r], extras, outcomes, waits, charged)]
        for number, data, at in encoded:
            parts.append(framing.field(number, data[at[r] : at[r + 1]].tobytes()))
        trees.append(b"".join(parts))
    return trees
