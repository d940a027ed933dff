"""Turns an assembled tree into what is stored and aggregated: the stored tree columns,
per-stack totals and per-function totals (the latter derived from the former)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import sub

from profiler_core.stacks import SEPARATOR
from profiler_core.wire import tree_pb2
from profiler_server.assembly import calltree as C
from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import LANE_ROOT, AssembledRequest


def stable_id(text: str) -> int:
    """A 63-bit id from a name: the same on every server, so ids never collide between them."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


Resolver = Callable[[int], tuple[int, str] | None]  # session function id -> (global id, name)


class StackInterner:
    """A session's stacks: (parent stack, function id) -> small int, with what each stands for."""

    def __init__(self, resolve: Resolver) -> None:
        self._resolve = resolve
        self.index: dict[tuple[int, int], int] = {}
        self.signatures: list[str] = [""]
        self.ids: list[int] = [0]  # stable_id(signature)
        self.leaf: list[int] = [0]  # global function id of the leaf frame
        self.outermost: list[bool] = [False]  # leaf function not already on the stack
        self._frames: list[frozenset[int]] = [frozenset()]
        self.names: dict[int, str] = {}  # session function id -> name
        self.unknown = 0  # stacks whose leaf function was never defined

    def child(self, parent: int, fid: int) -> int:
        found = self.index.get((parent, fid))
        if found is not None:
            return found
        resolved = self._resolve(fid)
        if resolved is None:
            self.unknown += 1
            resolved = (-fid - 1, f"(unknown function {fid})")
        gid, name = resolved
        self.names[fid] = name
        sig = name if parent == 0 else self.signatures[parent] + SEPARATOR + name
        index = self.index[(parent, fid)] = len(self.signatures)
        self.signatures.append(sig)
        self.ids.append(stable_id(sig))
        self.leaf.append(gid)
        self.outermost.append(gid not in self._frames[parent])
        self._frames.append(self._frames[parent] | {gid})
        return index


# Per stack and per function: calls, total wall (outermost calls only), self, active,
# await, ready, longest call, longest active slice.
CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY, MAX, MAX_SLICE = range(8)


@dataclass
class FlatRequest:
    tree: tree_pb2.StoredTree
    stacks: dict[int, list[int]] = field(default_factory=dict)  # interned stack -> totals
    functions: dict[int, list[int]] = field(default_factory=dict)  # global function id -> totals


def summarize(request: AssembledRequest, interner: StackInterner, problems: Counter) -> FlatRequest:
    tree = request.tree
    fn, par, st, en, sf = tree.function, tree.parent, tree.start, tree.end, tree.self_ns
    extras = tree.extras
    n = len(fn)
    stack_of = [0] * n
    lane_base = {lane.root: lane.parent_node for lane in tree.lanes if lane.parent_node is not None}
    index = interner.index
    child = interner.child
    unknown_before = interner.unknown
    totals: dict[int, list[int]] = {}
    for i, f, p, started, ended, self_ns in zip(range(n), fn, par, st, en, sf, strict=True):
        if f == LANE_ROOT:
            spawner = lane_base.get(i)
            stack_of[i] = 0 if spawner is None else stack_of[spawner]
            continue
        parent_stack = stack_of[p]
        s = index.get((parent_stack, f)) or child(parent_stack, f)
        stack_of[i] = s
        wall = ended - started
        agg = totals.get(s)
        if agg is None:
            agg = totals[s] = [0, 0, 0, 0, 0, 0, 0, 0]
        agg[CALLS] += 1
        agg[TOTAL] += wall
        agg[SELF] += self_ns
        if wall > agg[MAX]:
            agg[MAX] = wall
        if extras and i in extras:
            extra = extras[i]
            agg[ACTIVE] += extra[C.ACTIVE] - wall
            agg[AWAIT] += extra[C.AWAIT]
            agg[READY] += extra[C.READY]
            if extra[C.MAX_SLICE] > agg[MAX_SLICE]:
                agg[MAX_SLICE] = extra[C.MAX_SLICE]
        elif wall > agg[MAX_SLICE]:
            agg[MAX_SLICE] = wall
    for agg in totals.values():
        agg[ACTIVE] += agg[TOTAL]  # a call that never suspended was active all along
    if interner.unknown > unknown_before:
        problems[P.UNKNOWN_FUNCTION] += interner.unknown - unknown_before
    return FlatRequest(_stored_tree(request, interner), totals, _function_totals(totals, interner))


def _function_totals(stacks: dict[int, list[int]], interner: StackInterner) -> dict[int, list[int]]:
    functions: dict[int, list[int]] = {}
    for s, agg in stacks.items():
        gid = interner.leaf[s]
        out = functions.get(gid)
        if out is None:
            out = functions[gid] = [0, 0, 0, 0, 0, 0, 0, 0]
        # recursion: only the outermost calls count in TOTAL
        add_totals(out, agg, with_total=interner.outermost[s])
    return functions


def add_totals(into: list[int], more: list[int], with_total: bool = True) -> None:
    """Adds one totals list (layout above) into another: sums, and the larger maxima."""
    into[CALLS] += more[CALLS]
    if with_total:
        into[TOTAL] += more[TOTAL]
    into[SELF] += more[SELF]
    into[ACTIVE] += more[ACTIVE]
    into[AWAIT] += more[AWAIT]
    into[READY] += more[READY]
    if more[MAX] > into[MAX]:
        into[MAX] = more[MAX]
    if more[MAX_SLICE] > into[MAX_SLICE]:
        into[MAX_SLICE] = more[MAX_SLICE]


def _stored_tree(request: AssembledRequest, interner: StackInterner) -> tree_pb2.StoredTree:
    tree = request.tree
    stored = tree_pb2.StoredTree()
    names: dict[str, int] = {}
    name_of_fid = {
        f: names.setdefault(interner.names[f], len(names))
        for f in set(tree.function)
        if f != LANE_ROOT
    }
    lane_names = {lane.root: names.setdefault(lane.name, len(names)) for lane in tree.lanes}
    name_of_fid[LANE_ROOT] = 0
    functions = [name_of_fid[f] for f in tree.function]
    for root, name in lane_names.items():
        functions[root] = name
    stored.functions.extend(names)
    t0 = request.start
    stored.parent.extend(tree.parent)
    stored.function.extend(functions)
    starts = tree.start
    stored.start_delta_ns.extend(map(sub, starts, [t0, *starts[:-1]]))
    stored.duration_ns.extend(map(sub, tree.end, starts))
    stored.self_ns.extend(tree.self_ns)
    for node in sorted(tree.extras):
        extra = tree.extras[node]
        stored.suspended_node.append(node)
        stored.active_ns.append(extra[C.ACTIVE])
        stored.await_ns.append(extra[C.AWAIT])
        stored.ready_ns.append(extra[C.READY])
        stored.max_slice_ns.append(extra[C.MAX_SLICE])
        stored.suspensions.append(extra[C.SUSPENSIONS])
    outcomes = sorted(tree.outcomes.items())
    stored.outcome_node.extend(node for node, _ in outcomes)
    stored.outcome = bytes(outcome for _, outcome in outcomes)
    for lane in tree.lanes:
        stored.lanes.add(
            id=str(lane.lane_id),
            kind=lane.kind,
            name=lane.name,
            root=lane.root,
            parent_lane=-1 if lane.parent_lane is None else lane.parent_lane,
            parent_node=-1 if lane.parent_node is None else lane.parent_node,
        )
    return stored
