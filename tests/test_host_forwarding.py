"""`rewriter.forwarding`: a Python method's code behind the gate, as the propagation
patches put it in place of asyncio's and threading's methods' own. With the gate closed the
function is its plain self; with it open every call reaches the target with the arguments
exactly as they were passed, and what the target returns or raises comes back."""

from __future__ import annotations

import asyncio
import dis
import inspect
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from profiler_host import gates, hooks, rewriter, stackdepth


def plain(a, b=2, /, c=3, *args, d, e=5, **kwargs):  # type: ignore[no-untyped-def]
    return ("plain", a, b, c, args, d, e, kwargs)


def positional(self, x):  # type: ignore[no-untyped-def]
    total = 0
    for n in range(x):
        try:
            total += 10 // n
        except ZeroDivisionError:
            total -= 1
    return total


def keyword_only(self, *, name=None, context=None):  # type: ignore[no-untyped-def]
    return (name, context)


def gated(function: Callable, target: Callable) -> types.FunctionType:
    """A function of `function`'s code made gated, as `propagation._Swap` makes it."""
    code = rewriter.forwarding(function.__code__, target, gates.OPEN)
    made = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__)
    made.__kwdefaults__ = function.__kwdefaults__
    return made


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return "forwarded"


@contextmanager
def opened() -> Iterator[None]:
    """The gates open, as while a request is sampled."""
    request = object()
    hooks.ACTIVE.append(request)
    try:
        yield
    finally:
        hooks.ACTIVE.remove(request)


CALLS = [
    ((1,), {"d": 4}),
    ((1, 9, 8, 7, 6), {"d": 4, "e": 0, "z": 1}),
    ((1,), {"c": 30, "d": 4, "extra": None}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_closed_it_is_the_function_itself(args: tuple, kwargs: dict) -> None:
    target = Recorder()
    assert gated(plain, target)(*args, **kwargs) == plain(*args, **kwargs)
    assert target.calls == []


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_open_the_target_gets_the_arguments_as_they_were_bound(args: tuple, kwargs: dict) -> None:
    """Positional ones (defaults filled in), `*args`, keyword-only ones by name, the rest
    of `**kwargs`: calling the plain function with them gives what the call would have."""
    target = Recorder()
    with opened():
        assert gated(plain, target)(*args, **kwargs) == "forwarded"
    ((passed, named),) = target.calls
    assert plain(*passed, **named) == plain(*args, **kwargs)
    assert set(named) >= {"d", "e"}


def test_the_signature_and_argument_errors_are_the_functions_own() -> None:
    made = gated(plain, Recorder())
    assert inspect.signature(made) == inspect.signature(plain)
    with opened(), pytest.raises(TypeError) as raised:
        made()
    with pytest.raises(TypeError) as plainly:
        plain()  # type: ignore[call-arg]
    assert str(raised.value) == str(plainly.value)


def test_a_body_with_loops_and_handlers_runs_as_before_behind_the_gate() -> None:
    made = gated(positional, Recorder())
    assert [made(None, n) for n in range(6)] == [positional(None, n) for n in range(6)]
    with opened():
        assert made(None, 3) == "forwarded"


def test_what_the_target_raises_comes_back_from_the_functions_first_line() -> None:
    """The forwarding frame carries the `def` line (not a line the body never runs)."""

    def target(self: Any, *, name: Any = None, context: Any = None) -> None:
        raise LookupError(name)

    made = gated(keyword_only, target)
    with opened(), pytest.raises(LookupError) as raised:
        made(None, name="n")
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [frame.name for frame in frames[-2:]] == ["keyword_only", "target"]
    assert frames[-2].lineno == keyword_only.__code__.co_firstlineno
    assert raised.value.args == ("n",)


def native_forward(self, *, name=None, context=None):  # type: ignore[no-untyped-def]
    """What `keyword_only`'s forwarding is, compiled by CPython."""
    try:
        return Recorder()(self, name=name, context=context)
    finally:
        self = name = context = None


def test_the_forwarding_handlers_keep_the_depths_the_compiler_gives() -> None:
    """The handlers of the forwarding's `try`/`finally` are entered as deep as CPython's
    own: a handler entered one value short reads below the frame's stack as it re-raises
    (a crash in anyio's suite before `rewriter` kept the compiler's depths)."""
    code = rewriter.forwarding(keyword_only.__code__, Recorder(), gates.OPEN)
    entries = [(e.depth, e.lasti) for e in dis.Bytecode(code).exception_entries]
    assert entries == [(e.depth, e.lasti) for e in dis.Bytecode(native_forward).exception_entries]


def test_the_depth_check_refuses_a_copy_below_the_stack() -> None:
    def loads(a):  # type: ignore[no-untyped-def]
        return a

    raw = bytearray(loads.__code__.co_code)
    at = next(i for i in range(0, len(raw), 2) if raw[i] == dis.opmap["LOAD_FAST"])
    raw[at : at + 2] = bytes([dis.opmap["COPY"], 9])  # the same effect, read 9 deep
    with pytest.raises(stackdepth.StackDepthError, match="COPY 9"):
        stackdepth.check(loads.__code__.replace(co_code=bytes(raw)))
    stackdepth.check(loads.__code__)


def test_the_forwarding_frame_lets_go_of_the_arguments() -> None:
    """As asyncio's `Handle._run` drops its handle: a frame a traceback keeps holds no
    argument, so no cycle runs through them."""

    def target(self: Any, *, name: Any = None, context: Any = None) -> None:
        raise LookupError

    made = gated(keyword_only, target)
    with opened(), pytest.raises(LookupError) as raised:
        made(object(), name=object(), context=object())
    frame = next(
        f for f, _ in traceback.walk_tb(raised.value.__traceback__)
        if f.f_code is made.__code__
    )  # fmt: skip
    assert all(value is None for value in frame.f_locals.values())


def test_the_gate_is_the_only_thing_before_the_body() -> None:
    """Closed, the function runs its own body right after the gate: no call, no name."""
    code = rewriter.forwarding(plain.__code__, Recorder(), gates.OPEN)
    assert code.co_names[: len(plain.__code__.co_names)] == plain.__code__.co_names
    assert code.co_varnames == plain.__code__.co_varnames
    names = [i.opname for i in dis.get_instructions(code)]
    body = [i.opname for i in dis.get_instructions(plain.__code__)]
    start = body.index("RESUME") + 1
    assert names[:start] == body[:start]
    gate_length = 2
    assert names[start + gate_length : start + gate_length + len(body) - start] == body[start:]


def test_code_it_cannot_forward_is_refused() -> None:
    def cell(x):  # type: ignore[no-untyped-def]
        return lambda: x

    def generator(x):  # type: ignore[no-untyped-def]
        yield x

    for function in (cell, generator):
        with pytest.raises(rewriter.NotInstrumentable):
            rewriter.forwarding(function.__code__, Recorder(), gates.OPEN)


@pytest.mark.parametrize(
    "method",
    [
        asyncio.BaseEventLoop.create_task,
        asyncio.BaseEventLoop.call_soon,
        asyncio.Handle._run,
        threading.Thread.start,
        ThreadPoolExecutor.submit,
    ],
    ids=lambda method: method.__qualname__,
)
def test_the_patched_methods_can_be_forwarded(method: Callable) -> None:
    """What `propagation` patches in their code, on this interpreter."""
    target = Recorder()
    made = gated(method, target)
    with opened():
        assert made(*range(method.__code__.co_argcount)) == "forwarded"
    assert target.calls[0][0][: method.__code__.co_argcount] == tuple(
        range(method.__code__.co_argcount)
    )


def test_a_function_of_no_arguments_and_one_named_like_the_target() -> None:
    target = Recorder()

    def nothing():  # type: ignore[no-untyped-def]
        return "plain"

    def named(_target):  # type: ignore[no-untyped-def]
        return _target

    with opened():
        assert gated(nothing, target)() == "forwarded"
        assert gated(named, target)("argument") == "forwarded"
    assert target.calls == [((), {}), (("argument",), {})]
    assert gated(nothing, target)() == "plain"
