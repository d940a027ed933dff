"""Rebuilds a request's call tree, lane by lane, from its enter/exit/suspend/resume events.

Bad input is repaired, never fatal: every repair is counted by reason in `problems`.
"""

from __future__ import annotations

from collections import Counter
from operator import itemgetter

from profiler_core.model import MAIN_LANE, EventKind, LaneKind, Outcome
from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import AssembledRequest, LaneTree, Node
from profiler_server.assembly.pending import LaneInfo, PendingRequest

ENTER = int(EventKind.ENTER)  # plain ints: the hot loop compares bytes
EXIT = int(EventKind.EXIT)
EXIT_EXCEPTION = int(EventKind.EXIT_EXCEPTION)
SUSPEND = int(EventKind.SUSPEND)
RESUME = int(EventKind.RESUME)
READY = int(EventKind.READY)

LANE_ROOT = -1  # function id of a lane's synthetic root node


class _Lane:
    __slots__ = ("last", "root", "stack")

    def __init__(self, root: Node) -> None:
        self.root = root
        self.stack: list[Node] = []
        self.last = root.start


def _close(node: Node, t: int, outcome: Outcome) -> None:
    if node.slice_start >= 0:
        slice_ns = t - node.slice_start
        node.active_ns += slice_ns
        if slice_ns > node.max_slice_ns:
            node.max_slice_ns = slice_ns
        node.slice_start = -1
    elif node.suspended_at >= 0:
        _end_wait(node, t)
    node.end = t
    node.outcome = outcome


def _end_wait(node: Node, t: int) -> None:
    if node.ready_at >= 0:
        node.await_ns += node.ready_at - node.suspended_at
        node.ready_ns += t - node.ready_at
    else:
        node.await_ns += t - node.suspended_at
    node.suspended_at = -1
    node.ready_at = -1


def _unwind_to(lane: _Lane, node: Node, t: int, problems: Counter) -> bool:
    """Pops `node` off the lane's stack, closing (truncated) anything left open above it."""
    stack = lane.stack
    if node not in stack:
        return False
    while stack[-1] is not node:
        _close(stack.pop(), t, Outcome.TRUNCATED)
        problems[P.MISSING_EXIT] += 1
    stack.pop()
    return True


def _flatten_runs(
    pending: PendingRequest,
) -> tuple[bytearray, list[int], list[int], list[int], list[int]]:
    kinds = bytearray()
    functions: list[int] = []
    calls: list[int] = []
    times: list[int] = []
    lanes: list[int] = []
    for _, run in sorted(pending.runs, key=itemgetter(0)):
        kinds += run.kinds
        functions += run.functions
        calls += run.calls
        times += run.times
        lanes += [run.lane_id] * len(run.kinds)
    return kinds, functions, calls, times, lanes


def assemble(
    session_id: str, pending: PendingRequest, problems: Counter, main_name: str = ""
) -> AssembledRequest:
    """Builds the lanes' call trees; repairs and counts whatever does not fit."""
    kinds, functions, calls, times, lane_ids = _flatten_runs(pending)
    n = len(kinds)
    missing_before = problems[P.MISSING_EXIT]  # any call closed without its exit truncates
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

    # Events of several lanes are processed in time order (a generator entered in one
    # lane may be resumed in another); a stable sort keeps each lane's own order.
    order = sorted(range(n), key=times.__getitem__) if len(set(lane_ids)) > 1 else range(n)

    infos = dict(pending.lanes)
    main_root = Node(0, LANE_ROOT, None, start)
    lanes: dict[int, _Lane] = {MAIN_LANE: _Lane(main_root)}
    trees: dict[int, LaneTree] = {
        MAIN_LANE: LaneTree(MAIN_LANE, LaneKind.MAIN, main_name or "main", main_root)
    }
    nodes: dict[int, Node] = {}
    dropped_after_end = 0

    lane_id = MAIN_LANE
    lane = lanes[MAIN_LANE]
    for i in order:
        t = times[i]
        if t > end:
            dropped_after_end += 1
            continue
        if lane_ids[i] != lane_id:
            lane_id = lane_ids[i]
            lane = lanes.get(lane_id) or _open_lane(lane_id, infos, lanes, trees, t)
        stack = lane.stack
        elapsed = t - lane.last
        if elapsed > 0:
            (stack[-1] if stack else lane.root).self_ns += elapsed
            lane.last = t
        kind = kinds[i]
        call = calls[i]
        if kind == ENTER:
            parent = stack[-1] if stack else lane.root
            node = Node(call, functions[i], parent, t)
            parent.children.append(node)
            nodes[call] = node
            stack.append(node)
            continue
        node = nodes.get(call)
        if kind in (EXIT, EXIT_EXCEPTION):
            if node is None or node.closed:
                problems[P.EXIT_WITHOUT_ENTER] += 1
                continue
            if node.function != functions[i]:
                problems[P.EXIT_MISMATCH] += 1
            if node.slice_start >= 0 and not _unwind_to(lane, node, t, problems):
                _unwind_elsewhere(lanes, node, t, problems)
            _close(node, t, Outcome.RETURN if kind == EXIT else Outcome.EXCEPTION)
        elif kind == SUSPEND:
            if node is None or node.closed or node.slice_start < 0:
                problems[P.SUSPEND_WHILE_SUSPENDED] += 1
                continue
            if not _unwind_to(lane, node, t, problems):
                _unwind_elsewhere(lanes, node, t, problems)
            slice_ns = t - node.slice_start
            node.active_ns += slice_ns
            if slice_ns > node.max_slice_ns:
                node.max_slice_ns = slice_ns
            node.slice_start = -1
            node.suspended_at = t
            node.suspensions += 1
        elif kind == RESUME:
            if node is None or node.closed or node.suspended_at < 0:
                problems[P.RESUME_WITHOUT_SUSPEND] += 1
                continue
            _end_wait(node, t)
            node.slice_start = t
            stack.append(node)
        elif kind == READY and node is not None and node.suspended_at >= 0 and node.ready_at < 0:
            node.ready_at = t

    if dropped_after_end:
        problems[P.EVENTS_AFTER_END] += dropped_after_end
    _close_open(lanes, nodes, end, problems)
    truncated = truncated or problems[P.MISSING_EXIT] > missing_before
    for lid, state in lanes.items():
        root = state.root
        root.end = end if lid == MAIN_LANE else max(state.last, root.start)
        root.active_ns = root.end - root.start
    for tree in trees.values():
        if tree.parent_call is not None and tree.parent_call not in nodes:
            tree.parent_call = None
        if tree.parent_lane is not None and tree.parent_lane not in trees:
            tree.parent_lane = MAIN_LANE
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
        lanes=list(trees.values()),
    )


def _open_lane(
    lane_id: int,
    infos: dict[int, LaneInfo],
    lanes: dict[int, _Lane],
    trees: dict[int, LaneTree],
    first_event: int,
) -> _Lane:
    info = infos.get(lane_id) or LaneInfo(LaneKind.THREAD, f"lane {lane_id}", MAIN_LANE, None, None)
    start = first_event if info.start_ns is None else min(info.start_ns, first_event)
    root = Node(0, LANE_ROOT, None, start)
    lane = lanes[lane_id] = _Lane(root)
    trees[lane_id] = LaneTree(
        lane_id, info.kind, info.name, root, info.parent_lane, info.parent_call
    )
    return lane


def _unwind_elsewhere(lanes: dict[int, _Lane], node: Node, t: int, problems: Counter) -> None:
    for other in lanes.values():
        if _unwind_to(other, node, t, problems):
            return


def _close_open(
    lanes: dict[int, _Lane], nodes: dict[int, Node], end: int, problems: Counter
) -> None:
    """Closes what is still open at the request's end, marked truncated."""
    for lane_id, state in lanes.items():
        stack = state.stack
        # the main lane's root lasts until the request's end: the tail is its self time
        if end > state.last and (stack or lane_id == MAIN_LANE):
            (stack[-1] if stack else state.root).self_ns += end - state.last
            state.last = end
        while stack:
            _close(stack.pop(), end, Outcome.TRUNCATED)
            problems[P.MISSING_EXIT] += 1
    for node in nodes.values():
        if not node.closed:  # suspended generators/coroutines
            _close(node, end, Outcome.TRUNCATED)
            problems[P.MISSING_EXIT] += 1
