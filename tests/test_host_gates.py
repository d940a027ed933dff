"""`gates`: the constant slot each rewritten code object's gate reads, switched for all of
them by the requests in flight, in C (`_gates.c`) and in its Python twin alike."""

from __future__ import annotations

import gc
import importlib.util
import os
import pickle
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_host import gates, hooks, native, rewriter


def sample(n):  # type: ignore[no-untyped-def]
    return [i * 2 for i in range(n)] if n else None


def made(implementation_hooks: rewriter.Hooks = hooks.HOOKS) -> types.FunctionType:
    code = rewriter.rewrite(sample.__code__, 1, implementation_hooks)
    return types.FunctionType(code, sample.__globals__, sample.__name__)


def slot(function: types.FunctionType) -> object:
    position = gates.index(function.__code__)
    assert position is not None
    return function.__code__.co_consts[position]


C_SLOTS = native.extension("_gates")


@pytest.fixture(params=["c", "python"])
def slots(request: pytest.FixtureRequest) -> Iterator[object]:
    """Each implementation, closed again afterwards. The C one is the process's own."""
    if request.param == "c":
        if C_SLOTS is None:
            pytest.skip("the C extension is not built")
        implementation: object = C_SLOTS
    else:
        implementation = gates._PythonSlots()
        implementation.configure(gates.OPEN)
    yield implementation
    implementation.switch(False)  # type: ignore[attr-defined]


def untracked() -> types.CodeType:
    """A rewritten code whose slot holds OPEN again, as before `track`: the same bytes
    with a fresh constants tuple, which nothing tracks."""
    code = made().__code__
    consts = list(code.co_consts)
    consts[gates.index(code)] = gates.OPEN  # type: ignore[index]
    return code.replace(co_consts=tuple(consts))


def test_each_implementation_switches_its_slots_and_leaves_the_rest(slots: object) -> None:
    code = untracked()
    position = gates.index(code)
    assert position is not None
    before = list(code.co_consts)
    slots.track(code, position)  # type: ignore[attr-defined]
    assert code.co_consts[position] is None  # closed while nothing is in flight
    slots.switch(True)  # type: ignore[attr-defined]
    assert code.co_consts[position] is gates.OPEN
    function = types.FunctionType(code, globals(), "sample")
    assert function(3) == sample(3) and function(0) is None  # open, nothing sampled
    slots.switch(False)  # type: ignore[attr-defined]
    assert code.co_consts[position] is None
    assert function(3) == sample(3)
    others = [c for i, c in enumerate(code.co_consts) if i != position]
    assert others == [c for i, c in enumerate(before) if i != position]


def test_each_implementation_refuses_a_slot_that_is_not_the_gates(slots: object) -> None:
    code = untracked()
    with pytest.raises(ValueError):
        slots.track(code, 0)  # type: ignore[attr-defined]  # the docstring slot
    with pytest.raises((TypeError, ValueError)):
        slots.track(code, len(code.co_consts))  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        slots.track(code.co_consts, 0)  # type: ignore[attr-defined]


def test_each_implementation_lets_go_of_a_dead_codes_slot(slots: object) -> None:
    before = slots.tracked()  # type: ignore[attr-defined]
    codes = [untracked() for _ in range(5)]
    for code in codes:
        slots.track(code, gates.index(code))  # type: ignore[attr-defined]
    assert slots.tracked() >= before + 5  # type: ignore[attr-defined]
    del codes, code
    gc.collect()
    slots.switch(False)  # type: ignore[attr-defined]
    assert slots.tracked() <= before  # type: ignore[attr-defined]


def test_requests_in_flight_open_and_close_the_gates() -> None:
    function = made()
    assert slot(function) is None
    first, second = object(), object()
    hooks.ACTIVE.append(first)
    try:
        assert slot(function) is gates.OPEN
        consts = function.__code__.co_consts
        assert [i for i, c in enumerate(consts) if c is gates.OPEN] == [
            gates.index(function.__code__)
        ]
        hooks.ACTIVE.append(second)
        hooks.ACTIVE.remove(first)
        assert slot(function) is gates.OPEN  # one still in flight
    finally:
        hooks.ACTIVE.clear()
    assert slot(function) is None
    later = made()  # made while closed: closed
    assert slot(later) is None


def test_a_switch_changes_neither_the_codes_hash_nor_equality() -> None:
    function = made()
    code = function.__code__
    closed_hash = hash(code)
    hooks.ACTIVE.append(object())
    try:
        assert hash(code) == closed_hash
        assert code == code and {code: 1}[code] == 1
    finally:
        hooks.ACTIVE.clear()


def test_a_gate_given_another_constant_is_not_switched() -> None:
    for constant in (None, [True]):
        code = rewriter.rewrite(sample.__code__, 1, _with_gate(constant))
        position = gates.index(code)
        assert position is not None and code.co_consts[position] is constant
        hooks.ACTIVE.append(object())
        try:
            assert code.co_consts[position] is constant
        finally:
            hooks.ACTIVE.clear()


def _with_gate(constant: object) -> rewriter.Hooks:
    import dataclasses

    return dataclasses.replace(hooks.HOOKS, gate=constant)


def test_the_open_slot_pickles_as_a_closed_one() -> None:
    assert pickle.loads(pickle.dumps(gates.OPEN)) is None
    assert hash(gates.OPEN) == hash(None)


def test_code_without_a_gate_has_no_slot() -> None:
    assert gates.index(sample.__code__) is None
    assert not gates.gated(sample.__code__)
    assert gates.gated(made().__code__)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is 3.12's")
def test_switching_under_sys_monitoring_keeps_every_line_event() -> None:
    """A tool on sys.monitoring instruments the code's bytecode, not its constants."""
    monitoring = sys.monitoring
    tool = monitoring.PROFILER_ID
    function = made()
    lines: list[int] = []
    monitoring.use_tool_id(tool, "test")
    try:
        monitoring.register_callback(tool, monitoring.events.LINE, lambda c, n: lines.append(n))
        monitoring.set_local_events(tool, function.__code__, monitoring.events.LINE)
        closed = function(2)
        closed_lines = list(lines)
        hooks.ACTIVE.append(object())
        try:
            lines.clear()
            assert function(2) == closed
        finally:
            hooks.ACTIVE.clear()
        assert lines == closed_lines
    finally:
        monitoring.set_local_events(tool, function.__code__, 0)
        monitoring.free_tool_id(tool)


def test_each_implementation_switches_a_copy_that_shares_the_constants(slots: object) -> None:
    """`types.coroutine` replaces a generator function's code by `code.replace(co_flags=...)`,
    which shares its constants: the copy's gate still switches once the first is gone."""
    code = untracked()
    position = gates.index(code)
    slots.track(code, position)  # type: ignore[attr-defined]
    copy = code.replace(co_flags=code.co_flags | 0x100)
    del code
    gc.collect()
    slots.switch(True)  # type: ignore[attr-defined]
    assert copy.co_consts[position] is gates.OPEN


FORGET_SCRIPT = """
import gc, sys, types, weakref
from profiler_host import gates, hooks, rewriter

def outer():
    def inner():
        return 1
    return inner

code = rewriter.rewrite(outer.__code__, 1, hooks.HOOKS)
nested = rewriter.rewrite(outer.__code__.co_consts[1], 2, hooks.HOOKS)
position = gates.index(code)
consts = tuple(
    nested if c is outer.__code__.co_consts[1] else gates.OPEN if i == position else c
    for i, c in enumerate(code.co_consts)
)
code = code.replace(co_consts=consts)  # shares nothing with the tracked one
gates.track(code)
assert code.co_consts[position] is None and gates.tracked() == 3
hooks.ACTIVE.append(object())
hooks.ACTIVE.clear()
gates.forget()
assert code.co_consts[position] is gates.OPEN and gates.tracked() == 0
gates.track(code)  # open, so it can be tracked again
assert code.co_consts[position] is None and gates.tracked() == 1
gates.forget()
gone = weakref.ref(nested)
del nested, code, consts
gc.collect()
assert gone() is None, "the forgotten constants still hold a nested code"
print(type(gates._slots).__name__)
"""


@pytest.mark.parametrize("pure", ["0", "1"])
def test_each_implementation_lets_go_of_everything_it_forgets(pure: str) -> None:
    """As the profiler stops: nothing held, so the code objects nested in a rewritten
    one's constants go with it (the third-party suites count what outlives a release), and
    every slot open, so code run again after a later start (propagation's gated methods)
    is correct. In a process of its own: the C slots are the process's."""
    done = subprocess.run(
        [sys.executable, "-c", FORGET_SCRIPT],
        capture_output=True,
        text=True,
        env={**os.environ, "PROFILER_PURE_PYTHON": pure},
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    built = importlib.util.find_spec("profiler_host._gates") is not None
    expected = "module" if pure == "0" and built else "_PythonSlots"
    assert done.stdout.strip() == expected
