"""The instruction benchmark's arithmetic: the cost of a request told apart from what the
worker's timers cost per second of wall time, from lives that served at two densities."""

from __future__ import annotations

import pytest

from benchmarks.host_instructions import _separated


def _life(served: int, wall: float, per_request: float, timers: float, base: float) -> dict:
    total = base + served * per_request + wall * timers
    return {
        "served_after_warmup": served,
        "wall_after_warmup": wall,
        "instructions": total,
        "collector_instructions": 0.0,
    }


@pytest.mark.parametrize("sparse_served", [0, 10])
def test_the_cost_per_request_and_the_timers_rate_come_apart(sparse_served: int) -> None:
    per_request, timers, base = 6_000_000.0, 450_000.0, 1e9
    short = _life(0, 12.0, per_request, timers, base)
    long = _life(200, 35.0, per_request, timers, base)
    sparse = _life(sparse_served, 42.0, per_request, timers, base)
    assert _separated(short, long, sparse, "instructions") == pytest.approx((per_request, timers))


def test_timers_busier_than_idle_are_not_charged_to_the_requests() -> None:
    """A stream that is open only while requests come (the host's count reports) costs the
    long life more per second than an idle life shows: a sparse life with requests
    sees the same rate, where an idle one would leave the difference on the requests."""
    per_request, base = 6_000_000.0, 1e9
    short = _life(0, 0.0, per_request, 0.0, base)
    long = _life(200, 23.0, per_request, 450_000.0, base)
    busy = _life(10, 30.0, per_request, 450_000.0, base)
    idle = _life(0, 30.0, per_request, 200_000.0, base)
    assert _separated(short, long, busy, "instructions")[0] == pytest.approx(per_request)
    assert _separated(short, long, idle, "instructions")[0] > per_request * 1.004
