"""The instruction benchmarks' arithmetic: the cost of a request told apart from what the
worker's timers cost per second of wall time, from phases that served at two densities;
and a phase's file read as callgrind wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import callgrind
from benchmarks.host_instructions import _separated


def _phase(served: int, wall: float, per_request: float, timers: float) -> dict:
    return {
        "served": served,
        "wall_seconds": wall,
        "instructions": served * per_request + wall * timers,
        "collector_instructions": 0.0,
    }


@pytest.mark.parametrize("sparse_served", [0, 10])
def test_the_cost_per_request_and_the_timers_rate_come_apart(sparse_served: int) -> None:
    per_request, timers = 6_000_000.0, 450_000.0
    long = _phase(200, 23.0, per_request, timers)
    sparse = _phase(sparse_served, 30.0, per_request, timers)
    assert _separated(long, sparse, "instructions") == pytest.approx((per_request, timers))


def test_timers_busier_than_idle_are_not_charged_to_the_requests() -> None:
    """A stream that is open only while requests come (the host's count reports) costs the
    long phase more per second than an idle phase shows: a sparse phase with requests
    sees the same rate, where an idle one would leave the difference on the requests."""
    per_request = 6_000_000.0
    long = _phase(200, 23.0, per_request, 450_000.0)
    busy = _phase(10, 30.0, per_request, 450_000.0)
    idle = _phase(0, 30.0, per_request, 200_000.0)
    assert _separated(long, busy, "instructions")[0] == pytest.approx(per_request)
    assert _separated(long, idle, "instructions")[0] > per_request * 1.004


def test_a_call_open_when_its_phase_ended_is_not_its_callers_own_cost(tmp_path: Path) -> None:
    """A phase's file lists the calls still open at its end as arcs of no call: what they
    cost is the callee's, as for a finished call."""
    counts = tmp_path / "cg.1"
    counts.write_text(
        "version: 1\ncreator: test\nevents: Ir\n"
        "fl=(1) a.c\nfn=(1) caller\n5 10\ncfl=(1)\ncfn=(2) callee\ncalls=0 7\n5 1000\n"
        "fn=(2)\n7 1000\n\nsummary: 1010\ntotals: 1010\n"
    )
    own = {}
    for line in callgrind.annotated(counts, "--auto=no"):
        if "a.c:" in line:
            own[line.rsplit(":", 1)[1].strip()] = int(line.split()[0].replace(",", ""))
    assert own == {"callee": 1000, "caller": 10}
    assert callgrind.summary(counts) == 1010
