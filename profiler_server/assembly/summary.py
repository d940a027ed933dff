"""A bounded summary of a request too big to send whole (a request of millions of calls is
hundreds of MB as JSON): calls on the same call path of a lane (the same function under the
same parent, recursively) are merged into one node with their count and summed times, and
nodes are expanded heaviest first until the answer holds `max_nodes` nodes, and no deeper
than MAX_DEPTH levels (a chain of thousands of recursive calls would be as many rows to
draw). A node whose calls are left out says how many lie directly under it; `subtree`
summarises it in turn.

Call paths are found level by level with NumPy (a few array operations per level of depth),
so a 2 M-call request is summarised in about a second whatever its shape."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from profiler_server.assembly.request_tree import OUTCOMES, Lane, Merged, Node, RequestTree


@dataclass(frozen=True)
class Paths:
    """Per node its call path; per path its parent path, first node and totals."""

    of_node: np.ndarray
    parent: np.ndarray  # -1: a lane's root
    first: np.ndarray  # the path's lowest node index (its id in the answer)
    function: np.ndarray
    calls: np.ndarray
    wall_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    sums: dict[str, np.ndarray]  # self, active, await, ready, suspensions: summed
    max_slice_ns: np.ndarray
    outcome: np.ndarray  # the least ordinary outcome of its calls
    child_begin: np.ndarray  # children of path p: child_paths[child_begin[p]:child_begin[p+1]]
    child_paths: np.ndarray


_SUMMED = ("self_ns", "active_ns", "await_ns", "ready_ns", "suspensions")
MAX_DEPTH = 256  # levels below an answer's root: 256 rows of the timeline


def _children(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of a parent column: children of i are order[begin[i]:begin[i+1]], in index order."""
    order = np.argsort(parent, kind="stable")
    begin = np.searchsorted(parent[order], np.arange(len(parent) + 1))
    return order, begin


def _gather(order: np.ndarray, begin: np.ndarray, of: np.ndarray) -> np.ndarray:
    """The children of every index in `of`, concatenated."""
    counts = begin[of + 1] - begin[of]
    total = int(counts.sum())
    offsets = np.repeat(begin[of] - (np.cumsum(counts) - counts), counts)
    return order[offsets + np.arange(total)]


def paths(tree: RequestTree) -> Paths:
    """Every node's call path, numbered level by level (roots first)."""
    size = len(tree)
    order, begin = _children(tree.parent)
    of_node = np.full(size, -1, dtype=np.int64)
    level = np.flatnonzero(tree.parent < 0)
    of_node[level] = np.arange(len(level))
    path_parent = [np.full(len(level), -1, dtype=np.int64)]
    path_function = [tree.function[level]]
    taken = len(level)
    width = int(tree.function.max(initial=0)) + 1
    while len(level):
        level = _gather(order, begin, level)
        if not len(level):
            break
        key = of_node[tree.parent[level]] * width + tree.function[level]
        distinct, inverse = np.unique(key, return_inverse=True)
        of_node[level] = taken + inverse
        path_parent.append(distinct // width)
        path_function.append(distinct % width)
        taken += len(distinct)
    by_path = np.argsort(of_node, kind="stable")
    cuts = np.searchsorted(of_node[by_path], np.arange(taken))
    calls = np.diff(np.append(cuts, size))
    parent = np.concatenate(path_parent)
    path_order, path_begin = _children(parent)
    return Paths(
        of_node=of_node,
        parent=parent,
        first=np.minimum.reduceat(by_path, cuts),
        function=np.concatenate(path_function),
        calls=calls,
        wall_ns=np.add.reduceat((tree.end_ns - tree.start_ns)[by_path], cuts),
        start_ns=np.minimum.reduceat(tree.start_ns[by_path], cuts),
        end_ns=np.maximum.reduceat(tree.end_ns[by_path], cuts),
        sums={name: np.add.reduceat(getattr(tree, name)[by_path], cuts) for name in _SUMMED},
        max_slice_ns=np.maximum.reduceat(tree.max_slice_ns[by_path], cuts),
        outcome=np.maximum.reduceat(tree.outcome[by_path], cuts),
        child_begin=path_begin,
        child_paths=path_order,
    )


def _kids(p: Paths, path: int) -> list[int]:
    return p.child_paths[p.child_begin[path] : p.child_begin[path + 1]].tolist()


def _select(p: Paths, roots: list[int], max_nodes: int) -> set[int]:
    """The paths expanded (all their child paths shown): heaviest first, a path's children
    all or none, until max_nodes are shown, down to MAX_DEPTH levels."""
    shown = len(roots)
    heap = [(-int(p.wall_ns[r]), r, 0) for r in roots]
    heapq.heapify(heap)
    expanded = set()
    while heap:
        _, path, depth = heapq.heappop(heap)
        kids = _kids(p, path)
        if not kids or depth >= MAX_DEPTH or shown + len(kids) > max_nodes:
            continue
        expanded.add(path)
        shown += len(kids)
        for kid in kids:
            heapq.heappush(heap, (-int(p.wall_ns[kid]), kid, depth + 1))
    return expanded


def _node(tree: RequestTree, p: Paths, path: int, expanded: set[int]) -> Node:
    calls = int(p.calls[path])
    first = int(p.first[path])
    hidden = 0 if path in expanded else int(p.calls[_kids(p, path)].sum())
    return Node(
        id=first,
        function=tree.functions[int(p.function[path])],
        start_ns=int(p.start_ns[path]),
        end_ns=int(p.end_ns[path]),
        self_ns=int(p.sums["self_ns"][path]),
        active_ns=int(p.sums["active_ns"][path]),
        await_ns=int(p.sums["await_ns"][path]),
        ready_ns=int(p.sums["ready_ns"][path]),
        max_slice_ns=int(p.max_slice_ns[path]),
        suspensions=int(p.sums["suspensions"][path]),
        outcome=OUTCOMES[int(p.outcome[path])],
        waits=tree.waits.get(first) if calls == 1 else None,
        merged=Merged(calls=calls, wall_ns=int(p.wall_ns[path]), hidden=hidden),
    )


def _build(tree: RequestTree, p: Paths, root: int, expanded: set[int]) -> Node:
    """The shown nodes under path `root`, children in time order (iteratively: call paths
    can be deeper than Python's recursion limit)."""
    top = _node(tree, p, root, expanded)
    todo = [(root, top)]
    while todo:
        path, node = todo.pop()
        if path not in expanded:
            continue
        kids = sorted(_kids(p, path), key=lambda k: int(p.start_ns[k]))
        for kid in kids:
            child = _node(tree, p, kid, expanded)
            node.children.append(child)
            todo.append((kid, child))
    return top


def summarise(tree: RequestTree, max_nodes: int) -> list[Lane]:
    """The shown lanes, summarised to about max_nodes nodes (at least their roots)."""
    p = paths(tree)
    roots = [int(p.of_node[lane.root]) for lane in tree.lanes]
    expanded = _select(p, roots, max_nodes)
    return [
        tree.lane(lane, _build(tree, p, path, expanded))
        for lane, path in zip(tree.lanes, roots, strict=True)
    ]


def subtree(tree: RequestTree, node: int, max_nodes: int) -> Node:
    """The calls on node's call path (node and its merged siblings) and below, summarised."""
    p = paths(tree)
    root = int(p.of_node[node])
    return _build(tree, p, root, _select(p, [root], max_nodes))


def lane_of(tree: RequestTree, node: int) -> str | None:
    """The id of the lane whose root node is under (None: a lane not shown)."""
    parent = tree.parent
    while parent[node] >= 0:
        node = int(parent[node])
    return next((lane.id for lane in tree.lanes if lane.root == node), None)
