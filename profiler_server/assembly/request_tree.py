"""One stored request's call tree, typed: what the API's views, the per-request exports and
the summaries read (never the API's JSON), so a node field is added here, once.

`RequestTree` keeps the stored columns as NumPy arrays (whole-tree work over millions of
calls stays vectorised); `whole()` nests them into `Node` objects for the formats that walk
every call."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    active_ns: int
    await_ns: int
    ready_ns: int
    max_slice_ns: int
    suspensions: int
    outcome: str
    children: list[Node] = field(default_factory=list)
    waits: list[Wait] | None = None
    merged: Merged | None = None  # in summaries only


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
    active_ns: np.ndarray
    await_ns: np.ndarray
    ready_ns: np.ndarray
    max_slice_ns: np.ndarray
    suspensions: np.ndarray
    outcome: np.ndarray  # index into OUTCOMES
    waits: dict[int, list[Wait]]

    def __len__(self) -> int:
        return len(self.parent)

    def node(self, i: int) -> Node:
        """Node i alone (no children)."""
        return Node(
            id=i,
            function=self.functions[int(self.function[i])],
            start_ns=int(self.start_ns[i]),
            end_ns=int(self.end_ns[i]),
            self_ns=int(self.self_ns[i]),
            active_ns=int(self.active_ns[i]),
            await_ns=int(self.await_ns[i]),
            ready_ns=int(self.ready_ns[i]),
            max_slice_ns=int(self.max_slice_ns[i]),
            suspensions=int(self.suspensions[i]),
            outcome=OUTCOMES[int(self.outcome[i])],
            waits=self.waits.get(i),
        )

    def whole(self) -> list[Lane]:
        """Every node, nested under its lane's root (one pass builds the nodes, one more
        hangs each under its parent: ~1 µs a node)."""
        names = self.functions
        nodes = [
            Node(i, names[f], s, e, own, a, w, r, m, n, OUTCOMES[o])
            for i, f, s, e, own, a, w, r, m, n, o in zip(
                range(len(self)),
                self.function.tolist(),
                self.start_ns.tolist(),
                self.end_ns.tolist(),
                self.self_ns.tolist(),
                self.active_ns.tolist(),
                self.await_ns.tolist(),
                self.ready_ns.tolist(),
                self.max_slice_ns.tolist(),
                self.suspensions.tolist(),
                self.outcome.tolist(),
                strict=True,
            )
        ]
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
