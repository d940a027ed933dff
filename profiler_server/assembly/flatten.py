"""Turns a forest of assembled requests into what is stored and aggregated: each request's
stored tree, and totals per (request, stack) and per (request, function).

Every node's stack is interned level by level (all nodes one call deeper at a time): a wide
level in a few NumPy passes, a narrow one (a deep chain has one node per level) node by node,
so neither many nodes nor many levels cost more per node than a small request does."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import immutables
import numpy as np

from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import LANE_ROOT
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.stacktree import EMPTY_ID, StackTree, stack_id
from profiler_server.assembly.stored import stored_trees
from profiler_server.assembly.totals import (
    ACTIVE,
    AWAIT,
    AWAITING,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    READYING,
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
_FUNCTION_MASK = (1 << _FUNCTION_BITS) - 1
_NARROW = 64  # levels with fewer nodes are interned node by node, the others with NumPy
MORE_UNKNOWN = "(more unknown functions)"  # undefined ids past StackInterner's max_names
MORE_UNKNOWN_ID = -(1 << _FUNCTION_BITS) - 1  # below every (unknown function N)'s -N - 1
# The frame a lane's time goes to while no profiled call runs or waits in it (framework code
# around the handler, a task before its first profiled call): its stack is the lane's plus
# this frame, so every nanosecond of a lane lands on a stack. Its `functions` row comes with
# the schema (migrations._v6).
OUTSIDE_NAME = "(outside profiled calls)"
OUTSIDE_ID = stable_id(OUTSIDE_NAME)


@dataclass
class StackColumns:
    """Per interned stack, as arrays: stable id, leaf function (dense number; its global id
    is `functions[number]`), and whether that function is not already lower on the stack."""

    ids: np.ndarray
    leaf: np.ndarray
    outermost: np.ndarray
    functions: np.ndarray


class StackInterner:
    """A session's stacks: (parent stack, function id) -> small int, with what each stands
    for. Each new stack costs the same whatever its depth: its id comes from its parent's
    (stacktree.stack_id), and the functions on it are a persistent map shared with its
    parent (a copy of a few nodes only when the leaf's function is new to the stack).

    Ids the session never defined get a name each, `(unknown function N)`, up to
    `max_names` names in all; the ids beyond are one `(more unknown functions)` frame, so
    a host calling any number of made-up ids costs bounded memory."""

    def __init__(self, resolve: Resolver, max_names: int = 200_000) -> None:
        self._resolve = resolve
        self._max_names = max_names
        self.index: dict[int, int] = {}  # parent stack << 32 | session function id -> stack
        self.tree = StackTree()
        self.ids: list[int] = [EMPTY_ID]  # stacktree.stack_id
        self.by_id: dict[int, int] = {}  # stable id -> stack
        self.function_ids: list[int] = [0]  # the leaf frame's global function id
        self.leaf: list[int] = [0]  # dense number of the leaf frame's global function id
        self.outermost: list[bool] = [False]  # leaf function not already on the stack
        self.functions: list[int] = [0]  # dense number -> global function id
        self.function_names: list[str] = [""]  # dense number -> the function's name
        self._numbers: dict[int, int] = {0: 0}  # global function id -> dense number
        self._on_stack: list[immutables.Map] = [immutables.Map()]  # global function ids
        self.names: dict[int, str] = {}  # session function id -> name
        self.unknown = 0  # stacks whose leaf function was never defined
        self.over_names = 0  # lookups of undefined ids past max_names
        self._more: dict[int, int] = {}  # parent stack -> its (more unknown functions) child
        self._outside: dict[int, int] = {}  # lane's stack -> its OUTSIDE_NAME stack
        self._columns = tuple(_Growing(t) for t in (np.int64, np.int64, bool, np.int64))
        self._built: StackColumns | None = None  # the columns as of the last call

    def child(self, parent: int, fid: int) -> int:
        key = parent << _FUNCTION_BITS | fid
        found = self.index.get(key)
        if found is not None:
            return found
        resolved = self._resolve(fid)
        if resolved is None:
            if fid not in self.names and len(self.names) >= self._max_names:
                self.over_names += 1
                more = self._more.get(parent)
                if more is None:
                    more = self._more[parent] = self._add(parent, MORE_UNKNOWN_ID, MORE_UNKNOWN)
                return more
            self.unknown += 1
            resolved = (-fid - 1, f"(unknown function {fid})")
        gid, name = resolved
        self.names[fid] = name
        index = self.index[key] = self._add(parent, gid, name)
        return index

    def outside(self, parent: int) -> int:
        """The stack of a lane's time outside profiled calls, the lane's stack `parent`."""
        found = self._outside.get(parent)
        if found is None:
            found = self._outside[parent] = self._add(parent, OUTSIDE_ID, OUTSIDE_NAME)
        return found

    def _add(self, parent: int, gid: int, name: str) -> int:
        index = self.tree.add(parent, name)
        sid = stack_id(self.ids[parent], gid)
        self.ids.append(sid)
        self.by_id[sid] = index
        self.function_ids.append(gid)
        self.leaf.append(self._numbers.setdefault(gid, len(self._numbers)))
        if len(self.functions) < len(self._numbers):
            self.functions.append(gid)
            self.function_names.append(name)
        below = self._on_stack[parent]
        self.outermost.append(gid not in below)
        self._on_stack.append(below if gid in below else below.set(gid, None))
        return index

    def name(self, fid: int) -> str:
        """The name of a session function id met on a stack."""
        return self.names.get(fid, MORE_UNKNOWN)

    def row(self, stack: int) -> tuple[int, int]:
        """(parent stack id, leaf function id): what is stored of a stack."""
        return self.ids[self.tree.parent[stack]], self.function_ids[stack]

    def shown(self, sid: int) -> str | None:
        """The stack's name as shown (stacktree.StackTree.name); None if not this session's."""
        index = self.by_id.get(sid)
        return None if index is None else self.tree.name(index)

    def columns(self) -> StackColumns:
        """The columns as arrays, grown in place: a session that keeps finding new stacks
        copies only the new ones for each batch, not all of them again, and one that found
        none gets the same arrays (most sessions of a fleet, in most groups)."""
        if self._built is None or len(self.ids) != self._columns[0].size:
            lists = (self.ids, self.leaf, self.outermost, self.functions)
            for growing, values in zip(self._columns, lists, strict=True):
                growing.extend(values)
            self._built = StackColumns(*(growing.view() for growing in self._columns))
        return self._built


class _Growing:
    """An array that follows an append-only list, doubling its capacity as it grows."""

    def __init__(self, dtype: type) -> None:
        self.array = np.zeros(1024, dtype=dtype)
        self.size = 0

    def extend(self, values: list) -> None:
        """Copies what `values` gained since the last call."""
        if len(values) > len(self.array):
            grown = np.zeros(max(len(values), 2 * len(self.array)), dtype=self.array.dtype)
            grown[: self.size] = self.array[: self.size]
            self.array = grown
        self.array[self.size : len(values)] = values[self.size :]
        self.size = len(values)

    def view(self) -> np.ndarray:
        return self.array[: self.size]


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


def _intern(
    interners: Sequence[StackInterner], session: np.ndarray, parents: np.ndarray, fids: np.ndarray
) -> np.ndarray:
    """The stacks of many (session, parent stack, function id) triples; new ones are interned.
    Python looks up each distinct triple once."""
    keys = parents << _FUNCTION_BITS | fids
    order = np.lexsort((keys, session))
    keys, session = keys[order], session[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (session[1:] != session[:-1])
    stacks = []
    for s, k in zip(session[first].tolist(), keys[first].tolist(), strict=True):
        interner = interners[s]
        found = interner.index.get(k)
        stacks.append(found or interner.child(k >> _FUNCTION_BITS, k & _FUNCTION_MASK))
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.array(stacks, dtype=np.int64)[np.cumsum(first) - 1]
    return out


def _stacks(forest: Forest, interners: Sequence[StackInterner], session: np.ndarray) -> np.ndarray:
    """Every node's interned stack, in its session's interner (`session`: an index into
    `interners` per node). A lane's root has its spawning call's; a lane spawned
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
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), len(order)]
    spans: list[list] = []  # [first, last, narrow]: runs of narrow levels joined
    for first, last in zip(starts, ends, strict=True) if len(order) else ():
        narrow = last - first < _NARROW
        if narrow and spans and spans[-1][2]:
            spans[-1][1] = last
        else:
            spans.append([first, last, narrow])
    for first, last, narrow in spans:
        nodes = order[first:last]
        if narrow:
            _one_by_one(nodes, stack, up, forest, interners, session)
        elif root[nodes[0]]:
            spawner = up[nodes]
            stack[nodes] = np.where(spawner >= 0, stack[np.maximum(spawner, 0)], 0)
        else:
            parents = stack[forest.parent[nodes]]
            stack[nodes] = _intern(interners, session[nodes], parents, forest.function[nodes])
    return stack


def _one_by_one(
    nodes: np.ndarray,
    stack: np.ndarray,
    up: np.ndarray,
    forest: Forest,
    interners: Sequence[StackInterner],
    session: np.ndarray,
) -> None:
    """Interns the stacks of a run of narrow levels in Python, node by node in level order
    (a node's parent or spawner comes first): a deep chain's one node per level costs a
    dict lookup, not a round of NumPy calls."""
    found: dict[int, int] = {}  # node -> stack, for this run
    columns = (nodes, forest.parent[nodes], up[nodes], forest.function[nodes], session[nodes])
    for node, parent, spawner, function, s in zip(*(c.tolist() for c in columns), strict=True):
        if function == LANE_ROOT:
            below = spawner
            if below < 0:
                found[node] = 0
                continue
        else:
            below = parent
        under = found[below] if below in found else int(stack[below])
        found[node] = under if function == LANE_ROOT else interners[s].child(under, function)
    stack[list(found)] = list(found.values())


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
    at = np.searchsorted(calls, forest.charged_node)  # calls their lanes waited on
    values[AWAITING, at], values[READYING, at] = forest.charged
    return values


def _outside(
    forest: Forest, stack: np.ndarray, interners: Sequence[StackInterner], session: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The lane roots with time outside profiled calls (their self time) and, per root, the
    lane's OUTSIDE_NAME stack in its session's interner: running time, but of no call."""
    roots = np.flatnonzero((forest.function == LANE_ROOT) & (forest.self_ns > 0))
    pairs = zip(session[roots].tolist(), stack[roots].tolist(), strict=True)
    return roots, _int64([interners[s].outside(parent) for s, parent in pairs])


def _int64(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@dataclass
class Summary:
    """What a forest's requests store and export, per request index in the forest."""

    trees: list[bytes]  # serialized StoredTree
    stacks: Totals  # key: stack id (stacktree.stack_id)
    functions: Totals  # key: global function id; TOTAL counts outermost calls only
    nodes: dict[int, tuple[int, int]]  # stack id -> (parent stack id, function id), as stored
    shown: Callable[[int], str | None]  # stack id -> its name as shown, for the stacks here
    function_names: dict[int, str]  # global function id -> name, for the functions here


def _first_of_each(
    global_ids: np.ndarray, keys: np.ndarray, bases: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct global ids of `keys` (numbers into the sessions' columns side by side,
    each session's from its base on), and for each the session and the session's own
    number of its first key."""
    distinct, first = np.unique(global_ids[keys], return_index=True)
    chosen = keys[first]
    of = np.searchsorted(bases, chosen, side="right") - 1
    return distinct, of, chosen - bases[of]


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def summarize(forest: Forest, interners: Mapping[str, StackInterner], problems: Counter) -> Summary:
    """The forest's stored trees and totals; stacks new to a session are interned in its
    interner (`interners`: by session id). A storage group's requests of all its sessions
    go together: the NumPy passes cost per group, not per session."""
    number: dict[str, int] = {}
    request_session = np.array(
        [number.setdefault(r.session_id, len(number)) for r in forest.requests], dtype=np.int64
    )
    used = [interners[sid] for sid in number]
    unknown_before = sum(i.unknown for i in used)
    over_before = sum(i.over_names for i in used)
    session = request_session[forest.owner()]
    stack = _stacks(forest, used, session)
    roots, outside = _outside(forest, stack, used, session)
    # the sessions' stacks side by side: a node's stack is its session's base + its index
    columns = [i.columns() for i in used]
    bases = np.cumsum([0, *(len(c.ids) for c in columns)])
    function_bases = np.cumsum([0, *(len(c.functions) for c in columns)])
    ids = _joined([c.ids for c in columns])
    outermost = _joined([c.outermost for c in columns])
    leaf = _joined([c.leaf + b for c, b in zip(columns, function_bases.tolist(), strict=False)])
    functions = _joined([c.functions for c in columns])
    calls = np.flatnonzero(forest.function != LANE_ROOT)
    outside_values = np.zeros((WIDTH, len(roots)), dtype=np.int64)
    outside_values[SELF] = forest.self_ns[roots]
    both = np.concatenate([calls, roots])
    per_stack = Totals.grouped(
        forest.owner()[both],
        np.concatenate([stack[calls], outside]) + bases[session[both]],
        np.concatenate([_node_values(forest, calls), outside_values], axis=1),
    )
    of_calls = functions[leaf[per_stack.key]] != OUTSIDE_ID
    values = per_stack.values[:, of_calls]
    values[TOTAL] *= outermost[per_stack.key[of_calls]]  # recursion: count the outermost call
    per_function = Totals.grouped(per_stack.owner[of_calls], leaf[per_stack.key[of_calls]], values)
    # Sessions of one service share their functions and stacks (ids are stable), so each
    # name and row is looked up once per id, not once per session: a fleet's group holds
    # hundreds of sessions with the same few stacks.
    gids, of, local = _first_of_each(functions, per_function.key, function_bases)
    function_names = {
        gid: used[s].function_names[j]
        for gid, s, j in zip(gids.tolist(), of.tolist(), local.tolist(), strict=True)
    }
    per_function.key = functions[per_function.key]
    sids, of, local = _first_of_each(ids, per_stack.key, bases)
    nodes: dict[int, tuple[int, int]] = {}
    shown_by: dict[int, StackInterner] = {}
    for sid, s, j in zip(sids.tolist(), of.tolist(), local.tolist(), strict=True):
        nodes[sid] = used[s].row(j)
        shown_by[sid] = used[s]
    per_stack.key = ids[per_stack.key]
    unknown = sum(i.unknown for i in used) - unknown_before
    if unknown:
        problems[P.UNKNOWN_FUNCTION] += unknown
    over = sum(i.over_names for i in used) - over_before
    if over:
        problems[P.UNKNOWN_FUNCTION_LIMIT] += over
    names = [used[s].name for s in request_session.tolist()]
    trees = stored_trees(forest, names)

    def shown(sid: int) -> str | None:
        interner = shown_by.get(sid)
        return None if interner is None else interner.shown(sid)

    return Summary(trees, per_stack, per_function, nodes, shown, function_names)
