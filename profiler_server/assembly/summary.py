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

from profiler_server.assembly.request_tree import MERGED_BY, Lane, Merged, Node, RequestTree


@dataclass(frozen=True)
class Paths:
    """Per node its call path; per path what choosing the paths to show needs."""

    of_node: np.ndarray
    first: np.ndarray  # one of its calls, the first found (its id in the answer)
    function: np.ndarray
    calls: np.ndarray
    wall_ns: np.ndarray  # summed
    child_calls: np.ndarray  # calls directly under its calls
    child_begin: np.ndarray  # children of path p: child_paths[child_begin[p]:child_begin[p+1]]
    child_paths: np.ndarray


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
    parents, functions, firsts = [np.full(len(level), -1)], [tree.function[level]], [level]
    taken = len(level)
    width = int(tree.function.max(initial=0)) + 1
    while len(level):
        level = _gather(order, begin, level)
        if not len(level):
            break
        key = of_node[tree.parent[level]] * width + tree.function[level]
        distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        of_node[level] = taken + inverse
        parents.append(distinct // width)
        functions.append(distinct % width)
        firsts.append(level[first])
        taken += len(distinct)
    parent = np.concatenate(parents)
    child_paths, child_begin = _children(parent)
    below = tree.parent >= 0
    return Paths(
        of_node=of_node,
        first=np.concatenate(firsts),
        function=np.concatenate(functions),
        calls=np.bincount(of_node, minlength=taken),
        wall_ns=_sums(of_node, tree.end_ns - tree.start_ns, taken),
        child_calls=np.bincount(of_node[tree.parent[below]], minlength=taken),
        child_begin=child_begin,
        child_paths=child_paths,
    )


def _sums(labels: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per label the sum of its values (bincount sums in float64: exact below 2**53 ns,
    104 days)."""
    return np.rint(np.bincount(labels, weights=values, minlength=size)).astype(np.int64)


_EXTREMES = {"min": np.minimum, "max": np.maximum}


def _extremes(ufunc: np.ufunc, labels: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    start = values.max(initial=0) if ufunc is np.minimum else values.min(initial=0)
    out = np.full(size, start, dtype=np.int64)
    ufunc.at(out, labels, values)
    return out


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
        if depth >= MAX_DEPTH or p.child_calls[path] == 0:
            continue
        kids = _kids(p, path)
        if shown + len(kids) > max_nodes:
            continue
        expanded.add(path)
        shown += len(kids)
        for kid in kids:
            heapq.heappush(heap, (-int(p.wall_ns[kid]), kid, depth + 1))
    return expanded


def _build(tree: RequestTree, p: Paths, root: int, expanded: set[int]) -> Node:
    """The shown nodes under path `root`, children in time order (iteratively: call paths
    can be deeper than Python's recursion limit). Only the calls of shown paths are
    aggregated, whatever the request's size."""
    shown = [root]
    for path in expanded:
        shown.extend(_kids(p, path))
    slot = np.full(len(p.calls), -1, dtype=np.int64)
    slot[shown] = np.arange(len(shown))
    members = np.flatnonzero(slot[p.of_node] >= 0)
    labels = slot[p.of_node[members]]
    count = len(shown)
    at = np.array(shown)

    def merged(name: str, how: str) -> list[int]:
        if how == "same":
            return p.function[at].tolist()
        values = getattr(tree, name)[members]
        if how == "sum":
            return _sums(labels, values, count).tolist()
        return _extremes(_EXTREMES[how], labels, values, count).tolist()

    columns = [tree.labelled(name, merged(name, how)) for name, how in MERGED_BY.items()]
    nodes = [Node(i, *row) for i, *row in zip(p.first[at].tolist(), *columns, strict=True)]
    for node, path, calls, wall, hidden in zip(
        nodes,
        shown,
        p.calls[at].tolist(),
        p.wall_ns[at].tolist(),
        p.child_calls[at].tolist(),
        strict=True,
    ):
        node.merged = Merged(calls, wall, 0 if path in expanded else hidden)
        node.waits = tree.waits.get(node.id) if calls == 1 else None
    todo = [root]
    while todo:
        path = todo.pop()
        if path not in expanded:
            continue
        kids = sorted(_kids(p, path), key=lambda k: nodes[slot[k]].start_ns)
        nodes[slot[path]].children.extend(nodes[slot[k]] for k in kids)
        todo.extend(kids)
    return nodes[0]


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
