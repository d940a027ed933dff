"""Rebuilding call trees from hand-written events: exact times, generators, lanes, repairs.

Each test writes the events a host would send for one request (times are monotonic ns),
assembles them, and checks the tree and the problems counted by reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from profiler_core.model import EventKind, LaneKind, Outcome
from profiler_core.wire import tree_pb2
from profiler_server.assembly import calltree as C
from profiler_server.assembly import problems as P
from profiler_server.assembly.builder import assemble
from profiler_server.assembly.calltree import AssembledRequest
from profiler_server.assembly.events import Run
from profiler_server.assembly.flatten import StackInterner, summarize
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.pending import LaneInfo, PendingRequest
from profiler_server.assembly.totals import (
    ACTIVE,
    AWAIT,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    SELF,
    TOTAL,
)

ENTER, EXIT, RAISE = EventKind.ENTER, EventKind.EXIT, EventKind.EXIT_EXCEPTION
SUSPEND, RESUME, READY_EV = EventKind.SUSPEND, EventKind.RESUME, EventKind.READY

# function ids -> names (what the session's FunctionDefs would say)
F, G, H, GEN, GEN2 = 1, 2, 3, 4, 5
NAMES = {F: "app:f", G: "app:g", H: "app:h", GEN: "app:gen", GEN2: "app:gen2"}
NAMES_BY_ID = {fid: (fid, name) for fid, name in NAMES.items()}


def run(lane: int, *events: tuple[EventKind, int, int, int], request_id: int = 1) -> Run:
    """One run of (kind, function, call, time) events on a lane."""
    return Run(
        request_id,
        lane,
        np.array([int(e[0]) for e in events], dtype=np.uint8),
        np.array([e[1] for e in events], dtype=np.int64),
        np.array([e[2] for e in events], dtype=np.uint64),
        np.array([e[3] for e in events], dtype=np.int64),
    )


def request(
    *runs: Run | tuple[int, Run],
    start: int | None = 0,
    end: int | None = 1000,
    lanes: dict[int, LaneInfo] | None = None,
) -> PendingRequest:
    """A pending request; a run given as (seq, run) says which batch carried it."""
    pending = PendingRequest(1, route="/r", method="GET", start_ns=start, end_ns=end, status=200)
    for i, item in enumerate(runs, 1):
        seq, r = item if isinstance(item, tuple) else (i, item)
        pending.runs.append((seq, r))
        pending.events += len(r.kinds)
    pending.lanes.update(lanes or {})
    return pending


def build(pending: PendingRequest) -> tuple[AssembledRequest, Counter]:
    problems: Counter = Counter()
    return assemble("s", pending, problems, "GET /r"), problems


@dataclass(eq=False)
class Node:
    """One call, read back from the tree's columns (compared by identity)."""

    call: int
    function: int
    start: int
    end: int
    self_ns: int
    active_ns: int
    await_ns: int
    ready_ns: int
    max_slice_ns: int
    suspensions: int
    outcome: Outcome
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)


@dataclass
class Lane:
    lane_id: int
    kind: LaneKind
    name: str
    root: Node
    parent_lane: int | None
    parent_call: int | None


_views: dict[int, tuple[AssembledRequest, list[Lane]]] = {}


def lane_views(assembled: AssembledRequest) -> list[Lane]:
    """The lanes with nested nodes (built once per request, so identities hold)."""
    cached = _views.get(id(assembled))
    if cached is not None and cached[0] is assembled:
        return cached[1]
    tree = assembled.tree
    nodes = []
    for i in range(len(tree)):
        extra = tree.extras.get(i, [tree.active_ns(i), 0, 0, tree.end[i] - tree.start[i], 0])
        nodes.append(
            Node(
                tree.call[i],
                tree.function[i],
                tree.start[i],
                tree.end[i],
                tree.self_ns[i],
                tree.active_ns(i),
                extra[C.AWAIT],
                extra[C.READY],
                extra[C.MAX_SLICE],
                extra[C.SUSPENSIONS],
                tree.outcomes.get(i, Outcome.RETURN),
            )
        )
    for i, parent in enumerate(tree.parent):
        if parent >= 0:
            nodes[i].parent = nodes[parent]
            nodes[parent].children.append(nodes[i])
    result = [
        Lane(
            lane.lane_id,
            lane.kind,
            lane.name,
            nodes[lane.root],
            lane.parent_lane,
            None if lane.parent_node is None else tree.call[lane.parent_node],
        )
        for lane in tree.lanes
    ]
    _views[id(assembled)] = (assembled, result)
    return result


def calls(assembled: AssembledRequest) -> dict[int, Node]:
    """Every call node of every lane, by call id."""
    found: dict[int, Node] = {}
    work = [lane.root for lane in lane_views(assembled)]
    while work:
        node = work.pop()
        if node.function >= 0:
            found[node.call] = node
        work.extend(node.children)
    return found


@dataclass
class Flat:
    """A request's summary, read back: stored tree, totals per stack and per function."""

    tree: tree_pb2.StoredTree
    stacks: dict[str, list[int]]  # signature -> totals
    functions: dict[int, list[int]]  # function id -> totals


def flat(assembled: AssembledRequest) -> Flat:
    interners = {assembled.session_id: StackInterner(NAMES_BY_ID.get)}
    summary = summarize(Forest.of_trees([assembled]), interners, Counter())
    stacks, functions = summary.stacks, summary.functions
    return Flat(
        tree_pb2.StoredTree.FromString(summary.trees[0]),
        {
            summary.shown(key): values
            for key, values in zip(stacks.key.tolist(), stacks.values.T.tolist(), strict=True)
        },
        dict(zip(functions.key.tolist(), functions.values.T.tolist(), strict=True)),
    )


def fn(node: Node) -> str:
    return NAMES[node.function]


# --- plain calls -------------------------------------------------------------------------------


def test_nested_calls_get_exact_start_end_and_self_time() -> None:
    # f calls g then h; the request runs 0..250
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 100),
                (ENTER, G, 2, 110),
                (EXIT, G, 2, 140),
                (ENTER, H, 3, 150),
                (EXIT, H, 3, 170),
                (EXIT, F, 1, 200),
            ),
            end=250,
        )
    )
    assert problems == Counter()
    assert not req.truncated
    (main,) = lane_views(req)
    assert main.kind == LaneKind.MAIN and main.name == "GET /r"
    (f,) = main.root.children
    g, h = f.children
    assert [fn(f), fn(g), fn(h)] == ["app:f", "app:g", "app:h"]
    assert (f.start, f.end, g.start, g.end, h.start, h.end) == (100, 200, 110, 140, 150, 170)
    # self = wall - children
    assert f.self_ns == 100 - 30 - 20 == 50
    assert (g.self_ns, h.self_ns) == (30, 20)
    assert f.active_ns == 100 and f.suspensions == 0 and f.await_ns == 0
    assert {n.outcome for n in (f, g, h)} == {Outcome.RETURN}
    # the lane's root spans the request; its self time is the time outside f
    assert (main.root.start, main.root.end) == (0, 250)
    assert main.root.self_ns == 250 - 100


def test_an_exception_exit_is_recorded_as_the_calls_outcome() -> None:
    req, problems = build(
        request(run(0, (ENTER, F, 1, 0), (ENTER, G, 2, 10), (RAISE, G, 2, 20), (EXIT, F, 1, 30)))
    )
    f, g = calls(req)[1], calls(req)[2]
    assert (g.outcome, f.outcome) == (Outcome.EXCEPTION, Outcome.RETURN)
    assert problems == Counter()


# --- generators and coroutines ----------------------------------------------------------------


def test_generator_active_time_is_the_time_between_resume_and_suspend() -> None:
    # f drives gen: three slices of 10, 20 and 5 ns, suspended for 30 and 70 ns
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (ENTER, GEN, 2, 20),  # generators "enter" on their first resume
                (SUSPEND, GEN, 2, 30),
                (RESUME, GEN, 2, 60),
                (SUSPEND, GEN, 2, 80),
                (RESUME, GEN, 2, 150),
                (EXIT, GEN, 2, 155),
                (EXIT, F, 1, 200),
            )
        )
    )
    assert problems == Counter()
    f, gen = calls(req)[1], calls(req)[2]
    assert gen.parent is f and f.children == [gen]
    assert (gen.start, gen.end) == (20, 155)
    assert gen.active_ns == 10 + 20 + 5
    assert gen.suspensions == 2
    assert gen.await_ns == 30 + 70
    assert gen.ready_ns == 0
    assert gen.max_slice_ns == 20
    assert gen.active_ns + gen.await_ns == gen.end - gen.start
    assert gen.self_ns == 35  # only while it runs
    assert f.self_ns == (200 - 10) - 35  # f runs while gen is suspended


def test_ready_splits_a_suspension_into_await_and_ready_wait() -> None:
    # the awaited result is ready at 40 but the loop resumes the coroutine only at 50
    req, problems = build(
        request(
            run(
                0,
                (ENTER, GEN, 1, 0),
                (SUSPEND, GEN, 1, 10),
                (READY_EV, GEN, 1, 40),
                (READY_EV, GEN, 1, 45),  # a second READY does not move the first
                (RESUME, GEN, 1, 50),
                (EXIT, GEN, 1, 60),
            )
        )
    )
    coro = calls(req)[1]
    assert (coro.await_ns, coro.ready_ns, coro.active_ns) == (30, 10, 20)
    assert coro.suspensions == 1
    assert problems == Counter()


def test_each_suspension_is_kept_with_its_times_for_the_timeline() -> None:
    req, problems = build(
        request(
            run(
                0,
                (ENTER, GEN, 1, 0),
                (SUSPEND, GEN, 1, 10),
                (READY_EV, GEN, 1, 40),
                (RESUME, GEN, 1, 50),
                (SUSPEND, GEN, 1, 60),
                (RAISE, GEN, 1, 90),  # closed (cancelled) while suspended
            ),
            start=5,
        )
    )
    assert problems == Counter()
    coro = 1  # node index: the lane's root is 0
    assert req.tree.waits == [(coro, 10, 40, 50), (coro, 60, -1, 90)]
    stored = flat(req).tree
    assert list(stored.wait_node) == [coro, coro]
    assert list(stored.wait_start_ns) == [5, 55]  # from the request's start
    assert list(stored.wait_ready_ns) == [30, -1]  # -1: never reported ready
    assert list(stored.wait_ns) == [40, 30]


def test_interleaved_generators_are_told_apart_by_call_id() -> None:
    # two generators of the same function, resumed alternately by f
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 0),
                (ENTER, GEN, 2, 10),
                (SUSPEND, GEN, 2, 20),
                (ENTER, GEN, 3, 30),
                (SUSPEND, GEN, 3, 40),
                (RESUME, GEN, 2, 50),
                (SUSPEND, GEN, 2, 60),
                (RESUME, GEN, 3, 70),
                (EXIT, GEN, 3, 80),
                (RESUME, GEN, 2, 90),
                (EXIT, GEN, 2, 105),
                (EXIT, F, 1, 110),
            )
        )
    )
    assert problems == Counter()
    f, first, second = calls(req)[1], calls(req)[2], calls(req)[3]
    assert f.children == [first, second]
    assert (first.start, first.end, first.suspensions) == (10, 105, 2)
    assert first.active_ns == 10 + 10 + 15 and first.max_slice_ns == 15
    assert first.await_ns == (50 - 20) + (90 - 60)
    assert (second.start, second.end, second.suspensions) == (30, 80, 1)
    assert second.active_ns == 10 + 10 and second.await_ns == 70 - 40
    assert f.self_ns == 110 - first.self_ns - second.self_ns == 110 - 35 - 20


def test_a_generator_closed_while_suspended_ends_with_its_exception_exit() -> None:
    # gen.close() raises GeneratorExit at the yield: EXIT_EXCEPTION arrives with no RESUME
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 0),
                (ENTER, GEN, 2, 10),
                (SUSPEND, GEN, 2, 20),
                (RAISE, GEN, 2, 50),
                (EXIT, F, 1, 60),
            )
        )
    )
    assert problems == Counter()
    assert not req.truncated
    f, gen = calls(req)[1], calls(req)[2]
    assert (gen.end, gen.outcome) == (50, Outcome.EXCEPTION)
    assert (gen.active_ns, gen.await_ns, gen.suspensions) == (10, 30, 1)
    assert f.self_ns == 60 - 10
    assert f.outcome == Outcome.RETURN


def test_a_generator_entered_and_not_driven_to_its_end_does_not_unwind_its_caller() -> None:
    # gen suspended, f returns (gen still suspended), g is called later: g is not gen's child
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 0),
                (ENTER, GEN, 2, 10),
                (SUSPEND, GEN, 2, 20),
                (EXIT, F, 1, 30),
                (ENTER, G, 3, 40),
                (RESUME, GEN, 2, 50),
                (EXIT, GEN, 2, 60),
                (EXIT, G, 3, 70),
            ),
            end=100,
        )
    )
    assert problems == Counter()
    f, gen, g = calls(req)[1], calls(req)[2], calls(req)[3]
    assert gen.parent is f and g.parent is lane_views(req)[0].root
    assert f.outcome == gen.outcome == g.outcome == Outcome.RETURN
    assert g.self_ns == 30 - 10  # gen ran 50..60 inside g
    assert (gen.active_ns, gen.await_ns) == (20, 30)


# --- lanes -------------------------------------------------------------------------------------


def test_spawned_lanes_hang_under_their_spawning_node_or_the_call_open_when_they_began() -> None:
    lanes = {
        1: LaneInfo(LaneKind.TASK, "worker", parent_lane=0, parent_call=1, start_ns=20),
        2: LaneInfo(LaneKind.THREAD, "orphan", parent_lane=0, parent_call=999, start_ns=None),
        # lane 3 sends no Lane record at all
    }
    req, problems = build(
        request(
            run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 100)),
            run(1, (ENTER, H, 11, 30), (EXIT, H, 11, 50)),
            run(2, (ENTER, H, 21, 40), (EXIT, H, 21, 60)),
            run(3, (ENTER, G, 31, 70), (EXIT, G, 31, 80)),
            lanes=lanes,
        )
    )
    assert problems == Counter()
    trees = {lane.lane_id: lane for lane in lane_views(req)}
    assert set(trees) == {0, 1, 2, 3}
    worker, orphan, unnamed = trees[1], trees[2], trees[3]
    assert (worker.kind, worker.name, worker.parent_lane, worker.parent_call) == (
        LaneKind.TASK,
        "worker",
        0,
        1,
    )
    assert (worker.root.start, worker.root.end) == (20, 50)  # from its Lane record's start
    assert [fn(n) for n in worker.root.children] == ["app:h"]
    assert (orphan.parent_lane, orphan.parent_call) == (0, None)  # unknown call: request root
    # no spawning call named: under the main lane's call open when it started (f, 10-100)
    assert (unnamed.kind, unnamed.name, unnamed.parent_lane, unnamed.parent_call) == (
        LaneKind.THREAD,
        "lane 3",
        0,
        1,
    )
    # the main lane's f is not disturbed by the other lanes' events
    f = calls(req)[1]
    assert (f.start, f.end, f.self_ns, f.children) == (10, 100, 90, [])

    stored = flat(req).tree
    by_name = {lane.name: lane for lane in stored.lanes}
    f_index = req.tree.call.index(1)
    assert stored.functions[stored.function[f_index]] == "app:f"
    assert by_name["worker"].parent_node == f_index
    assert by_name["worker"].parent_lane == 0
    assert by_name["orphan"].parent_node == -1
    assert by_name["lane 3"].parent_node == f_index


def test_a_spawned_lanes_stacks_extend_its_spawning_nodes_stack() -> None:
    lanes = {1: LaneInfo(LaneKind.TASK, "worker", 0, 1, None)}
    req, _ = build(
        request(
            run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 100)),
            run(1, (ENTER, H, 11, 30), (EXIT, H, 11, 50)),
            lanes=lanes,
        )
    )
    signatures = {sig: [v[SELF], v[CALLS]] for sig, v in flat(req).stacks.items()}
    outside = "(outside profiled calls)"  # the main lane's time around f, of no call
    assert signatures == {"app:f": [90, 1], "app:f;app:h": [20, 1], outside: [910, 0]}


def test_a_generator_resumed_in_another_lane_is_accounted_where_it_ran() -> None:
    lanes = {1: LaneInfo(LaneKind.THREAD, "pool", 0, 1, None)}
    req, problems = build(
        request(
            run(0, (ENTER, F, 1, 0), (ENTER, GEN, 2, 10), (SUSPEND, GEN, 2, 20), (EXIT, F, 1, 100)),
            run(1, (ENTER, G, 3, 30), (RESUME, GEN, 2, 40), (EXIT, GEN, 2, 45), (EXIT, G, 3, 60)),
            lanes=lanes,
        )
    )
    assert problems == Counter()
    f, gen, g = calls(req)[1], calls(req)[2], calls(req)[3]
    assert gen.parent is f
    assert (gen.active_ns, gen.await_ns, gen.end) == (15, 20, 45)
    assert g.self_ns == 30 - 5
    assert f.self_ns == 100 - 10


# --- aggregates ------------------------------------------------------------------------------


def test_recursion_counts_only_outermost_calls_in_a_functions_total() -> None:
    # f -> f -> g -> f, then a second, separate call of f
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 0),
                (ENTER, F, 2, 10),
                (ENTER, G, 3, 20),
                (ENTER, F, 4, 30),
                (EXIT, F, 4, 40),
                (EXIT, G, 3, 50),
                (EXIT, F, 2, 60),
                (EXIT, F, 1, 100),
                (ENTER, F, 5, 200),
                (EXIT, F, 5, 230),
            )
        )
    )
    assert problems == Counter()
    totals = flat(req).functions
    f, g = totals[F], totals[G]
    assert f[CALLS] == 4
    assert f[TOTAL] == 100 + 30  # not 100 + 50 + 10 + 30
    assert f[SELF] == (100 - 50) + (50 - 30) + 10 + 30
    assert f[MAX] == 100
    assert (g[CALLS], g[TOTAL], g[SELF]) == (1, 30, 20)


def test_function_totals_carry_generator_active_await_and_longest_slice() -> None:
    req, _ = build(
        request(
            run(
                0,
                (ENTER, GEN, 1, 0),
                (SUSPEND, GEN, 1, 10),
                (READY_EV, GEN, 1, 25),
                (RESUME, GEN, 1, 30),
                (EXIT, GEN, 1, 70),
            )
        )
    )
    totals = flat(req).functions[GEN]
    assert (totals[ACTIVE], totals[AWAIT], totals[READY], totals[MAX_SLICE]) == (50, 15, 5, 40)
    assert (totals[TOTAL], totals[SELF]) == (70, 50)


# --- repairs ---------------------------------------------------------------------------------


def test_exit_without_enter_is_ignored_and_counted() -> None:
    req, problems = build(
        request(
            run(
                0,
                (EXIT, G, 99, 5),  # never entered
                (ENTER, F, 1, 10),
                (EXIT, F, 1, 20),
                (EXIT, F, 1, 30),  # the same call again
            )
        )
    )
    assert problems == Counter({P.EXIT_WITHOUT_ENTER: 2})
    (f,) = lane_views(req)[0].root.children
    assert (f.start, f.end, f.outcome) == (10, 20, Outcome.RETURN)
    assert not req.truncated


def test_exit_naming_another_function_than_the_open_call_is_counted() -> None:
    req, problems = build(
        request(run(0, (ENTER, F, 1, 10), (ENTER, G, 2, 20), (EXIT, H, 2, 30), (EXIT, F, 1, 40)))
    )
    assert problems == Counter({P.EXIT_MISMATCH: 1})
    f, g = calls(req)[1], calls(req)[2]
    assert fn(g) == "app:g" and (g.end, g.outcome) == (30, Outcome.RETURN)
    assert (f.end, f.self_ns) == (40, 20)


def test_an_outer_exit_closes_the_inner_call_whose_exit_is_missing() -> None:
    req, problems = build(
        request(
            run(0, (ENTER, F, 1, 10), (ENTER, G, 2, 20), (EXIT, F, 1, 50), (ENTER, H, 3, 60)),
            run(0, (EXIT, H, 3, 70)),
        )
    )
    assert problems == Counter({P.MISSING_EXIT: 1})
    f, g, h = calls(req)[1], calls(req)[2], calls(req)[3]
    assert (g.end, g.outcome) == (50, Outcome.TRUNCATED)
    assert (f.end, f.outcome) == (50, Outcome.RETURN)
    assert h.parent is lane_views(req)[0].root  # the stack is sound again after the repair
    assert req.truncated  # a node's end is a guess: the request says so


def test_missing_exits_at_request_end_are_closed_there_and_marked_truncated() -> None:
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (ENTER, GEN, 2, 20),
                (SUSPEND, GEN, 2, 30),
                (ENTER, G, 3, 40),
            ),
            end=100,
        )
    )
    assert problems == Counter({P.MISSING_EXIT: 3})
    assert req.truncated
    f, gen, g = calls(req)[1], calls(req)[2], calls(req)[3]
    assert all(n.end == 100 and n.outcome == Outcome.TRUNCATED for n in (f, gen, g))
    assert (g.self_ns, f.self_ns) == (60, 10 + 10)
    assert (gen.active_ns, gen.await_ns) == (10, 70)  # suspended until the end


def test_calls_open_at_the_end_in_a_lane_still_running_then_are_cut_without_repair() -> None:
    """A thread, task or pool work that outlives its request (the host lists its lane as
    running at the end): its open calls, plain or suspended, end with the request as
    truncated nodes, but the request is complete. The same calls in a lane that finished
    are missing exits."""

    def pending(running: frozenset[int]) -> PendingRequest:
        lanes = {
            1: LaneInfo(LaneKind.THREAD, "worker", parent_lane=0, parent_call=1, start_ns=15),
            2: LaneInfo(LaneKind.TASK, "background", parent_lane=0, parent_call=1, start_ns=16),
        }
        made = request(
            run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 90)),
            run(1, (ENTER, G, 11, 20), (ENTER, H, 12, 30)),
            run(2, (ENTER, GEN, 21, 40), (SUSPEND, GEN, 21, 50)),
            lanes=lanes,
            end=100,
        )
        made.running_lanes = running
        return made

    req, problems = build(pending(frozenset({1, 2})))
    assert problems == Counter() and not req.truncated
    g, h, gen = calls(req)[11], calls(req)[12], calls(req)[21]
    assert all(n.end == 100 and n.outcome == Outcome.TRUNCATED for n in (g, h, gen))
    req, problems = build(pending(frozenset({2})))
    assert problems == Counter({P.MISSING_EXIT: 2}) and req.truncated


def test_events_after_the_requests_end_are_dropped_and_counted() -> None:
    req, problems = build(
        request(
            run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 50), (ENTER, G, 2, 120), (EXIT, G, 2, 130)),
            end=100,
        )
    )
    assert problems == Counter({P.EVENTS_AFTER_END: 2})
    (f,) = lane_views(req)[0].root.children
    assert (f.start, f.end) == (10, 50)
    assert req.end == 100 and not req.truncated


def test_a_call_still_open_when_events_run_past_the_end_is_closed_at_the_end() -> None:
    req, problems = build(request(run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 150)), end=100))
    assert problems == Counter({P.EVENTS_AFTER_END: 1, P.MISSING_EXIT: 1})
    f = calls(req)[1]
    assert (f.end, f.outcome, f.self_ns) == (100, Outcome.TRUNCATED, 90)
    assert req.truncated


def test_a_request_without_its_start_record_starts_at_its_first_event() -> None:
    req, problems = build(
        request(run(0, (ENTER, F, 1, 500), (EXIT, F, 1, 600)), start=None, end=700)
    )
    assert problems == Counter({P.MISSING_START: 1})
    assert (req.start, req.end) == (500, 700)
    assert lane_views(req)[0].root.start == 500


def test_a_request_without_its_end_record_is_truncated_at_its_last_event() -> None:
    req, problems = build(request(run(0, (ENTER, F, 1, 10), (ENTER, G, 2, 20)), end=None))
    assert req.truncated
    assert req.end == 20
    assert problems == Counter({P.MISSING_EXIT: 2})


def test_suspend_and_resume_out_of_place_are_ignored_and_counted() -> None:
    req, problems = build(
        request(
            run(
                0,
                (ENTER, GEN, 1, 0),
                (RESUME, GEN, 1, 5),  # not suspended
                (SUSPEND, GEN, 1, 10),
                (SUSPEND, GEN, 1, 15),  # already suspended
                (RESUME, GEN, 1, 20),
                (EXIT, GEN, 1, 30),
                (SUSPEND, GEN, 1, 40),  # already closed
                (RESUME, GEN, 7, 45),  # never entered
            )
        )
    )
    assert problems == Counter({P.RESUME_WITHOUT_SUSPEND: 2, P.SUSPEND_WHILE_SUSPENDED: 2})
    gen = calls(req)[1]
    assert (gen.active_ns, gen.await_ns, gen.suspensions, gen.end) == (20, 10, 1, 30)


def test_runs_are_assembled_in_batch_order_whatever_order_they_arrived_in() -> None:
    # batch 2 arrived before batch 1
    later = run(0, (EXIT, G, 2, 30), (EXIT, F, 1, 40))
    earlier = run(0, (ENTER, F, 1, 10), (ENTER, G, 2, 20))
    req, problems = build(request((2, later), (1, earlier)))
    assert problems == Counter()
    f, g = calls(req)[1], calls(req)[2]
    assert g.parent is f
    assert (f.start, f.end, f.self_ns, g.self_ns) == (10, 40, 20, 10)


def test_one_bad_request_does_not_change_how_the_next_is_assembled() -> None:
    problems: Counter = Counter()
    bad = request(run(0, (EXIT, F, 9, 1), (ENTER, F, 1, 10)), end=50)
    good = request(run(0, (ENTER, F, 1, 10), (EXIT, F, 1, 20)), end=50)
    assert assemble("s", bad, problems).truncated
    assert not assemble("s", good, problems).truncated
    assert problems == Counter({P.EXIT_WITHOUT_ENTER: 1, P.MISSING_EXIT: 1})
