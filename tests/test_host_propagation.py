"""`InLane`, which runs work handed to another thread in a lane of its own, in C
(`profiler_host._hotpath`) and in Python (its twin, `PROFILER_PURE_PYTHON=1`): the tests
run under both.
"""

from __future__ import annotations

import contextvars
import gc
import sys
import traceback

import pytest

from profiler_host import propagation, recording
from profiler_host.recording import CURRENT

IN_LANES: dict[str, type] = {"python": propagation._PyInLane}
if recording.IMPLEMENTATION == "c":
    from profiler_host import _hotpath

    IN_LANES["c"] = _hotpath.InLane
EXTRA_FRAMES = {"python": ["__call__"], "c": []}  # the twin's call is a Python frame


@pytest.fixture(params=list(IN_LANES))
def in_lane(request: pytest.FixtureRequest) -> tuple[str, type]:
    return request.param, IN_LANES[request.param]


def test_in_lane_sets_the_lane_for_the_work_alone(in_lane: tuple[str, type]) -> None:
    """The work sees the lane in the context it runs in; after it, that context holds
    nothing of ours and the InLane holds neither lane nor work; it runs once."""
    lane = recording.Request(1, "/r", "GET", 10).main
    seen = []

    def work(*args: object, **kwargs: object) -> str:
        seen.append((CURRENT.get(), args, kwargs))
        return "done"

    run = in_lane[1](lane, work)
    assert gc.is_tracked(run)
    context = contextvars.Context()
    assert context.run(run, 1, two=2) == "done"
    assert seen == [(lane, (1,), {"two": 2})]
    assert CURRENT not in context
    assert not {id(lane), id(work)} & {id(held) for held in gc.get_referents(run)}
    with pytest.raises(RuntimeError, match="ran already"):
        run()
    seen.clear()
    references = sys.getrefcount(lane), sys.getrefcount(work)
    contextvars.Context().run(in_lane[1](lane, work))
    seen.clear()
    assert (sys.getrefcount(lane), sys.getrefcount(work)) == references  # none leaked


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_in_lane_passes_the_work_s_exception_on(in_lane: tuple[str, type], error: type) -> None:
    """The work's exception reaches the caller with the work's own frames (C adds none),
    and the lane is taken out of the context all the same."""

    def fails() -> None:
        raise error("expected")

    def frames(run: object) -> list[str]:
        context = contextvars.Context()
        context.run(CURRENT.set, None)
        with pytest.raises(error, match="expected") as caught:
            context.run(run)
        assert context[CURRENT] is None
        return [frame.name for frame in traceback.extract_tb(caught.tb)]

    name, in_lane_type = in_lane
    lane = recording.Request(1, "/r", "GET", 10).main
    plain = frames(fails)
    assert frames(in_lane_type(lane, fails)) == [plain[0], *EXTRA_FRAMES[name], *plain[1:]]
