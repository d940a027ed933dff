"""One definition of events and tokens (`profiler_host.events`) for the Python hooks and the
C hot path: the generated header is current, the build carries its constants, and tokens
made by either implementation put each field where `events` says."""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys

import pytest

from profiler_core.model import EventKind
from profiler_host import events, hooks, native, recording
from profiler_host.events import (
    KIND_BITS,
    PLAIN_TOKEN_SIZE,
    RESUMABLE_TOKEN_SIZE,
    TOKEN_CALL,
    TOKEN_FK,
    TOKEN_LANE,
    TOKEN_STAMP,
    TOKEN_SUSPENDED,
)
from profiler_host.rewriter import Hooks

IMPLEMENTATIONS = {"python": hooks.PYTHON_HOOKS}
if recording.IMPLEMENTATION == "c":
    IMPLEMENTATIONS["c"] = hooks.HOOKS


def test_header_is_current() -> None:
    assert events.HEADER.read_text() == events.c_header(), (
        "profiler_host/_events.h is stale: run `./dev protos`"
    )


def test_every_event_kind_fits_in_its_bits() -> None:
    assert min(EventKind) >= 0 and max(EventKind) <= events.KIND_MASK


def test_no_token_index_means_two_things() -> None:
    """The fields both kinds of token have come first; a resumable token's own ones lie past
    a plain token's end."""
    shared = [TOKEN_LANE, TOKEN_FK, TOKEN_CALL]
    resumable = [*shared, TOKEN_SUSPENDED, TOKEN_STAMP]
    assert sorted(shared) == list(range(PLAIN_TOKEN_SIZE))
    assert sorted(resumable) == list(range(RESUMABLE_TOKEN_SIZE))


@pytest.mark.skipif(recording.IMPLEMENTATION != "c", reason="the C hot path is not in use")
def test_c_build_has_these_constants() -> None:
    from profiler_host import _hotpath

    assert {name: getattr(_hotpath, name) for name in events.CONSTANTS} == events.CONSTANTS


@pytest.mark.skipif(recording.IMPLEMENTATION != "c", reason="the C hot path is not in use")
def test_stubs_match_the_c_modules() -> None:
    """`_hotpath.pyi`, `_sampling.pyi`, `_counts.pyi`, `_codeswap.pyi` and `_gates.pyi`,
    which the type checker reads, say what the modules built for this interpreter hold
    (mypy's stubtest)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "profiler_host._hotpath",
            "profiler_host._sampling",
            "profiler_host._counts",
            "profiler_host._codeswap",
            "profiler_host._gates",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(
    os.environ.get("PROFILER_PURE_PYTHON", "") not in ("", "0"), reason="no C build wanted"
)
def test_c_modules_are_used_on_this_interpreter() -> None:
    """The extensions were built (they are optional: a failed compile does not fail the
    install), and the hot path passes recording's check (a stale or mismatched build would
    fall back to Python silently)."""
    for name in ("_sampling", "_counts", "_codeswap", "_gates"):
        assert native.extension(name) is not None, f"profiler_host.{name} is not built"
    assert recording.IMPLEMENTATION == "c"


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_tokens_hold_their_fields_where_events_says(name: str) -> None:
    implementation: Hooks = IMPLEMENTATIONS[name]
    request = recording.Request(request_id=1, route="/", method="GET", event_cap=1000)
    lane = request.main
    assert implementation.enter(5) is None  # this context has no lane: not sampled
    assert implementation.enter_resumable(6) is None
    contextvars.copy_context().run(_record_in, implementation, lane, name)
    assert [event[:3] for event in lane.events] == [
        (EventKind.ENTER, 5, 1),
        (EventKind.ENTER, 6, 2),
        (EventKind.SUSPEND, 6, 2),
        (EventKind.RESUME, 6, 2),
        (EventKind.EXIT, 6, 2),
        (EventKind.EXIT, 5, 1),
    ]
    assert lane not in hooks._RUNNING


def _record_in(implementation: Hooks, lane: recording.Lane, name: str) -> None:
    """enter reads the lane from the context, as the open gate calls it."""
    recording.CURRENT.set(lane)
    plain = implementation.enter(5)
    assert type(plain).__name__ == ("tuple" if name == "python" else "CallToken")
    assert len(plain) == PLAIN_TOKEN_SIZE
    assert plain[TOKEN_LANE] is lane
    assert (plain[TOKEN_FK], plain[TOKEN_CALL]) == (5 << KIND_BITS, 1)

    resumable = implementation.enter_resumable(6)
    assert type(resumable) is list and len(resumable) == RESUMABLE_TOKEN_SIZE
    assert resumable[TOKEN_LANE] is lane
    assert (resumable[TOKEN_FK], resumable[TOKEN_CALL]) == (6 << KIND_BITS, 2)
    assert (resumable[TOKEN_SUSPENDED], resumable[TOKEN_STAMP]) == (False, 2)
    implementation.suspend(resumable)
    assert resumable[TOKEN_SUSPENDED] is True
    implementation.resume(resumable)
    assert (resumable[TOKEN_SUSPENDED], resumable[TOKEN_STAMP]) == (False, 3)
    implementation.exit_resumable(resumable)
    implementation.exit(plain)
