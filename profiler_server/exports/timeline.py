"""A lane's calls as properly nested spans, which timeline formats (speedscope's evented
profiles, Chrome trace slices) require.

Stored calls nest by parent, but not always in time: a generator entered, suspended while
its caller runs other calls, and resumed spans those siblings. Each span is clamped into
its parent and starts no earlier than its previous sibling ended, so the output stays a
valid stack; calls that never overlap (nearly all) keep their exact times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from profiler_server.assembly.request_tree import Node


@dataclass(frozen=True, slots=True)
class Span:
    node: Node
    depth: int
    start_ns: int
    end_ns: int


def spans(root: Node) -> Iterator[Span]:
    """The lane's nodes in preorder (iteratively: call trees can be deeper than Python's
    recursion limit)."""
    start = root.start_ns
    end = max(root.end_ns, start)
    # (node, depth, earliest start, latest end); children pushed last-first
    todo = [(root, 0, start, end)]
    cursor: dict[int, int] = {}  # depth -> where the next span at that depth may start
    while todo:
        node, depth, low, high = todo.pop()
        low = max(low, cursor.get(depth, low))
        start = min(max(node.start_ns, low), high)
        end = min(max(node.end_ns, start), high)
        cursor[depth] = end
        cursor[depth + 1] = start
        yield Span(node, depth, start, end)
        for child in reversed(node.children):
            todo.append((child, depth + 1, start, end))
