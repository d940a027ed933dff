"""Every nanosecond of a lane on one stack, in one state (running, awaiting, ready): the
events a host sends for await chains, a @contextmanager generator, chains still suspended at
the request's end, nested gathers and executor lanes, and the sums that must hold."""

from __future__ import annotations

from collections import Counter

from profiler_core.model import LaneKind
from profiler_server.assembly.calltree import AssembledRequest
from profiler_server.assembly.pending import LaneInfo
from profiler_server.assembly.totals import AWAITING, CALLS, READYING, SELF
from tests.test_assembly import (
    ENTER,
    EXIT,
    GEN,
    READY_EV,
    RESUME,
    SUSPEND,
    F,
    G,
    H,
    build,
    flat,
    request,
    run,
)

OUTSIDE = "(outside profiled calls)"


def lane_sums(req: AssembledRequest) -> dict[int, tuple[int, int]]:
    """Per lane: (running + awaiting + ready of its nodes, its duration)."""
    tree = req.tree
    root_of: list[int] = []
    for node, parent in enumerate(tree.parent):
        root_of.append(node if parent < 0 else root_of[parent])
    charged: dict[int, int] = {}
    for node in range(len(tree)):
        time = tree.self_ns[node] + sum(tree.charged.get(node, (0, 0)))
        charged[root_of[node]] = charged.get(root_of[node], 0) + time
    return {
        lane.lane_id: (charged[lane.root], tree.end[lane.root] - tree.start[lane.root])
        for lane in tree.lanes
    }


def states(req: AssembledRequest) -> dict[str, tuple[int, int, int]]:
    """Per stack: (running, awaiting, ready) ns."""
    return {
        sig: (v[SELF], v[AWAITING], v[READYING])
        for sig, v in flat(req).stacks.items()
        if v[SELF] or v[AWAITING] or v[READYING]
    }


def assert_adds_up(req: AssembledRequest) -> None:
    for lane, (charged, duration) in lane_sums(req).items():
        assert charged == duration, f"lane {lane}"
    total = sum(sum(s) for s in states(req).values())
    assert total == sum(duration for _, duration in lane_sums(req).values())


def test_an_await_chains_wait_goes_to_its_innermost_call_awaiting_then_ready() -> None:
    # f awaits g, g awaits a future: the host records both suspensions (innermost first)
    # when the task is woken at 70, and the loop resumes the chain at 90
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (ENTER, G, 2, 20),
                (SUSPEND, G, 2, 30),
                (SUSPEND, F, 1, 30),
                (READY_EV, F, 1, 70),
                (READY_EV, G, 2, 70),
                (RESUME, F, 1, 90),
                (RESUME, G, 2, 90),
                (EXIT, G, 2, 95),
                (EXIT, F, 1, 100),
            )
        )
    )
    assert problems == Counter()
    assert states(req) == {
        "app:f": (10 + 5, 0, 0),
        "app:f;app:g": (10 + 5, 40, 20),
        OUTSIDE: (10 + 900, 0, 0),
    }
    assert lane_sums(req) == {0: (1000, 1000)}  # the request's duration
    assert_adds_up(req)


def test_a_suspended_contextmanager_generator_is_not_awaiting() -> None:
    # f enters `with cm():` (the generator suspends at its yield, f runs on), then awaits g
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (ENTER, GEN, 2, 20),
                (SUSPEND, GEN, 2, 25),
                (ENTER, G, 3, 30),
                (SUSPEND, G, 3, 40),
                (SUSPEND, F, 1, 40),
                (READY_EV, F, 1, 60),
                (READY_EV, G, 3, 60),
                (RESUME, F, 1, 60),
                (RESUME, G, 3, 60),
                (EXIT, G, 3, 65),
                (RESUME, GEN, 2, 70),
                (EXIT, GEN, 2, 75),
                (EXIT, F, 1, 80),
            )
        )
    )
    assert problems == Counter()
    found = states(req)
    assert found["app:f;app:gen"] == (5 + 5, 0, 0)  # suspended 25-70, never awaited
    assert found["app:f;app:g"] == (10 + 5, 20, 0)
    assert found["app:f"] == (10 + 5 + 5 + 5, 0, 0)
    assert_adds_up(req)


def test_a_chain_suspended_at_the_requests_end_waits_until_then() -> None:
    # f never resumes; a task lane's h awaits at the end too (its work still pending)
    lanes = {1: LaneInfo(LaneKind.TASK, "task", parent_lane=0, parent_call=1, start_ns=20)}
    req, _ = build(
        request(
            run(0, (ENTER, F, 1, 10), (SUSPEND, F, 1, 50)),
            run(1, (ENTER, H, 11, 20), (SUSPEND, H, 11, 30)),
            lanes=lanes,
        )
    )
    assert states(req) == {
        "app:f": (40, 950, 0),
        "app:f;app:h": (10, 970, 0),
        OUTSIDE: (10, 0, 0),
    }
    assert lane_sums(req) == {0: (1000, 1000), 1: (980, 980)}
    assert_adds_up(req)


def test_nested_gathers_charge_each_lane_to_its_own_waiting_chain() -> None:
    # f gathers tasks 1 and 2; task 2's g gathers task 3; each lane waits on its own chain
    lanes = {
        1: LaneInfo(LaneKind.TASK, "t1", parent_lane=0, parent_call=1, start_ns=20),
        2: LaneInfo(LaneKind.TASK, "t2", parent_lane=0, parent_call=1, start_ns=20),
        3: LaneInfo(LaneKind.TASK, "t3", parent_lane=2, parent_call=21, start_ns=40),
    }
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (SUSPEND, F, 1, 20),
                (READY_EV, F, 1, 200),
                (RESUME, F, 1, 210),
                (EXIT, F, 1, 220),
            ),
            run(
                1,
                (ENTER, H, 11, 25),
                (SUSPEND, H, 11, 30),
                (READY_EV, H, 11, 100),
                (RESUME, H, 11, 110),
                (EXIT, H, 11, 120),
            ),
            run(
                2,
                (ENTER, G, 21, 30),
                (SUSPEND, G, 21, 40),
                (READY_EV, G, 21, 150),
                (RESUME, G, 21, 160),
                (EXIT, G, 21, 170),
            ),
            run(
                3,
                (ENTER, H, 31, 50),
                (SUSPEND, H, 31, 60),
                (RESUME, H, 31, 140),
                (EXIT, H, 31, 145),
            ),
            lanes=lanes,
        )
    )
    assert problems == Counter()
    assert lane_sums(req) == {0: (1000, 1000), 1: (100, 100), 2: (150, 150), 3: (105, 105)}
    found = states(req)
    assert found["app:f"] == (10 + 10, 180, 10)
    assert found["app:f;app:g"] == (10 + 10, 110, 10)
    assert found["app:f;app:g;app:h"] == (10 + 5, 80, 0)  # never woken through READY
    assert found["app:f;app:h"] == (5 + 10, 70, 10)
    assert_adds_up(req)


def test_an_executor_lane_runs_while_the_main_chain_awaits_it() -> None:
    lanes = {1: LaneInfo(LaneKind.EXECUTOR, "pool", parent_lane=0, parent_call=1, start_ns=20)}
    req, problems = build(
        request(
            run(
                0,
                (ENTER, F, 1, 10),
                (SUSPEND, F, 1, 20),
                (READY_EV, F, 1, 80),
                (RESUME, F, 1, 85),
                (EXIT, F, 1, 90),
            ),
            run(1, (ENTER, H, 11, 25), (EXIT, H, 11, 75)),
            lanes=lanes,
        )
    )
    assert problems == Counter()
    found = states(req)
    assert found["app:f"] == (10 + 5, 60, 5)
    assert found["app:f;app:h"] == (50, 0, 0)
    assert found[f"app:f;{OUTSIDE}"] == (5, 0, 0)  # the pool's lane before h started
    assert lane_sums(req) == {0: (1000, 1000), 1: (55, 55)}
    assert_adds_up(req)
    assert flat(req).stacks[OUTSIDE][CALLS] == 0  # time of no call
