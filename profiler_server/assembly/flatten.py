"""Turns an assembled tree into what is stored and aggregated: pre-order node columns,
per-function totals and per-stack self time, in one walk."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from profiler_core.stacks import SEPARATOR
from profiler_core.wire import tree_pb2
from profiler_server.assembly.calltree import AssembledRequest, LaneTree, Node


def stable_id(text: str) -> int:
    """A 63-bit id from a name: the same on every server, so ids never collide between them."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


class StackInterner:
    """Maps (parent stack, function) to a small int and remembers each stack's signature/id."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self._limit = limit
        self._index: dict[tuple[int, int], int] = {}
        self.signatures: list[str] = [""]
        self.ids: list[int] = [0]

    def child(self, parent: int, function_id: int, function_name: str) -> int:
        key = (parent, function_id)
        found = self._index.get(key)
        if found is not None:
            return found
        if len(self.signatures) >= self._limit:
            self.clear()
            parent = 0
            key = (parent, function_id)
        sig = function_name if parent == 0 else self.signatures[parent] + SEPARATOR + function_name
        index = self._index[key] = len(self.signatures)
        self.signatures.append(sig)
        self.ids.append(stable_id(sig))
        return index

    def clear(self) -> None:
        self._index.clear()
        del self.signatures[1:]
        del self.ids[1:]


# Per-function totals: calls, total (outermost calls' wall), self, active, await, ready,
# longest call, longest active slice
CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY, MAX, MAX_SLICE = range(8)


@dataclass
class FlatRequest:
    tree: tree_pb2.StoredTree
    functions: dict[int, list[int]] = field(default_factory=dict)  # global function id -> totals
    stacks: dict[int, list[int]] = field(default_factory=dict)  # interned stack -> [self_ns, calls]
    calls: int = 0


Resolver = Callable[[int], tuple[int, str]]  # session function id -> (global id, name)


def _lane_order(lanes: list[LaneTree]) -> list[LaneTree]:
    """Parents before the lanes they spawned (a lane's stacks extend its spawn point's)."""
    by_id = {lane.lane_id: lane for lane in lanes}
    done: dict[int, LaneTree] = {}

    def visit(lane: LaneTree, seen: set[int]) -> None:
        if lane.lane_id in done or lane.lane_id in seen:
            return
        seen.add(lane.lane_id)
        parent = by_id.get(lane.parent_lane) if lane.parent_lane is not None else None
        if parent is not None:
            visit(parent, seen)
        done[lane.lane_id] = lane

    for lane in lanes:
        visit(lane, set())
    return list(done.values())


def flatten(
    request: AssembledRequest, resolve: Resolver, interner: StackInterner, problems: Counter
) -> FlatRequest:
    tree = tree_pb2.StoredTree()
    names: dict[str, int] = {}
    depth_col: list[int] = []
    function_col: list[int] = []
    start_col: list[int] = []
    end_col: list[int] = []
    self_col: list[int] = []
    active_col: list[int] = []
    await_col: list[int] = []
    ready_col: list[int] = []
    slice_col: list[int] = []
    susp_col: list[int] = []
    outcome_col = bytearray()
    flat = FlatRequest(tree)
    totals = flat.functions
    stacks = flat.stacks
    node_ids: dict[int, int] = {}  # call id -> node index
    node_stacks: dict[int, int] = {}  # call id -> interned stack
    resolved: dict[int, tuple[int, str]] = {}
    lane_index: dict[int, int] = {}
    t0 = request.start

    def name_index(name: str) -> int:
        found = names.get(name)
        if found is None:
            found = names[name] = len(names)
            tree.functions.append(name)
        return found

    for lane in _lane_order(request.lanes):
        first = len(depth_col)
        lane_index[lane.lane_id] = len(tree.lanes)
        base_stack = node_stacks.get(lane.parent_call, 0) if lane.parent_call is not None else 0
        # (node, depth, stack, open outer calls of the same function)
        work: list[tuple[Node, int, int, frozenset[int]]] = [
            (lane.root, 0, base_stack, frozenset())
        ]
        while work:
            node, depth, parent_stack, outer = work.pop()
            index = len(depth_col)
            if node.function < 0:
                stack = parent_stack
                fn_index = name_index(lane.name)
                fid = -1
            else:
                found = resolved.get(node.function)
                if found is None:
                    found = resolved[node.function] = resolve(node.function)
                fid, name = found
                fn_index = name_index(name)
                stack = interner.child(parent_stack, fid, name)
                node_ids[node.call] = index
                node_stacks[node.call] = stack
                wall = node.end - node.start
                agg = totals.get(fid)
                if agg is None:
                    agg = totals[fid] = [0, 0, 0, 0, 0, 0, 0, 0]
                agg[CALLS] += 1
                if fid not in outer:
                    agg[TOTAL] += wall
                    outer = outer | {fid}
                agg[SELF] += node.self_ns
                agg[ACTIVE] += node.active_ns
                agg[AWAIT] += node.await_ns
                agg[READY] += node.ready_ns
                if wall > agg[MAX]:
                    agg[MAX] = wall
                if node.max_slice_ns > agg[MAX_SLICE]:
                    agg[MAX_SLICE] = node.max_slice_ns
                per_stack = stacks.get(stack)
                if per_stack is None:
                    stacks[stack] = [node.self_ns, 1]
                else:
                    per_stack[0] += node.self_ns
                    per_stack[1] += 1
            depth_col.append(depth)
            function_col.append(fn_index)
            start_col.append(node.start - t0)
            end_col.append(node.end - t0)
            self_col.append(node.self_ns)
            active_col.append(node.active_ns)
            await_col.append(node.await_ns)
            ready_col.append(node.ready_ns)
            slice_col.append(node.max_slice_ns)
            susp_col.append(node.suspensions)
            outcome_col.append(node.outcome)
            children = node.children
            if children:
                work.extend((child, depth + 1, stack, outer) for child in reversed(children))
        stored = tree.lanes.add()
        stored.id = str(lane.lane_id)
        stored.kind = lane.kind
        stored.name = lane.name
        stored.parent_lane = (
            lane_index.get(lane.parent_lane, -1) if lane.parent_lane is not None else -1
        )
        stored.parent_node = (
            node_ids.get(lane.parent_call, -1) if lane.parent_call is not None else -1
        )
        stored.first_node = first
        stored.node_count = len(depth_col) - first
    flat.calls = len(depth_col) - len(request.lanes)
    tree.depth.extend(depth_col)
    tree.function.extend(function_col)
    tree.start_ns.extend(start_col)
    tree.end_ns.extend(end_col)
    tree.self_ns.extend(self_col)
    tree.active_ns.extend(active_col)
    tree.await_ns.extend(await_col)
    tree.ready_ns.extend(ready_col)
    tree.max_slice_ns.extend(slice_col)
    tree.suspensions.extend(susp_col)
    tree.outcome = bytes(outcome_col)
    return flat
