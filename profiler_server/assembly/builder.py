"""Rebuilds one request's call tree, lane by lane, from its enter/exit/suspend/resume events.

The general path: requests with several lanes, suspensions or bad input (well-nested ones
are assembled in bulk by `nested.py`). The common case (a call entered and left on top of
its lane's stack) is one tight loop over the event columns; everything unusual goes through
`_Repairs`, which repairs what it can and counts every repair by reason in `problems`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from itertools import repeat
from operator import indexOf, itemgetter

import numpy as np

from profiler_core.model import EXIT_OUTCOMES, MAIN_LANE, EventKind, LaneKind, Outcome
from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import (
    ACTIVE,
    AWAIT,
    LANE_ROOT,
    MAX_SLICE,
    MAX_WAITS,
    READY,
    READY_AT,
    SLICE_START,
    SUSPENDED_AT,
    SUSPENSIONS,
    AssembledRequest,
    CallTree,
    LaneTree,
)
from profiler_server.assembly.pending import LaneInfo, PendingRequest

# Plain ints: the hot loop compares bytes.
ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
EXITS = {int(kind): outcome for kind, outcome in EXIT_OUTCOMES.items()}
SUSPEND = int(EventKind.SUSPEND)
RESUME = int(EventKind.RESUME)
READY_EVENT = int(EventKind.READY)


class _Lane:
    """A lane being rebuilt. `chain` and `innermost` are the outermost and innermost calls
    of the lane's last run of suspensions (an await chain suspends innermost first);
    `waiting` is that innermost call when the run emptied the lane's stack (-1: none):
    while it stays suspended and nothing runs in the lane, the lane waits on it."""

    __slots__ = ("chain", "innermost", "last", "root", "stack", "waiting")

    def __init__(self, root: int, start: int) -> None:
        self.root = root
        self.stack: list[int] = []
        self.last = start
        self.chain = self.innermost = self.waiting = -1


def _columns(
    pending: PendingRequest,
) -> tuple[bytes, list[int], list[int], list[int], list[int] | None]:
    """The request's events as flat columns in seq order; lane per event unless all are main."""
    runs = [run for _, run in sorted(pending.runs, key=itemgetter(0))]
    if not runs:
        return b"", [], [], [], None
    kinds = np.concatenate([run.kinds for run in runs]).tobytes()
    functions, calls, times = (
        np.concatenate(columns).tolist()
        for columns in zip(*((run.functions, run.calls, run.times) for run in runs), strict=True)
    )
    if all(run.lane_id == MAIN_LANE for run in runs):
        return kinds, functions, calls, times, None
    lanes = np.repeat([run.lane_id for run in runs], [len(run.kinds) for run in runs])
    return kinds, functions, calls, times, lanes.tolist()


class _Repairs:
    """Everything off the common path: lanes, suspensions, odd exits, the end of the request."""

    def __init__(
        self,
        tree: CallTree,
        infos: dict[int, LaneInfo],
        problems: Counter,
        running: frozenset[int] = frozenset(),
    ) -> None:
        self.tree = tree
        self.infos = infos
        self.problems = problems
        self.running = running  # lanes whose work still ran at the request's end
        self.lanes: dict[int, _Lane] = {}
        self.call_node: dict[int, int] = {}
        # per node: the lane whose stack holds it while it runs (where it was entered, or
        # last resumed), so an odd exit finds it without searching every lane's stack
        self.stack_of: list[_Lane] = []
        # lanes (index in tree.lanes) to hang once every call is known: under the call their
        # host named, or (none named) under the call open when they started
        self.named_spawns: list[tuple[int, int]] = []
        self.placed_by_time: list[int] = []

    def open_lane(self, lane_id: int, start: int, kind: LaneKind, name: str) -> _Lane:
        tree = self.tree
        root = len(tree.function)
        info = self.infos.get(lane_id)
        parent_lane = parent_node = None
        if lane_id != MAIN_LANE:
            if info is None:
                info = LaneInfo(kind, name, MAIN_LANE, None, None)
            kind, name = info.kind, info.name
            if info.start_ns is not None:
                start = min(start, info.start_ns)
            parent_lane = info.parent_lane if info.parent_lane in self.lanes else MAIN_LANE
            if info.parent_call is not None:
                self.named_spawns.append((len(tree.lanes), info.parent_call))
            else:
                self.placed_by_time.append(len(tree.lanes))
        tree.call.append(0)
        tree.function.append(LANE_ROOT)
        tree.parent.append(-1)
        tree.start.append(start)
        tree.end.append(-1)
        tree.self_ns.append(0)
        tree.lanes.append(LaneTree(lane_id, kind, name, root, parent_lane, parent_node))
        lane = self.lanes[lane_id] = _Lane(root, start)
        self.stack_of.append(lane)
        return lane

    def close(self, node: int, t: int, outcome: Outcome) -> None:
        tree = self.tree
        tree.end[node] = t
        if outcome != Outcome.RETURN:
            tree.outcomes[node] = outcome
        extra = tree.extras.get(node)
        if extra is None:
            return
        if extra[SLICE_START] >= 0:
            _end_slice(extra, t)
        elif extra[SUSPENDED_AT] >= 0:  # closed at its yield: close(), throw(), cancellation
            self.end_wait(node, extra, t)

    def end_wait(self, node: int, extra: list[int], t: int) -> None:
        waits = self.tree.waits
        if len(waits) < MAX_WAITS:
            waits.append((node, extra[SUSPENDED_AT], extra[READY_AT], t))
        _end_wait(extra, t)

    def idle(self, lane: _Lane, t: int) -> None:
        """Charges the time since the lane's last event, when nothing ran in it: to the await
        chain it waits on (awaiting until woken, then ready), else to the lane's root."""
        tree, waiting = self.tree, lane.waiting
        extra = tree.extras.get(waiting) if waiting >= 0 else None
        if extra is None or extra[SUSPENDED_AT] < 0:
            tree.self_ns[lane.root] += t - lane.last
        else:
            charged = tree.charged.setdefault(waiting, [0, 0])
            charged[extra[READY_AT] >= 0] += t - lane.last
        lane.last = t

    def unwind(self, node: int, t: int) -> None:
        """Pops running `node` off its lane's stack, closing (truncated) whatever was left
        open above it. Searched from the top: a call whose exit was lost lies just above
        its caller, so the search costs what it pops, however deep the stack."""
        stack = self.stack_of[node].stack
        try:
            above = indexOf(reversed(stack), node)
        except ValueError:
            return
        for _ in range(above):
            self.close(stack.pop(), t, Outcome.TRUNCATED)
            self.problems[P.MISSING_EXIT] += 1
        stack.pop()

    def exit(self, node: int, kind: int, function: int, t: int) -> None:
        tree = self.tree
        if node < 0 or tree.end[node] >= 0:
            self.problems[P.EXIT_WITHOUT_ENTER] += 1
            return
        if tree.function[node] != function:
            self.problems[P.EXIT_MISMATCH] += 1
        extra = tree.extras.get(node)
        if extra is None or extra[SLICE_START] >= 0:
            self.unwind(node, t)
        self.close(node, t, EXITS[kind])

    def suspension(self, lane: _Lane, node: int, kind: int, t: int) -> None:
        tree = self.tree
        closed = node < 0 or tree.end[node] >= 0
        extra = None if closed else tree.extras.get(node)
        if kind == SUSPEND:
            if closed:
                self.problems[P.SUSPEND_WHILE_SUSPENDED] += 1
                return
            if extra is None:
                extra = tree.extras[node] = [0, 0, 0, 0, 0, tree.start[node], -1, -1]
            elif extra[SLICE_START] < 0:
                self.problems[P.SUSPEND_WHILE_SUSPENDED] += 1
                return
            self.unwind(node, t)
            _end_slice(extra, t)
            extra[SUSPENDED_AT] = t
            extra[SUSPENSIONS] += 1
            owner = self.stack_of[node]
            if owner.chain < 0 or tree.parent[owner.chain] != node:
                owner.innermost = node  # a chain suspends innermost first: a new one
            owner.chain = node  # else `node` awaited the chain's outermost so far
            owner.waiting = -1 if owner.stack else owner.innermost
        elif kind == RESUME:
            if extra is None or extra[SUSPENDED_AT] < 0:
                self.problems[P.RESUME_WITHOUT_SUSPEND] += 1
                return
            self.end_wait(node, extra, t)
            extra[SLICE_START] = t
            self.stack_of[node].waiting = lane.waiting = -1
            lane.stack.append(node)
            self.stack_of[node] = lane
        elif extra is not None and extra[SUSPENDED_AT] >= 0 and extra[READY_AT] < 0:
            extra[READY_AT] = t

    def finish(self, end: int) -> None:
        """Closes what is still open at the request's end, marked truncated: a repair, but
        in a lane whose thread, task or pool work still ran then (the host says which)."""
        tree = self.tree
        for lane_id, lane in self.lanes.items():
            stack = lane.stack
            if end > lane.last and stack:
                tree.self_ns[stack[-1]] += end - lane.last
                lane.last = end
            elif end > lane.last and (lane_id == MAIN_LANE or lane.waiting >= 0):
                self.idle(lane, end)  # a lane still waiting at the end lasts until then
            while stack:
                self.close(stack.pop(), end, Outcome.TRUNCATED)
                if lane_id not in self.running:
                    self.problems[P.MISSING_EXIT] += 1
            tree.end[lane.root] = end if lane_id == MAIN_LANE else lane.last
        roots = {lane.lane_id: lane.root for lane in tree.lanes}
        for spawned in reversed(tree.lanes):  # a lane lasts at least as long as its children
            if spawned.parent_lane is not None:
                parent_root = roots[spawned.parent_lane]
                if tree.end[spawned.root] > tree.end[parent_root]:
                    tree.self_ns[parent_root] += tree.end[spawned.root] - tree.end[parent_root]
                    tree.end[parent_root] = tree.end[spawned.root]
        lane_of_root = {root: lane_id for lane_id, root in roots.items()}
        suspended = [node for node in tree.extras if tree.end[node] < 0]
        root_of = self.roots() if suspended else []
        for node in suspended:
            self.close(node, end, Outcome.TRUNCATED)
            if lane_of_root.get(root_of[node]) not in self.running:
                self.problems[P.MISSING_EXIT] += 1

    def roots(self) -> list[int]:
        """The lane root each node hangs under, in one pass (a parent is always entered
        before its children, so it comes first): no walk up a deep tree per node."""
        root_of: list[int] = []
        for node, parent in enumerate(self.tree.parent):
            root_of.append(node if parent < 0 else root_of[parent])
        return root_of


def _end_slice(extra: list[int], t: int) -> None:
    slice_ns = t - extra[SLICE_START]
    extra[ACTIVE] += slice_ns
    if slice_ns > extra[MAX_SLICE]:
        extra[MAX_SLICE] = slice_ns
    extra[SLICE_START] = -1


def _end_wait(extra: list[int], t: int) -> None:
    if extra[READY_AT] >= 0:
        extra[AWAIT] += extra[READY_AT] - extra[SUSPENDED_AT]
        extra[READY] += t - extra[READY_AT]
    else:
        extra[AWAIT] += t - extra[SUSPENDED_AT]
    extra[SUSPENDED_AT] = -1
    extra[READY_AT] = -1


def _place_spawned_lanes(tree: CallTree, unplaced: list[LaneTree]) -> None:
    """Lanes whose host did not name the spawning call hang under the deepest call of their
    parent lane that was open when they started (a host knows its lane, not its call).

    Calls of a lane nest and a node's children are in the order they started, so the walk
    goes down from the parent lane's root, bisecting each level: no scan of every call."""
    if not unplaced:
        return
    parent, start, end = tree.parent, tree.start, tree.end
    children: dict[int, list[int]] = {}
    for node, up in enumerate(parent):
        if up >= 0:
            children.setdefault(up, []).append(node)
    starts: dict[int, list[int]] = {}
    roots = {lane.lane_id: lane.root for lane in tree.lanes}
    for lane in unplaced:
        t = start[lane.root]
        node, found = roots.get(lane.parent_lane), None
        while node is not None and node in children:
            kids = children[node]
            if node not in starts:
                starts[node] = [start[kid] for kid in kids]
            i = bisect_right(starts[node], t) - 1
            if i < 0 or end[kids[i]] < t:
                break
            node = found = kids[i]
        lane.parent_node = found


def assemble(
    session_id: str, pending: PendingRequest, problems: Counter, main_name: str = ""
) -> AssembledRequest:
    """Builds the lanes' call trees; repairs and counts whatever does not fit."""
    kinds, functions, calls, times, lane_ids = _columns(pending)
    truncated = pending.host_truncated or pending.dropped_events > 0
    start = pending.start_ns
    if start is None:
        problems[P.MISSING_START] += 1
        start = min(times) if times else 0
    end = pending.end_ns
    if end is None:
        truncated = True
        end = max(times) if times else start
    end = max(end, start)

    tree = CallTree()
    repairs = _Repairs(tree, pending.lanes, problems, pending.running_lanes)
    missing_before = problems[P.MISSING_EXIT]
    lane = repairs.open_lane(MAIN_LANE, start, LaneKind.MAIN, main_name or "main")
    for lane_id, info in sorted(pending.lanes.items()):
        if info.start_ns is not None and start <= info.start_ns <= end:
            # announced lanes start where they were handed over, events or not
            repairs.open_lane(lane_id, info.start_ns, info.kind, info.name)
    call_node = repairs.call_node
    fn, par, st, en, sf = tree.function, tree.parent, tree.start, tree.end, tree.self_ns
    call_col, extras, stack_of = tree.call, tree.extras, repairs.stack_of
    if lane_ids is None:
        lanes_of: Iterable[int] = repeat(MAIN_LANE)
    else:
        # Several lanes: process in time order (a generator entered in one lane may be
        # resumed in another); the sort is stable, so each lane keeps its own order.
        order = sorted(range(len(kinds)), key=times.__getitem__)
        kinds = bytearray(kinds[i] for i in order)
        functions = [functions[i] for i in order]
        calls = [calls[i] for i in order]
        times = [times[i] for i in order]
        lanes_of = [lane_ids[i] for i in order]
    lane_id = MAIN_LANE
    stack, last, root = lane.stack, lane.last, lane.root
    after_end = 0
    columns = zip(times, kinds, functions, calls, lanes_of, strict=False)  # lanes_of may repeat
    for t, kind, function, call, event_lane in columns:
        if t > end:
            after_end += 1
            continue
        if event_lane != lane_id:
            lane.last = last
            lane_id = event_lane
            lane = repairs.lanes.get(lane_id) or repairs.open_lane(
                lane_id, t, LaneKind.THREAD, f"lane {lane_id}"
            )
            stack, last, root = lane.stack, lane.last, lane.root
        if t > last:
            if stack:
                sf[stack[-1]] += t - last
            else:
                lane.last = last
                repairs.idle(lane, t)
            last = t
        if kind == ENTER:
            call_node[call] = len(fn)
            call_col.append(call)
            fn.append(function)
            par.append(stack[-1] if stack else root)
            st.append(t)
            en.append(-1)
            sf.append(0)
            stack.append(len(fn) - 1)
            stack_of.append(lane)
            continue
        node = call_node.get(call, -1)
        if kind == EXIT and stack and stack[-1] == node and node not in extras:
            stack.pop()
            en[node] = t
            if fn[node] != function:
                problems[P.EXIT_MISMATCH] += 1
        elif kind in EXITS:
            repairs.exit(node, kind, function, t)
        else:
            repairs.suspension(lane, node, kind, t)
    lane.last = last
    if after_end:
        problems[P.EVENTS_AFTER_END] += after_end
    repairs.finish(end)
    for index, call in repairs.named_spawns:
        tree.lanes[index].parent_node = repairs.call_node.get(call)  # unknown: the root
    _place_spawned_lanes(tree, [tree.lanes[i] for i in repairs.placed_by_time])
    truncated = truncated or problems[P.MISSING_EXIT] > missing_before
    return AssembledRequest(
        session_id=session_id,
        request_id=pending.request_id,
        route=pending.route,
        method=pending.method,
        status=pending.status,
        start=start,
        end=end,
        truncated=truncated,
        events=pending.events,
        tree=tree,
    )
