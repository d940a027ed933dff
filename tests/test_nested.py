"""The NumPy path for well-nested requests builds exactly the trees the general path builds,
counts the same problems, and leaves every request it cannot take to the general path."""

from __future__ import annotations

from collections import Counter
from dataclasses import astuple
from itertools import pairwise

import numpy as np
import pytest

from profiler_core.model import EventKind, LaneKind
from profiler_server.assembly import problems as P
from profiler_server.assembly.builder import assemble
from profiler_server.assembly.events import Run
from profiler_server.assembly.flatten import OUTSIDE_NAME, StackInterner, stable_id, summarize
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.group import assemble_all
from profiler_server.assembly.nested import assemble_nested
from profiler_server.assembly.pending import LaneInfo, PendingRequest
from profiler_server.loadgen import CallShape, synthetic_run

ENTER, EXIT, RAISE = EventKind.ENTER, EventKind.EXIT, EventKind.EXIT_EXCEPTION
SUSPEND, RESUME = EventKind.SUSPEND, EventKind.RESUME
COLUMNS = ("offsets", "function", "parent", "start", "end", "self_ns", "outcome_node", "outcome")


def run(kinds, functions, calls, times, lane: int = 0) -> Run:
    return Run(
        1,
        lane,
        np.array([int(k) for k in kinds], dtype=np.uint8),
        np.array(functions, dtype=np.int64),
        np.array(calls, dtype=np.uint64),
        np.array(times, dtype=np.int64),
    )


def pending(*runs: Run, request_id: int = 1, start: int | None = 0, end: int | None = None):
    """A finished request; runs are given in seq order, and arrive in reverse."""
    p = PendingRequest(
        request_id, route="/r", method="GET", start_ns=start, status=200, session_id="s"
    )
    p.end_ns = end if end is not None else max(int(r.times.max()) for r in runs) + 10
    for seq, r in reversed(list(enumerate(runs, 1))):
        p.runs.append((seq, r))
        p.events += len(r.kinds)
    return p


def events(*items: tuple[EventKind, int, int, int]) -> Run:
    """(kind, function, call, time) per event."""
    return run(*zip(*items, strict=True)) if items else run([], [], [], [])


def synthetic(request_id: int, shape: CallShape, parts: int = 1) -> PendingRequest:
    kinds, functions, calls, times, end = synthetic_run(shape, 1, 1_000, request_id)
    cuts = np.linspace(0, len(kinds), parts + 1).astype(int).tolist()
    runs = [run(kinds[a:b], functions[a:b], calls[a:b], times[a:b]) for a, b in pairwise(cuts)]
    return pending(*runs, request_id=request_id, start=1_000, end=end)


def general(pendings: list[PendingRequest], problems: Counter) -> Forest:
    return Forest.of_trees([assemble("s", p, problems, p.main_name) for p in pendings])


def assert_same(fast: Forest, slow: Forest) -> None:
    for name in COLUMNS:
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    assert fast.lanes == slow.lanes
    assert [astuple(r)[:9] for r in fast.requests] == [astuple(r)[:9] for r in slow.requests]
    assert fast.calls() == slow.calls()


@pytest.mark.parametrize(
    ("shape", "parts"),
    [
        (CallShape(calls=200, depth=10, functions=40), 1),
        (CallShape(calls=60, depth=3, functions=7), 3),
        (CallShape(calls=400, depth=120, functions=25), 2),
        (CallShape(calls=1, depth=1, functions=1), 1),
    ],
)
def test_synthetic_requests_are_assembled_alike(shape: CallShape, parts: int) -> None:
    pendings = [synthetic(rid, shape, parts) for rid in range(1, 8)]
    fast_problems, slow_problems = Counter(), Counter()
    fast, rest = assemble_nested(pendings, fast_problems)
    assert rest == [] and fast is not None
    assert_same(fast, general(pendings, slow_problems))
    assert fast_problems == slow_problems == Counter()


def test_exception_exits_and_exits_naming_another_function_are_assembled_alike() -> None:
    pendings = [
        pending(
            events(
                (ENTER, 1, 1, 0),
                (ENTER, 2, 2, 10),
                (RAISE, 2, 2, 20),
                (ENTER, 3, 3, 20),
                (EXIT, 9, 3, 35),  # names function 9, closes call 3 (function 3)
                (RAISE, 1, 1, 50),
                (ENTER, 4, 4, 60),
                (EXIT, 4, 4, 60),
            ),
            end=70,
        ),
        pending(events(), request_id=2, end=5),  # no events at all: general path
    ]
    fast_problems, slow_problems = Counter(), Counter()
    fast, rest = assemble_nested(pendings, fast_problems)
    assert rest == [pendings[1]] and fast is not None
    assert_same(fast, general(pendings[:1], slow_problems))
    assert fast_problems == slow_problems == Counter({P.EXIT_MISMATCH: 1})


BAD = {
    "suspension": events((ENTER, 1, 1, 0), (SUSPEND, 1, 1, 5), (RESUME, 1, 1, 7), (EXIT, 1, 1, 9)),
    "missing exit": events((ENTER, 1, 1, 0), (ENTER, 2, 2, 5), (EXIT, 1, 1, 9)),
    "exit without enter": events((ENTER, 1, 1, 0), (EXIT, 1, 1, 5), (EXIT, 2, 2, 9)),
    "exit of another call": events(
        (ENTER, 1, 1, 0), (ENTER, 2, 2, 5), (EXIT, 1, 1, 6), (EXIT, 2, 2, 9)
    ),
    "time going back": events((ENTER, 1, 1, 10), (EXIT, 1, 1, 5)),
    "before the start": events((ENTER, 1, 1, -5), (EXIT, 1, 1, 5)),
    "call ids not growing": events(
        (ENTER, 1, 5, 0), (EXIT, 1, 5, 1), (ENTER, 1, 5, 2), (EXIT, 1, 5, 3)
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_requests_it_cannot_take_are_left_to_the_general_path(name: str) -> None:
    good = synthetic(1, CallShape(calls=30, depth=4, functions=5))
    bad = pending(BAD[name], request_id=2)
    fast, rest = assemble_nested([bad, good], Counter())
    assert rest == [bad]
    assert fast is not None
    assert_same(fast, general([good], Counter()))


def test_requests_without_start_or_end_or_with_other_lanes_take_the_general_path() -> None:
    plain = events((ENTER, 1, 1, 0), (EXIT, 1, 1, 5))
    no_start = pending(plain, start=None)
    after_end = pending(plain, request_id=2, end=3)
    laned = pending(plain, run([ENTER, EXIT], [2, 2], [2, 2], [6, 7], lane=1), request_id=3)
    laned.lanes[1] = LaneInfo(LaneKind.THREAD, "pool", 0, None, None)
    fast, rest = assemble_nested([no_start, after_end, laned], Counter())
    assert fast is None
    assert sorted(p.request_id for p in rest) == [1, 2, 3]


def _summary_by_request(pendings: list[PendingRequest], sessions: list[str]) -> dict:
    """Each request's stored tree and totals, its sessions' requests summarized together;
    a session's function 1..n is named after the session, so stacks of two sessions that
    used the same function ids must not be mixed up."""

    def resolver(sid: str):  # type: ignore[no-untyped-def]
        def resolve(fid: int) -> tuple[int, str]:
            name = f"{sid}:f{fid}"
            return stable_id(name), name

        return resolve

    interners = {sid: StackInterner(resolver(sid)) for sid in sessions}
    forest = assemble_all(pendings, Counter())
    summary = summarize(forest, interners, Counter())
    out = {}
    for r, meta in enumerate(forest.requests):
        out[(meta.session_id, meta.request_id)] = (
            summary.trees[r],
            _totals(summary.stacks, r, summary.shown),
            _totals(summary.functions, r, None),
        )
    assert sorted(out) == sorted((p.session_id, p.request_id) for p in pendings)
    return out


def _totals(totals, r: int, shown) -> dict:  # type: ignore[no-untyped-def]
    rows = totals.owner == r
    keys = totals.key[rows].tolist()
    return {
        shown(k) if shown else k: v
        for k, v in zip(keys, totals.values[:, rows].T.tolist(), strict=True)
    }


def test_requests_of_several_sessions_summarized_together_are_as_each_session_alone() -> None:
    shapes = [CallShape(calls=30, depth=4, functions=5), CallShape(calls=80, depth=9, functions=7)]
    pendings = []
    for s, sid in enumerate(("a", "b", "c")):
        for rid in range(1, 4):
            p = synthetic(rid, shapes[(s + rid) % 2], parts=rid)
            p.session_id = sid
            pendings.append(p)
    repaired = pending(BAD["missing exit"], request_id=9)  # the general path, too
    repaired.session_id = "b"
    pendings.append(repaired)
    together = _summary_by_request(pendings, ["a", "b", "c"])
    alone = {}
    for sid in ("a", "b", "c"):
        alone.update(_summary_by_request([p for p in pendings if p.session_id == sid], [sid]))
    assert together == alone
    for (sid, _), (_, stacks, _) in together.items():
        frames = [frame for name in stacks for frame in name.split(";") if frame != OUTSIDE_NAME]
        assert frames and all(frame.startswith(f"{sid}:") for frame in frames)


def test_sessions_of_one_service_summarized_together_store_each_stack_and_name_once() -> None:
    """A fleet's sessions share their functions and stacks (ids are stable): summarized
    together, each stack's stored row, its shown name and each function's name are those
    of any session alone, and every session's stacks are there."""

    def resolve(fid: int) -> tuple[int, str]:
        name = f"shop:f{fid}"
        return stable_id(name), name

    shapes = [CallShape(calls=30, depth=4, functions=5), CallShape(calls=80, depth=9, functions=7)]
    sessions = ("a", "b", "c")
    pendings = []
    for s, sid in enumerate(sessions):
        for rid in range(1, 3):
            p = synthetic(rid, shapes[(s + rid) % 2], parts=rid)
            p.session_id = sid
            pendings.append(p)

    def summary_of(sids: tuple[str, ...]):  # type: ignore[no-untyped-def]
        interners = {sid: StackInterner(resolve) for sid in sids}
        mine = [p for p in pendings if p.session_id in sids]
        return summarize(assemble_all(mine, Counter()), interners, Counter())

    together = summary_of(sessions)
    nodes: dict = {}
    names: dict = {}
    for sid in sessions:
        alone = summary_of((sid,))
        nodes.update(alone.nodes)
        names.update(alone.function_names)
        assert {key: together.shown(key) for key in alone.nodes} == {
            key: alone.shown(key) for key in alone.nodes
        }
    assert together.nodes == nodes
    assert together.function_names == names
    assert len(nodes) < sum(len(summary_of((sid,)).nodes) for sid in sessions)  # shared
