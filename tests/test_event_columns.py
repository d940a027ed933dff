"""The server's reader of a batch's event columns (`assembly/events.py`) against the host's
writer (`profiler_core.wire.columns`): what was written is read back, run by run, and
columns that disagree are refused before anything is kept."""

from __future__ import annotations

import random

import numpy as np
import pytest

from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2
from profiler_core.wire.columns import EventColumns
from profiler_server.assembly.events import MAX_NS, MalformedEvents, read_runs

Written = tuple[int, int, bytes, list[int], list[int], list[int]]


def written_runs(runs: int, seed: int) -> list[Written]:
    rng = random.Random(seed)
    out = []
    for _ in range(runs):
        n = rng.randint(1, 40)
        kinds = bytes(rng.choice(list(EventKind)) for _ in range(n))
        functions = [rng.randrange(2**32) for _ in range(n)]
        calls = [rng.randrange(2**64) for _ in range(n)]
        times = [rng.randrange(MAX_NS) for _ in range(n)]
        out.append((rng.randrange(2**64), rng.randrange(2**32), kinds, functions, calls, times))
    return out


def events_of(runs: list[Written]) -> ingest_pb2.Events:
    columns = EventColumns()
    for run in runs:
        columns.add_run(*run)
    events = ingest_pb2.Events()
    columns.write(events)
    return events


@pytest.mark.parametrize("runs", [1, 2, 7])
def test_what_the_host_writes_is_read_back_run_by_run(runs: int) -> None:
    written = written_runs(runs, seed=runs)
    read = read_runs(events_of(written))
    assert len(read) == runs
    for run, (request, lane, kinds, functions, calls, times) in zip(read, written, strict=True):
        assert (run.request_id, run.lane_id) == (request, lane)
        assert run.kinds.tobytes() == kinds
        assert run.functions.tolist() == functions
        assert run.calls.tolist() == calls
        assert run.times.tolist() == times


def test_runs_of_a_batch_do_not_share_its_arrays() -> None:
    """A run of a request still open outlives its batch: it must not keep the rest alive."""
    first, second = read_runs(events_of(written_runs(2, seed=3)))
    for a, b in [(first.functions, second.functions), (first.times, second.times)]:
        assert a.base is None and b.base is None
        assert not np.shares_memory(a, b)


def third_time(events: ingest_pb2.Events) -> int:
    """The time of event 2 less its own delta (event 1's time)."""
    return events.base_ns + events.time_delta[0] + events.time_delta[1]


def spoiled(spoil) -> ingest_pb2.Events:
    events = events_of(written_runs(3, seed=5))
    spoil(events)
    return events


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda e: e.run_lane.append(1), id="run-columns"),
        pytest.param(lambda e: e.function.append(1), id="event-columns"),
        pytest.param(lambda e: e.run_length.__setitem__(0, e.run_length[0] + 1), id="lengths"),
        pytest.param(lambda e: e.time_delta.append(1), id="time-column"),
        pytest.param(lambda e: setattr(e, "kind", e.kind[:-1] + b"\x07"), id="unknown-kind"),
        pytest.param(lambda e: setattr(e, "kind", b"\xff" + e.kind[1:]), id="kind-255"),
        pytest.param(lambda e: setattr(e, "base_ns", -(2**62)), id="negative-start"),
        pytest.param(lambda e: setattr(e, "base_ns", MAX_NS), id="start-past-range"),
        pytest.param(lambda e: e.time_delta.__setitem__(1, MAX_NS), id="step-past-range"),
        pytest.param(lambda e: e.time_delta.__setitem__(1, -MAX_NS), id="step-below-range"),
        pytest.param(lambda e: e.time_delta.__setitem__(-1, 2**63 - 1), id="wrapping-step"),
        pytest.param(lambda e: e.time_delta.__setitem__(2, MAX_NS - third_time(e)), id="sum-past"),
    ],
)
def test_columns_that_disagree_are_refused(spoil) -> None:
    with pytest.raises(MalformedEvents):
        read_runs(spoiled(spoil))


def test_an_empty_batch_has_no_runs() -> None:
    assert read_runs(ingest_pb2.Events()) == []
