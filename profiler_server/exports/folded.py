"""Folded stacks for flamegraph.pl, inferno and Pyroscope: `frame;frame;frame <value>` per
line, root first (a request's self ns, an aggregate's value); stacks of value 0 are left out
(they add nothing to a flame graph)."""

from __future__ import annotations

from profiler_server.assembly.stacktree import StackTree
from profiler_server.assembly.states import STATES
from profiler_server.exports.base import Aggregate, Format, RequestProfile, Stacks

WALL_FIELDS = tuple(state.node for state in STATES.values())  # a node's share of wall time


def lines(stacks: Stacks) -> str:
    return "".join(f"{sig} {self_ns}\n" for sig, self_ns, _ in stacks if self_ns > 0)


def request_stacks(profile: RequestProfile) -> list[tuple[str, int, int]]:
    """(name, wall ns, calls) per distinct stack of one request, in first-seen order (wall:
    the node's time in every state, states.py);
    every lane's stacks start with the lane's root (its name, e.g. `GET /items/{id}`).
    Stacks are interned as a prefix tree (stacktree.py), so a deep request costs the same
    per call as a shallow one, and named as shown there (a deep one's middle elided)."""
    tree = StackTree()
    index: dict[tuple[int, str], int] = {}  # (parent stack, function) -> stack
    totals: dict[int, list[int]] = {}
    for lane in profile.lanes:
        todo = [(lane.root, 0)]
        while todo:
            node, parent = todo.pop()
            key = (parent, node.function)
            stack = index.get(key)
            if stack is None:
                stack = index[key] = tree.add(parent, node.function)
            found = totals.setdefault(stack, [0, 0])
            found[0] += sum(getattr(node, field) for field in WALL_FIELDS)
            found[1] += 1
            todo.extend((child, stack) for child in reversed(node.children))
    named: dict[str, list[int]] = {}
    for stack, (self_ns, calls) in totals.items():
        found = named.setdefault(tree.name(stack), [0, 0])
        found[0] += self_ns
        found[1] += calls
    return [(name, self_ns, calls) for name, (self_ns, calls) in named.items()]


def render_request(profile: RequestProfile) -> bytes:
    return lines(request_stacks(profile)).encode()


def render_aggregate(aggregate: Aggregate) -> bytes:
    return lines(aggregate.stacks).encode()


FORMAT = Format(
    "folded",
    "text/plain",
    "folded",
    request=render_request,
    aggregate=render_aggregate,
)
