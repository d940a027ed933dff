"""One stored request's call tree, typed: what the API's views, the per-request exports and
the summaries read (never the API's JSON), so a node field is added here, once: to `Node`,
`MERGED_BY`, the `RequestTree` column and `read`.

`RequestTree` keeps the stored columns as NumPy arrays (whole-tree work over millions of
calls stays vectorised); `whole()` nests them into `Node` objects for the formats that walk
every call."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from profiler_core.model import LaneKind, Outcome
from profiler_core.wire import tree_pb2

OUTCOMES = tuple(o.label for o in Outcome)  # by stored code; an unknown code: truncated
LANE_KINDS = {k.value: k.label for k in LaneKind}


@dataclass(frozen=True, slots=True)
class Wait:
    """One suspension of a call: awaiting from start, ready (None: not recorded) to end."""

    start_ns: int
    ready_ns: int | None
    end_ns: int


@dataclass(frozen=True, slots=True)
class Merged:
    """What a summary's node stands for: `calls` calls of the same function on the same
    call path, `wall_ns` their wall times summed; `hidden` calls directly under them are
    left out of the summary (the API expands them with `?node=<id>`)."""

    calls: int
    wall_ns: int
    hidden: int


@dataclass(slots=True)
class Node:
    """A call (or a lane's synthetic root): times in ns since the request began."""

    id: int
    function: str
    start_ns: int
    end_ns: int
    self_ns: int
    self_await_ns: int  # what the lane waited on this call (assembly/states.py)
    self_ready_ns: int
    active_ns: int
    await_ns: int
    ready_ns: int
    max_slice_ns: int
    suspensions: int
    outcome: str
    children: list[Node] = field(default_factory=list)
    waits: list[Wait] | None = None
    merged: Merged | None = None  # in summaries only


# Node's fields after `id`, each a RequestTree column, with how a summary merges the values
# of the calls it merges (a call path's calls share their function).
MERGED_BY = {
    "function": "same",
    "start_ns": "min",
    "end_ns": "max",
    "self_ns": "sum",
    "self_await_ns": "sum",
    "self_ready_ns": "sum",
    "active_ns": "sum",
    "await_ns": "sum",
    "ready_ns": "sum",
    "max_slice_ns": "max",
    "suspensions": "sum",
    "outcome": "max",  # the least ordinary: return < exception < cancelled < truncated
}
assert tuple(f.name for f in fields(Node))[1 : len(MERGED_BY) + 1] == tuple(MERGED_BY)


@dataclass(frozen=True, slots=True)
class Lane:
    """A thread or task of the request, its calls under `root`."""

    id: str
    kind: str
    name: str
    parent_lane: str | None
    parent_node: int | None
    root: Node


@dataclass(frozen=True, slots=True)
class LaneHead:
    """A lane as stored: its root is a node index."""

    id: str
    kind: str
    name: str
    parent_lane: str | None
    parent_node: int | None
    root: int


@dataclass(frozen=True)
class RequestTree:
    """Per node (by stored index) its fields as columns; `lanes` are the ones shown."""

    functions: list[str]
    lanes: list[LaneHead]
    parent: np.ndarray
    function: np.ndarray  # index into functions
    start_ns: np.ndarray
    end_ns: np.ndarray
    self_ns: np.ndarray
    self_await_ns: np.ndarray
    self_ready_ns: np.ndarray
    active_ns: np.ndarray
    await_ns: np.ndarray
    ready_ns: np.ndarray
    max_slice_ns: np.ndarray
    suspensions: np.ndarray
    outcome: np.ndarray  # index into OUTCOMES
    waits: dict[int, list[Wait]]

    def __len__(self) -> int:
        return len(self.parent)

    def labelled(self, name: str, values: list[int]) -> list:
        """A column's values as Node holds them (function and outcome by name)."""
        if name == "function":
            return [self.functions[f] for f in values]
        if name == "outcome":
            return [OUTCOMES[o] for o in values]
        return values

    def whole(self) -> list[Lane]:
        """Every node, nested under its lane's root (one pass builds the nodes, one more
        hangs each under its parent: ~1 µs a node)."""
        columns = [self.labelled(name, getattr(self, name).tolist()) for name in MERGED_BY]
        nodes = [Node(i, *row) for i, row in enumerate(zip(*columns, strict=True))]
        for i, waits in self.waits.items():
            nodes[i].waits = waits
        for node, p in zip(nodes, self.parent.tolist(), strict=True):
            if p >= 0:
                nodes[p].children.append(node)
        return [self.lane(head, nodes[head.root]) for head in self.lanes]

    @staticmethod
    def lane(head: LaneHead, root: Node) -> Lane:
        return Lane(head.id, head.kind, head.name, head.parent_lane, head.parent_node, root)


def read(tree: tree_pb2.StoredTree) -> RequestTree:
    """The stored blob's columns, decoded (sparse columns spread to every node)."""
    parent = np.array(tree.parent, dtype=np.int64)
    size = len(parent)
    start = np.cumsum(np.array(tree.start_delta_ns, dtype=np.int64).reshape(size))
    duration = np.array(tree.duration_ns, dtype=np.int64).reshape(size)
    active = duration.copy()
    await_ns = np.zeros(size, dtype=np.int64)
    ready = np.zeros(size, dtype=np.int64)
    max_slice = duration.copy()
    suspensions = np.zeros(size, dtype=np.int64)
    suspended = np.array(tree.suspended_node, dtype=np.int64)
    self_await = np.zeros(size, dtype=np.int64)
    self_ready = np.zeros(size, dtype=np.int64)
    charged = np.array(tree.charged_node, dtype=np.int64)
    self_await[charged] = np.array(tree.charged_await_ns, dtype=np.int64)
    self_ready[charged] = np.array(tree.charged_ready_ns, dtype=np.int64)
    for column, values in (
        (active, tree.active_ns),
        (await_ns, tree.await_ns),
        (ready, tree.ready_ns),
        (max_slice, tree.max_slice_ns),
        (suspensions, tree.suspensions),
    ):
        column[suspended] = np.array(values, dtype=np.int64)
    outcome = np.zeros(size, dtype=np.int64)
    codes = np.frombuffer(tree.outcome, dtype=np.uint8).astype(np.int64)
    outcome[np.array(tree.outcome_node, dtype=np.int64)] = np.where(
        codes < len(OUTCOMES), codes, Outcome.TRUNCATED
    )
    waits: dict[int, list[Wait]] = {}
    for i, begin, until_ready, length in zip(
        tree.wait_node, tree.wait_start_ns, tree.wait_ready_ns, tree.wait_ns, strict=True
    ):
        ready_at = None if until_ready < 0 else begin + until_ready
        waits.setdefault(i, []).append(Wait(begin, ready_at, begin + length))
    children = np.bincount(parent[parent >= 0], minlength=size)
    return RequestTree(
        functions=list(tree.functions),
        lanes=_lanes_shown(tree, children),
        parent=parent,
        function=np.array(tree.function, dtype=np.int64).reshape(size),
        start_ns=start,
        end_ns=start + duration,
        self_ns=np.array(tree.self_ns, dtype=np.int64).reshape(size),
        self_await_ns=self_await,
        self_ready_ns=self_ready,
        active_ns=active,
        await_ns=await_ns,
        ready_ns=ready,
        max_slice_ns=max_slice,
        suspensions=suspensions,
        outcome=outcome,
        waits=waits,
    )


def _lanes_shown(tree: tree_pb2.StoredTree, children: np.ndarray) -> list[LaneHead]:
    """The main lane, and every lane that recorded a call or spawned a lane shown: a pool's
    worker thread started by the request, or a task that ran nothing instrumented, is noise
    (lanes come parents first, so one pass from the end sees children first)."""
    spawned_shown: set[int] = set()
    shown = []
    for lane in reversed(tree.lanes):
        own_id = int(lane.id) if lane.id.isdigit() else -2
        if lane.parent_lane < 0 or children[lane.root] or own_id in spawned_shown:
            shown.append(
                LaneHead(
                    id=lane.id,
                    kind=LANE_KINDS.get(lane.kind, "thread"),
                    name=lane.name,
                    parent_lane=str(lane.parent_lane) if lane.parent_lane >= 0 else None,
                    parent_node=lane.parent_node if lane.parent_node >= 0 else None,
                    root=lane.root,
                )
            )
            spawned_shown.add(lane.parent_lane)
    return shown[::-1]
