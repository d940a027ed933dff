"""Turns a forest of assembled requests into what is stored and aggregated: each request's
stored tree, and totals per (request, stack) and per (request, function).

Every node's stack is interned level by level (all nodes one call deeper at a time), so a
request of any size costs a few NumPy passes per level of depth, not Python per node."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from profiler_core.stacks import SEPARATOR
from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import LANE_ROOT
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.stored import stored_trees
from profiler_server.assembly.totals import (
    ACTIVE,
    AWAIT,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    SELF,
    TOTAL,
    WIDTH,
    Totals,
)


def stable_id(text: str) -> int:
    """A 63-bit id from a name: the same on every server, so ids never collide between them."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


Resolver = Callable[[int], tuple[int, str] | None]  # session function id -> (global id, name)
_FUNCTION_BITS = 32  # session function ids are uint32


@dataclass
class StackColumns:
    """Per interned stack, as arrays: stable id, leaf function (dense number; its global id
    is `functions[number]`), and whether that function is not already lower on the stack."""

    ids: np.ndarray
    leaf: np.ndarray
    outermost: np.ndarray
    functions: np.ndarray


class StackInterner:
    """A session's stacks: (parent stack, function id) -> small int, with what each stands for."""

    def __init__(self, resolve: Resolver) -> None:
        self._resolve = resolve
        self.index: dict[int, int] = {}  # parent stack << 32 | session function id -> stack
        self.signatures: list[str] = [""]
        self.ids: list[int] = [0]  # stable_id(signature)
        self.leaf: list[int] = [0]  # dense number of the leaf frame's global function id
        self.outermost: list[bool] = [False]  # leaf function not already on the stack
        self.functions: list[int] = [0]  # dense number -> global function id
        self._numbers: dict[int, int] = {0: 0}  # global function id -> dense number
        self._frames: list[frozenset[int]] = [frozenset()]
        self.names: dict[int, str] = {}  # session function id -> name
        self.unknown = 0  # stacks whose leaf function was never defined
        self._keys = np.zeros(0, dtype=np.int64)  # sorted keys of `index`
        self._stacks = np.zeros(0, dtype=np.int64)
        self._columns: StackColumns | None = None

    def child(self, parent: int, fid: int) -> int:
        key = parent << _FUNCTION_BITS | fid
        found = self.index.get(key)
        if found is not None:
            return found
        resolved = self._resolve(fid)
        if resolved is None:
            self.unknown += 1
            resolved = (-fid - 1, f"(unknown function {fid})")
        gid, name = resolved
        self.names[fid] = name
        sig = name if parent == 0 else self.signatures[parent] + SEPARATOR + name
        index = self.index[key] = len(self.signatures)
        self.signatures.append(sig)
        self.ids.append(stable_id(sig))
        self.leaf.append(self._numbers.setdefault(gid, len(self._numbers)))
        if len(self.functions) < len(self._numbers):
            self.functions.append(gid)
        self.outermost.append(gid not in self._frames[parent])
        self._frames.append(self._frames[parent] | {gid})
        self._columns = None
        return index

    def lookup(self, parents: np.ndarray, fids: np.ndarray) -> np.ndarray:
        """The stacks of many (parent stack, function id) pairs; new ones are interned."""
        keys = parents << _FUNCTION_BITS | fids
        at = np.searchsorted(self._keys, keys)
        known = at < len(self._keys)
        known[known] = self._keys[at[known]] == keys[known]
        if not known.all():
            new = np.unique(keys[~known])
            mask = (1 << _FUNCTION_BITS) - 1
            stacks = [self.child(k >> _FUNCTION_BITS, k & mask) for k in new.tolist()]
            place = np.searchsorted(self._keys, new)
            self._keys = np.insert(self._keys, place, new)
            self._stacks = np.insert(self._stacks, place, stacks)
            at = np.searchsorted(self._keys, keys)
        return self._stacks[at]

    def columns(self) -> StackColumns:
        if self._columns is None:
            self._columns = StackColumns(
                np.array(self.ids, dtype=np.int64),
                np.array(self.leaf, dtype=np.int64),
                np.array(self.outermost, dtype=bool),
                np.array(self.functions, dtype=np.int64),
            )
        return self._columns


def _depths(forest: Forest, up: np.ndarray) -> np.ndarray:
    """Nodes above each node along `up`, by pointer jumping: a node comes after all it
    hangs from (a lane's root after its spawning call and its parent lane's root)."""
    depth = np.ones(len(forest), dtype=np.int64)
    above = up.copy()
    pending = np.flatnonzero(above >= 0)
    while len(pending):
        depth[pending] += depth[above[pending]]
        above[pending] = above[above[pending]]
        pending = pending[above[pending] >= 0]
    return depth


def _stacks(forest: Forest, interner: StackInterner) -> np.ndarray:
    """Every node's interned stack. A lane's root has its spawning call's; a lane spawned
    where no call of its parent lane was open (a task that only handed work to a thread)
    has its parent lane's root's; the main lane's root the empty one."""
    up = forest.parent.copy()  # a spawned lane's root hangs from its spawning call
    for base, lanes in zip(forest.offsets.tolist(), forest.lanes, strict=False):
        roots = {lane.lane_id: lane.root for lane in lanes}
        for lane in lanes:
            if lane.parent_node is not None:
                up[base + lane.root] = base + lane.parent_node
            elif lane.parent_lane in roots and lane.parent_lane != lane.lane_id:
                up[base + lane.root] = base + roots[lane.parent_lane]
    root = forest.function == LANE_ROOT
    level = _depths(forest, up) * 2 + root  # each level only calls or only lane roots
    order = np.argsort(level, kind="stable")
    bounds = np.flatnonzero(np.diff(level[order])) + 1
    stack = np.zeros(len(forest), dtype=np.int64)
    for nodes in np.split(order, bounds) if len(order) else ():
        if root[nodes[0]]:
            spawner = up[nodes]
            stack[nodes] = np.where(spawner >= 0, stack[np.maximum(spawner, 0)], 0)
        else:
            parents = stack[forest.parent[nodes]]
            stack[nodes] = interner.lookup(parents, forest.function[nodes])
    return stack


def _node_values(forest: Forest, calls: np.ndarray) -> np.ndarray:
    """Totals columns for each call on its own (see totals.py for the layout)."""
    wall = forest.end[calls] - forest.start[calls]
    values = np.zeros((WIDTH, len(calls)), dtype=np.int64)
    values[CALLS] = 1
    values[SELF] = forest.self_ns[calls]
    for column in (TOTAL, ACTIVE, MAX, MAX_SLICE):
        values[column] = wall
    at = np.searchsorted(calls, forest.extra_node)  # calls that suspended
    for column, extra in zip((ACTIVE, AWAIT, READY, MAX_SLICE), forest.extras, strict=False):
        values[column, at] = extra
    return values


@dataclass
class Summary:
    """What a forest's requests store and export, per request index in the forest."""

    trees: list[bytes]  # serialized StoredTree
    stacks: Totals  # key: stack id (stable_id of its signature)
    functions: Totals  # key: global function id; TOTAL counts outermost calls only
    signatures: dict[int, str]  # stack id -> signature, for the stacks in `stacks`


def summarize(forest: Forest, interner: StackInterner, problems: Counter) -> Summary:
    """The forest's stored trees and totals; stacks new to the session are interned."""
    unknown_before = interner.unknown
    stack = _stacks(forest, interner)
    calls = np.flatnonzero(forest.function != LANE_ROOT)
    owner = forest.owner()[calls]
    per_stack = Totals.grouped(owner, stack[calls], _node_values(forest, calls))
    columns = interner.columns()
    values = per_stack.values.copy()
    values[TOTAL] *= columns.outermost[per_stack.key]  # recursion: count the outermost call
    per_function = Totals.grouped(per_stack.owner, columns.leaf[per_stack.key], values)
    per_function.key = columns.functions[per_function.key]
    used = np.unique(per_stack.key).tolist()
    signatures = {interner.ids[s]: interner.signatures[s] for s in used}
    per_stack.key = columns.ids[per_stack.key]
    if interner.unknown > unknown_before:
        problems[P.UNKNOWN_FUNCTION] += interner.unknown - unknown_before
    trees = stored_trees(forest, interner.names.__getitem__)
    return Summary(trees, per_stack, per_function, signatures)
