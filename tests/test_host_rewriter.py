"""Instrumented code behaves exactly like the original (issue 3's torture module).

Every case of `tests/torture_cases.py` runs plain, instrumented but not sampled (gate
closed; gate open but no lane in this context) and instrumented and sampled; what a user
could observe must be identical, and the sampled event stream must be well formed.

The hooks exist twice, in C (`profiler_host._hotpath`, what `hooks.HOOKS` holds when it is
built) and in Python (`hooks.PYTHON_HOOKS`): tests that run hooks run under both, and
`test_pure_python_fallback` runs them again with `PROFILER_PURE_PYTHON=1` (Python lanes too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import dis
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import marshal
import os
import random
import re
import subprocess
import sys
import threading
import traceback
import tracemalloc
import types
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_host import hooks, recording, rewriter, stackdepth
from profiler_server.assembly.builder import assemble
from profiler_server.assembly.events import Run
from profiler_server.assembly.pending import LaneInfo, PendingRequest
from tests import torture_cases

ROOT = Path(__file__).resolve().parents[1]
FILES = frozenset({torture_cases.__file__, torture_cases.LONG_FILENAME})
CASES = [
    *sorted(name for name in vars(torture_cases) if name.startswith("case_")),
    "case_extended_arg_jumps",  # generated source, see torture_cases.long_jumps_source
]
ENTER, EXIT, EXIT_EXCEPTION = hooks.ENTER, hooks.EXIT, hooks.EXIT_EXCEPTION
EXITS = (EXIT, EXIT_EXCEPTION, hooks.EXIT_CANCELLED)
SUSPEND, RESUME = hooks.SUSPEND, hooks.RESUME
PURE_PYTHON = os.environ.get("PROFILER_PURE_PYTHON", "") not in ("", "0")
# the hook implementations to test: the Python hooks run on C lanes as well
IMPLEMENTATIONS = {"python": hooks.PYTHON_HOOKS}
if recording.IMPLEMENTATION == "c":
    IMPLEMENTATIONS["c"] = hooks.HOOKS


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a user can observe of one run of a case."""

    value: Any
    error: tuple | None  # see _describe
    trace: tuple  # sys.settrace events inside the torture module, when traced


@pytest.fixture(scope="module")
def plain() -> types.ModuleType:
    return torture_cases.load("torture_plain", None)[0]


@pytest.fixture(scope="module", params=list(IMPLEMENTATIONS))
def instrumented(request) -> tuple[types.ModuleType, dict[int, types.CodeType]]:
    name = request.param
    return torture_cases.load(f"torture_instrumented_{name}", IMPLEMENTATIONS[name])


@pytest.fixture(params=list(IMPLEMENTATIONS))
def implementation(request) -> rewriter.Hooks:
    return IMPLEMENTATIONS[request.param]


@pytest.mark.skipif(PURE_PYTHON, reason="PROFILER_PURE_PYTHON=1 selects the Python hooks")
def test_c_hot_path_is_in_use() -> None:
    """An install builds the C hot path (./dev setup, CI); a silent fallback must not pass."""
    assert importlib.util.find_spec("profiler_host._hotpath") is not None, (
        "profiler_host._hotpath is not built: `pip install -e .` needs a C compiler "
        "(PROFILER_PURE_PYTHON=1 tests the Python hooks alone)"
    )
    from profiler_host import _hotpath

    assert recording.IMPLEMENTATION == "c"
    assert isinstance(recording.Request(1, "/", "GET", 10).main, _hotpath.LaneCore)
    assert hooks.HOOKS.enter is _hotpath.enter and hooks.HOOKS.exit is _hotpath.exit


@pytest.mark.skipif(PURE_PYTHON, reason="this is that run")
def test_pure_python_fallback() -> None:
    """The hook tests again with PROFILER_PURE_PYTHON=1: Python hooks on Python lanes."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "behaves_the_same or await_chain or hook or lane_api or truncat"],
        cwd=ROOT,
        env={**os.environ, "PROFILER_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\b[1-9]\d+ passed", done.stdout), done.stdout[-500:]


@contextmanager
def request(sampled: bool) -> Iterator[recording.Request]:
    """A request in flight; its main lane is current only when `sampled`."""
    req = recording.Request(request_id=1, route="/torture", method="GET", event_cap=200_000)
    hooks.ACTIVE.append(req)
    try:
        if sampled:
            with current(req.main):
                yield req
        else:
            yield req
    finally:
        hooks.ACTIVE.remove(req)


@contextmanager
def current(lane: recording.Lane) -> Iterator[recording.Lane]:
    """`lane` is this context's lane, as in a sampled request (enter reads it there)."""
    token = recording.CURRENT.set(lane)
    try:
        yield lane
    finally:
        recording.CURRENT.reset(token)


def _describe(exc: BaseException | None) -> tuple | None:
    """Type, message, traceback (function, line) inside the torture module; the same for
    __cause__ and __context__."""
    if exc is None:
        return None
    tb = traceback.extract_tb(exc.__traceback__)
    frames = tuple(
        (f.name, f.lineno, f.end_lineno, f.colno, f.end_colno) for f in tb if f.filename in FILES
    )
    cause, context = _describe(exc.__cause__), _describe(exc.__context__)
    return type(exc).__name__, str(exc), frames, cause, context


def observe(func: Callable[[], Any], traced: bool) -> Outcome:
    """Runs `func` once, optionally under a sys.settrace tracer limited to the torture
    module (the hooks are not there, and unsampled runs must not call them anyway)."""
    events: list[tuple] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in FILES:
            return None
        detail = arg[0].__name__ if event == "exception" else type(arg).__name__
        events.append((event, frame.f_code.co_qualname, frame.f_lineno, detail))
        return tracer

    previous = sys.gettrace()
    if traced:
        sys.settrace(tracer)
    try:
        value, error = func(), None
    except Exception as exc:
        value, error = None, exc
    finally:
        sys.settrace(previous)
    return Outcome(value, _describe(error), tuple(events))


def check_events(req: recording.Request, functions: dict[int, types.CodeType]) -> set[str]:
    """Asserts the stream is well formed, also for the server's assembler; returns the
    qualnames of the calls recorded."""
    drained = {lane.id: lane.drain() for lane in req.lanes}
    calls: dict[int, list[tuple[int, int, int]]] = {}
    for lane_id, events in drained.items():
        stamps = [event[3] for event in events]
        assert stamps == sorted(stamps), f"lane {lane_id}: timestamps go back"
        for kind, fid, cid, _ in events:
            calls.setdefault(cid, []).append((lane_id, fid, kind))
    for cid, events in calls.items():
        assert len({lane for lane, _, _ in events}) == 1, f"call {cid} spans lanes"
        assert len({fid for _, fid, _ in events}) == 1, f"call {cid} changes function"
        code = functions[events[0][1]]
        kinds = [kind for _, _, kind in events]
        where = f"call {cid} of {code.co_qualname}: {kinds}"
        assert kinds[0] == ENTER and kinds.count(ENTER) == 1, where
        assert kinds[-1] in EXITS, where
        assert sum(kind in EXITS for kind in kinds) == 1, where
        middle = kinds[1:-1]
        assert middle == [(SUSPEND, RESUME)[n % 2] for n in range(len(middle))], where
        if not code.co_flags & rewriter.RESUMABLE:
            assert not middle, where
    for lane_id, events in drained.items():
        assert_nested(lane_id, events, functions)
    assert not assembly_problems(req, drained), "the server cannot nest these events"
    return {functions[events[0][1]].co_qualname for events in calls.values()}


def assert_nested(lane_id: int, events: list[tuple], functions: dict[int, types.CodeType]) -> None:
    """A lane's calls nest: an enter or resume runs a call on top of the lane's stack, and
    only the call on top exits or suspends (so whatever runs in between is its child)."""
    stack: list[int] = []
    for kind, fid, cid, _ in events:
        if kind in (ENTER, RESUME):
            stack.append(cid)
        elif kind in (*EXITS, SUSPEND):
            where = f"lane {lane_id}: {functions[fid].co_qualname} ends while {stack[-3:]} run"
            assert stack and stack[-1] == cid, where
            stack.pop()


def assembly_problems(req: recording.Request, drained: dict[int, list[tuple]]) -> Counter:
    """What the server's assembler repairs in these events (each lane's must nest)."""
    pending = PendingRequest(req.id, req.route, req.method, start_ns=req.start_ns, status=200)
    pending.end_ns = max([req.start_ns] + [e[3] for events in drained.values() for e in events])
    for lane in req.lanes[1:]:
        parent = lane.parent.id if lane.parent else None
        info = LaneInfo(lane.kind, lane.name, parent, lane.parent_call or None, lane.start_ns)
        pending.lanes[lane.id] = info
    for seq, (lane_id, events) in enumerate(drained.items(), 1):
        columns = list(zip(*events, strict=True)) or [(), (), (), ()]
        kinds, fids, cids, times = (np.array(column, dtype=np.int64) for column in columns)
        run = Run(req.id, lane_id, kinds.astype(np.uint8), fids, cids.astype(np.uint64), times)
        pending.runs.append((seq, run))
        pending.events += len(events)
    problems: Counter = Counter()
    assemble("host-test", pending, problems, "GET /torture")
    return problems


def run_all_modes(
    case: str, plain: types.ModuleType, instrumented: tuple[types.ModuleType, dict]
) -> dict[str, Outcome]:
    """One run per mode; the sampled run's events are checked here, before they mix."""
    module, functions = instrumented
    traced = case not in torture_cases.NEAR_RECURSION_LIMIT
    errors_before = hooks.errors[0]
    outcomes = {"plain": observe(getattr(plain, case), traced)}
    outcomes["gate closed"] = observe(getattr(module, case), traced)
    with request(sampled=False) as req:
        outcomes["gate open, no lane"] = observe(getattr(module, case), traced)
    assert not any(lane.events for lane in req.lanes) and len(req.lanes) == 1
    with request(sampled=True) as req:
        outcomes["sampled"] = observe(getattr(module, case), traced=False)
        gc.collect()  # abandoned generators record their exit now
    assert not any(lane in hooks._RUNNING for lane in req.lanes), "every call has exited"
    entered = check_events(req, functions)
    assert case in entered, f"{case} was not recorded: instrumentation did not happen"
    if traced:
        assert hooks.errors[0] == errors_before, "a hook failed"
    return outcomes


@pytest.mark.parametrize("case", CASES)
def test_case_behaves_the_same(case: str, plain, instrumented) -> None:
    outcomes = run_all_modes(case, plain, instrumented)
    expected = outcomes.pop("plain")
    assert expected.trace or case in torture_cases.NEAR_RECURSION_LIMIT
    for mode, outcome in outcomes.items():
        untraced = dataclasses.replace(expected, trace=())  # hooks are Python frames
        assert outcome == (untraced if mode == "sampled" else expected), mode


def test_await_chain_events_nest(instrumented) -> None:
    """An await chain gives control away without hooks and its outer frame resumes first;
    the inner frames' SUSPEND must still come before the outer's, or the server's
    assembler truncates them (see profiler_host.hooks._RUNNING)."""
    module, functions = instrumented
    with request(sampled=True) as req:
        asyncio.run(module.chained([]))
        asyncio.run(module.awaits_bare_yield())  # a generator-based coroutine yields plainly
    names = {"chained": "chained", "leaf_coroutine": "leaf"}
    names |= {"awaits_bare_yield": "outer", "bare_yield": "inner"}
    kinds = {ENTER: "enter", EXIT: "exit", SUSPEND: "suspend", RESUME: "resume"}
    seen = [(kinds[kind], names[functions[fid].co_qualname]) for kind, fid, _, _ in req.main.events]
    assert seen == [
        ("enter", "chained"), ("enter", "leaf"),  # both give control away without a hook
        ("suspend", "leaf"), ("suspend", "chained"),  # recorded when "chained" resumes first
        ("resume", "chained"), ("resume", "leaf"), ("exit", "leaf"), ("exit", "chained"),
        ("enter", "outer"), ("enter", "inner"), ("suspend", "inner"), ("suspend", "outer"),
        ("resume", "outer"), ("resume", "inner"), ("exit", "inner"), ("exit", "outer"),
    ]  # fmt: skip
    check_events(req, functions)


def test_handlers_of_thrown_in_frames_nest_under_them(instrumented) -> None:
    """throw(), close() and athrow() resume a generator suspended at its yield with no hook;
    what its handlers call (FastAPI's `yield` dependencies cleaning up after an exception)
    must be recorded under it, not under whoever threw."""
    module, functions = instrumented
    with request(sampled=True) as req:
        module.case_handlers_of_thrown_in_frames()
    stack: list[int] = []
    callers: list[str] = []
    for kind, fid, _, _ in req.main.events:
        if kind == ENTER and functions[fid].co_qualname == "cleanup_step":
            callers.append(functions[stack[-1]].co_qualname)
        if kind in (ENTER, RESUME):
            stack.append(fid)
        elif kind in (*EXITS, SUSPEND):
            stack.pop()
    assert callers and set(callers) == {"resource", "async_resource"}, callers


def test_an_ended_request_records_nothing_more(instrumented) -> None:
    """Threads, tasks and generators that outlive their request (a pool's worker thread it
    started, a task left running) record nothing into it once it ended: no events after its
    end, no growth, and what is declined then is not counted as lost."""
    module, _ = instrumented
    log: list = []
    with request(sampled=True) as req:
        opened = module.resource(log)
        next(opened)  # suspended at its yield when the request ends
        req.finish()
        ended = [list(lane.buffer) for lane in req.lanes]
        module.cleanup_step(log, "after the end")
        opened.close()
        assert [list(lane.buffer) for lane in req.lanes] == ended
    assert req.truncated is False and log == ["opened", "after the end", "closed"]


def test_cases_that_escape_keep_their_tracebacks(plain) -> None:
    """The comparison above is only as strong as what the escaping cases show."""
    deep = observe(plain.case_deep_raise, traced=False).error
    assert deep[:2] == ("RuntimeError", "wrapped")
    assert [frame[0] for frame in deep[2]] == ["case_deep_raise", "wrap_errors"]
    assert [frame[0] for frame in deep[3][2]].count("descend") == 26
    escaped = observe(plain.case_async_raise, traced=False).error
    assert escaped[2][-1][0] == "fails_after"


def test_long_function_needs_extended_arg(instrumented) -> None:
    code = compile(torture_cases.long_jumps_source(), torture_cases.LONG_FILENAME, "exec")
    long_jumps = next(c for c in code.co_consts if getattr(c, "co_name", "") == "long_jumps")
    assert "EXTENDED_ARG" in {ins.opname for ins in dis.get_instructions(long_jumps)}
    assert len(long_jumps.co_consts) > 256  # the hooks' constants need EXTENDED_ARG too
    module, _ = instrumented
    assert module.long_jumps.__code__.co_code != long_jumps.co_code


def _walk(plain: types.CodeType, rewritten: types.CodeType) -> Iterator[tuple]:
    """Pairs of code objects at the same place in both trees."""
    yield plain, rewritten
    for old, new in zip(plain.co_consts, rewritten.co_consts, strict=False):
        if isinstance(old, types.CodeType):
            yield from _walk(old, new)


def _shape(const: Any) -> Any:
    """Nested code objects are rewritten too: compare them by name."""
    return ("code", const.co_qualname) if isinstance(const, types.CodeType) else const


def _lines(code: types.CodeType) -> set[int]:
    """The lines a code object has code for (what coverage tools count as executable)."""
    return {line for _, _, line in code.co_lines() if line is not None}


def test_code_tables_unchanged() -> None:
    """co_consts keep their prefix, names and locals their order (locals(), getclosurevars)."""
    source = Path(torture_cases.__file__).read_text()
    code = compile(source, torture_cases.__file__, "exec")
    functions: dict[int, types.CodeType] = {}
    rewritten_tree = torture_cases.instrument_tree(code, hooks.HOOKS, functions)
    checked = 0
    for old, new in _walk(code, rewritten_tree):
        if not rewriter.instrumentable(old):
            continue
        checked += 1
        assert new.co_code != old.co_code, old.co_qualname
        prefix = new.co_consts[: len(old.co_consts)]
        assert [_shape(c) for c in prefix] == [_shape(c) for c in old.co_consts], old.co_qualname
        for attr in (
            "co_names", "co_varnames", "co_cellvars", "co_freevars", "co_argcount",
            "co_posonlyargcount", "co_kwonlyargcount", "co_flags", "co_firstlineno",
            "co_qualname", "co_filename", "co_nlocals",
        ):  # fmt: skip
            assert getattr(new, attr) == getattr(old, attr), (old.co_qualname, attr)
        assert _lines(new) == _lines(old), old.co_qualname  # coverage tools read these
        assert hash(new) == hash(new.replace()) and list(dis.get_instructions(new))
        with pytest.raises(ValueError):  # why the importer transforms get_code()'s result
            marshal.dumps(new)
        stackdepth.check(new)
    assert checked == len(functions) > 50


def _opcodes(run: Callable[[], Any], code: types.CodeType) -> list[str]:
    """The instructions frames of `code` execute while `run()` runs (opcode trace events)."""
    seen: list[str] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen.append(dis.opname[code.co_code[frame.f_lasti]])
        return tracer

    # 3.12 traces opcodes only from a settrace call made after a frame asked for them
    sys._getframe().f_trace_opcodes = True
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen


# the closed gate's instructions per version (3.13's conditional jumps take exact bools)
GATES = {
    (3, 11): ["LOAD_CONST", "POP_JUMP_FORWARD_IF_NOT_NONE"],
    (3, 12): ["LOAD_CONST", "POP_JUMP_IF_NOT_NONE"],
    (3, 13): ["LOAD_CONST", "POP_JUMP_IF_NOT_NONE"],
}


@pytest.mark.parametrize("sample", ["returns", "generator", "delegating", "awaiting"])
def test_closed_gate_runs_the_original_instructions(sample: str) -> None:
    """With nothing sampled a call runs its original instructions plus the gate's two at
    entry: nothing at returns, yields or resumes."""
    original = globals()[sample]
    rewritten = rewriter.rewrite(original.__code__, 1, hooks.HOOKS)  # no request in flight
    twin = types.FunctionType(rewritten, original.__globals__, original.__name__)

    def drive(func: Callable) -> Callable[[], Any]:
        if sample == "awaiting":
            return lambda: asyncio.run(func())
        if sample == "returns":
            return lambda: func(1)
        return lambda: list(func(3))

    # 3.13 reports a code object's first traced call's opcodes from its first line event
    # on (the gate has no line): each is traced twice, the second run counts
    plain = [_opcodes(drive(original), original.__code__) for _ in range(2)][-1]
    closed = [_opcodes(drive(twin), rewritten) for _ in range(2)][-1]
    gate = GATES[sys.version_info[:2]]
    assert closed[: len(gate)] == gate  # after the first RESUME
    assert closed[len(gate) :] == plain
    assert ("YIELD_VALUE" in plain) == (sample != "returns")  # nothing added around yields


def _normalise(value: Any) -> Any:
    """Functions and classes of the two copies differ as objects, not by name."""
    if isinstance(value, dict):
        return {key: _normalise(item) for key, item in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if isinstance(value, types.ModuleType):
        return "module"
    return repr(value)


def _signature(func: Callable) -> str:
    """Without the addresses of default values (the lambda defaults differ as objects)."""
    return re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(func)))


def test_introspection_unchanged(plain, instrumented) -> None:
    before = torture_cases.sample_callables(plain)
    after = torture_cases.sample_callables(instrumented[0])
    assert before.keys() == after.keys() and len(before) > 40
    for name, func in before.items():
        other = after[name]
        assert other.__code__ is not func.__code__
        assert _signature(other) == _signature(func), name
        for predicate in (
            inspect.isgeneratorfunction,
            inspect.iscoroutinefunction,
            inspect.isasyncgenfunction,
        ):
            assert predicate(other) == predicate(func), (name, predicate.__name__)
        closure = inspect.getclosurevars(func)
        other_closure = inspect.getclosurevars(other)
        for field in ("nonlocals", "globals", "builtins"):
            got, expected = getattr(other_closure, field), getattr(closure, field)
            if field == "globals":  # the copies' own names differ
                got, expected = dict(got), dict(expected)
                got.pop("__name__", None), expected.pop("__name__", None)
            assert _normalise(got) == _normalise(expected), (name, field)
        assert other_closure.unbound == closure.unbound, name


SUBPROCESS_SCRIPT = """
from profiler_host import hooks, recording
from tests import torture_cases
module, _ = torture_cases.load("torture_subprocess", hooks.HOOKS)
print(module.except_as_in_finally_loop(7))
hooks.ACTIVE.append(object())
print(module.except_as_in_finally_loop(7))
hooks.ACTIVE.clear()
req = recording.Request(request_id=1, route="/x", method="GET", event_cap=1000)
hooks.ACTIVE.append(req)
recording.CURRENT.set(req.main)
print(module.except_as_in_finally_loop(7))
print(len(req.main.events))
"""


def test_except_as_in_finally_loop_does_not_crash(plain) -> None:
    """`except ... as name` in try/finally with `continue` in the finally (docs/host.md):
    wrong handler depths segfault here, so it runs in its own process."""
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    expected = repr(plain.except_as_in_finally_loop(7))
    assert done.stdout.splitlines() == [expected, expected, expected, "2"]


# -- hooks that fail -------------------------------------------------------------------


def returns(x: int) -> int:
    return x + 1


def raises(x: int) -> int:
    raise ValueError(x)


def generator(start: int):
    got = yield start
    yield got


def delegating(start: int):
    return (yield from generator(start))


async def awaiting() -> str:
    await asyncio.sleep(0)
    return "done"


SAMPLES = (returns, raises, generator, delegating, awaiting)


def scenario(fns: dict[str, Callable]) -> list:
    """Drives every sample through enter, exit, exit by exception, suspend and both resumes."""
    out: list = [fns["returns"](1)]
    try:
        fns["raises"](2)
    except ValueError as e:
        out.append(repr(e))
    gen = fns["generator"](3)
    out += [next(gen), gen.send(4), list(gen)]
    gen = fns["delegating"](5)
    out += [next(gen), gen.send(6)]
    try:
        next(gen)
    except StopIteration as stop:
        out.append(stop.value)
    out.append(asyncio.run(fns["awaiting"]()))
    return out


def failing_hooks(
    kind: int, exc: BaseException | type[BaseException], implementation: rewriter.Hooks
) -> tuple[rewriter.Hooks, recording.Request]:
    """The real hook functions, recording into a lane whose buffer raises `exc` when an
    event of `kind` is appended (a custom Hooks instance with its own open gate; run it
    inside `current(req.main)`)."""
    req = recording.Request(request_id=7, route="/fail", method="GET", event_cap=1000)
    lane = req.main
    record = lane.record

    def failing(event: tuple[int, int]) -> None:
        if recording.kind_of(event[0]) == kind:
            raise exc
        record(event)

    lane.record = failing
    return dataclasses.replace(implementation, gate=[True]), req


def instrument(hooks_: rewriter.Hooks) -> dict[str, Callable]:
    """Instrumented twins of the samples, by name (the scenario's argument)."""
    made = {}
    for fid, func in enumerate(SAMPLES, 1):
        code = rewriter.rewrite(func.__code__, fid, hooks_)
        made[func.__name__] = types.FunctionType(code, func.__globals__, func.__name__)
    return made


KINDS = {"enter": ENTER, "exit": EXIT, "exit_exception": EXIT_EXCEPTION}
KINDS |= {"suspend": SUSPEND, "resume": RESUME}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_hook_raising_exception_is_swallowed(kind: int, implementation) -> None:
    custom, req = failing_hooks(kind, ValueError("hook bug"), implementation)
    before = hooks.errors[0]
    plain = scenario({f.__name__: f for f in SAMPLES})
    with current(req.main):
        assert scenario(instrument(custom)) == plain
    assert hooks.errors[0] > before
    recorded = {event[0] for event in req.main.events}
    assert kind not in recorded
    if kind != ENTER:  # without an enter the call has no token: nothing else is recorded
        assert {ENTER, EXIT, EXIT_EXCEPTION, SUSPEND, RESUME} - {kind} <= recorded


def _drive(fns: dict[str, Callable], kind: int) -> None:
    """Runs the sample whose hook of `kind` fires first."""
    if kind == EXIT_EXCEPTION:
        fns["raises"](1)
    elif kind in (ENTER, EXIT):
        fns["returns"](1)
    elif kind == SUSPEND:
        next(fns["generator"](1))
    else:
        gen = fns["generator"](1)
        next(gen)
        gen.send(2)


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_keyboard_interrupt_in_hook_propagates(kind: int, implementation) -> None:
    custom, req = failing_hooks(kind, KeyboardInterrupt(), implementation)
    with current(req.main), pytest.raises(KeyboardInterrupt):
        _drive(instrument(custom), kind)


def test_keyboard_interrupt_in_delegated_resume_propagates(implementation) -> None:
    custom, req = failing_hooks(RESUME, KeyboardInterrupt(), implementation)
    with current(req.main):
        gen = instrument(custom)["delegating"](1)
        next(gen)
        with pytest.raises(KeyboardInterrupt):
            gen.send(2)
    assert inspect.getgeneratorstate(gen) == inspect.GEN_CLOSED


@pytest.mark.parametrize("slot", KINDS)
def test_custom_hook_raising_base_exception_propagates(slot: str, implementation) -> None:
    """The injected code itself never swallows: BaseException from any hook escapes."""

    def interrupt(*args: Any) -> None:
        raise KeyboardInterrupt(slot)

    lane = recording.Request(request_id=8, route="/", method="GET", event_cap=100).main
    names = {"enter": ["enter", "enter_resumable"], "resume": ["resume", "resume_delegated"]}
    changes = dict.fromkeys(names.get(slot, [slot]), interrupt)
    custom = dataclasses.replace(implementation, gate=[True], **changes)
    with current(lane), pytest.raises(KeyboardInterrupt, match=slot):
        _drive(instrument(custom), KINDS[slot])


# -- the C hooks and their Python twins -----------------------------------------------


@pytest.fixture(scope="module")
def every_implementation() -> dict[str, tuple[types.ModuleType, dict]]:
    return {
        name: torture_cases.load(f"torture_compared_{name}", implementation)
        for name, implementation in IMPLEMENTATIONS.items()
    }


def _stream(module: types.ModuleType, case: str) -> list[tuple]:
    """Everything but the clock of what a sampled run records, lane by lane."""
    with request(sampled=True) as req:
        observe(getattr(module, case), traced=False)
        gc.collect()
    shape = [(lane.id, int(lane.kind), lane.parent_call) for lane in req.lanes]
    events = [(lane.id, kind, fid, cid) for lane in req.lanes for kind, fid, cid, _ in lane.drain()]
    return [req.truncated, shape, events]


@pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C hot path is not in use")
@pytest.mark.parametrize("case", sorted(set(CASES) - torture_cases.NEAR_RECURSION_LIMIT))
def test_implementations_record_the_same_events(case: str, every_implementation) -> None:
    """Kinds, functions, call ids, lanes: identical (the hooks' own frames make the Python
    ones hit the recursion limit earlier, so that case is left out)."""
    streams = {name: _stream(module, case) for name, (module, _) in every_implementation.items()}
    assert streams["c"] == streams["python"]
    assert streams["c"][2], "nothing recorded"


def test_event_cap_truncates(implementation) -> None:
    """Calls past half the cap are not recorded and mark the request truncated."""
    fns = instrument(implementation)
    req = recording.Request(request_id=3, route="/cap", method="GET", event_cap=6)
    token = recording.CURRENT.set(req.main)
    hooks.ACTIVE.append(req)
    try:
        assert [fns["returns"](n) for n in range(5)] == [1, 2, 3, 4, 5]
    finally:
        hooks.ACTIVE.remove(req)
        recording.CURRENT.reset(token)
    assert req.truncated
    assert [(kind, cid) for kind, _, cid, _ in req.main.drain()] == [
        (ENTER, 1), (EXIT, 1), (ENTER, 2), (EXIT, 2), (ENTER, 3), (EXIT, 3)
    ]  # fmt: skip
    assert next(req.calls) == 6  # ids 4 and 5 were taken, not recorded


def test_lane_api() -> None:
    """What tools, the transport and the propagation code use of lanes and requests."""
    req = recording.Request(request_id=4, route="/api", method="GET", event_cap=100)
    lane = req.main
    assert lane.request is req and lane.thread == threading.get_ident()
    assert (req.event_cap, req.truncated, next(req.calls), next(req.calls)) == (100, False, 1, 2)
    req.event_cap, req.truncated = 0, True
    assert (req.event_cap, req.truncated) == (0, True)
    lane.append((EXIT, 7, 3, 99))
    lane.record((7 << recording.KIND_BITS | ENTER, 4, 100))
    assert list(lane.buffer) == [
        7 << recording.KIND_BITS | EXIT,
        3,
        99,
        7 << recording.KIND_BITS,
        4,
        100,
    ]
    assert lane.events == [(EXIT, 7, 3, 99), (ENTER, 7, 4, 100)]
    assert lane.drain() == [(EXIT, 7, 3, 99), (ENTER, 7, 4, 100)] and lane.events == []
    child = req.spawn(lane, recording.LaneKind.TASK, "task", 3)
    assert (child.id, child.parent, child.parent_call, child.request) == (1, lane, 3, req)
    child.thread = 12345
    assert child.thread == 12345 and req.lanes == [lane, child]
    assert len({lane, child}) == 2  # hashable by identity (hooks._RUNNING's keys)


@pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C hot path is not in use")
def test_c_lane_buffers_are_not_walked_by_the_garbage_collector() -> None:
    """A buffer holds ints only (no cycles): untracked, a collection skips its events."""
    request = recording.Request(1, "/r", "GET", event_cap=1000)
    lane = request.spawn(request.main, recording.LaneKind.TASK, "task")
    lane.append((ENTER, 7, 1, 100))
    assert not gc.is_tracked(request.main.buffer) and not gc.is_tracked(lane.buffer)
    assert gc.is_tracked(lane)


@pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C hot path is not in use")
def test_c_event_buffers_read_as_the_python_twins_lists() -> None:
    """What the transport and tools do with a buffer (len, indexes, strided slices, cutting
    the front) gives what the Python twin's list gives, through growth and shrinking; a
    bad extend leaves the buffer as it was."""
    from profiler_host import _hotpath

    rng = random.Random(3)
    buffer, twin = _hotpath.EventBuffer(), []
    for _ in range(400):
        if rng.random() < 0.7:
            events = [
                rng.choice((0, 7, 2**30, 2**62, -(2**63))) for _ in range(3 * rng.randrange(60))
            ]
            buffer.extend(events)
            twin.extend(events)
        else:
            cut = rng.randrange(len(twin) + 1)
            del buffer[:cut]
            del twin[:cut]
        assert len(buffer) == len(twin)
        start, step = rng.randrange(-5, 5), rng.choice((1, 2, 3, -3))
        assert buffer[start::step] == twin[start::step]
        assert buffer[1 : len(twin) : 3] == twin[1 : len(twin) : 3]
        if twin:
            assert (buffer[0], buffer[-1]) == (twin[0], twin[-1])
    assert list(buffer) == twin
    before = list(buffer)
    for bad, error in (
        ([1, 2], ValueError),
        ([1, 2, 2**64], OverflowError),
        ([1, 2, "3"], TypeError),
    ):
        with pytest.raises(error):
            buffer.extend(bad)
    with pytest.raises(ValueError, match="start"):
        del buffer[3:]
    with pytest.raises(TypeError):
        buffer[0] = 1
    with pytest.raises(IndexError):
        buffer[len(before)]
    assert list(buffer) == before


@pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C hot path is not in use")
def test_c_packed_events_match_the_python_ones() -> None:
    """The batch the transport sends with `_hotpath.pack`'s fields appended as bytes parses
    to the Python columns' message: several lanes' runs, times going back between lanes,
    ids and deltas of every varint length."""
    from profiler_host import _hotpath
    from profiler_host.batching import PackedColumns, PyLaneColumns

    rng = random.Random(7)
    lanes = []
    for lane in range(5):
        now = 2**40 + rng.randrange(10**9)
        buffer = _hotpath.EventBuffer()
        for call in range(rng.randrange(200)):
            now += rng.choice((0, 1, 127, 128, 2**14, 2**21, 2**35))
            fid = rng.choice((0, 1, 2**4, 2**11, 2**26))
            buffer.extend(
                [fid << recording.KIND_BITS | rng.choice((ENTER, EXIT, RESUME)), call, now]
            )
        lanes.append((lane, buffer))

    def batch(columns: type) -> BatchBuilder:
        builder = BatchBuilder(columns())
        builder.start(9, "/r", "GET", 2**40)
        for lane, buffer in lanes:
            builder.events.add_buffer(9, lane, buffer, 0, len(buffer))
            builder.events.add_buffer(9, lane, buffer, 3, 3)  # an empty run adds nothing
        builder.end(9, 2**41, 200)
        return builder

    python, packed = batch(PyLaneColumns), batch(PackedColumns)
    sent = [ingest_pb2.HostMessage.FromString(b.payload(4)) for b in (python, packed)]
    assert packed.event_count == python.event_count == len(sent[0].batch.events.kind) > 0
    assert sent[1] == sent[0]
    assert sent[0].batch == batch(PyLaneColumns).build(4)
    assert batch(PackedColumns).build(4) == sent[0].batch  # the fields merged in

    out = [bytearray() for _ in range(4)]
    buffer = lanes[0][1] if len(lanes[0][1]) else _hotpath.EventBuffer([8, 1, 2])
    for start, stop in ((0, 4), (-3, 3), (3, len(buffer) + 3), (6, 3)):
        with pytest.raises(ValueError, match="whole events"):
            _hotpath.pack(buffer, start, stop, None, *out)
    with pytest.raises(TypeError):
        _hotpath.pack([8, 1, 2, 8, 1, 2], 0, 6, None, *out)
    with pytest.raises(ValueError, match="negative"):
        _hotpath.pack(_hotpath.EventBuffer([8, -1, 2]), 0, 3, None, *out)
    assert out == [bytearray()] * 4  # nothing half-written stays


def _allocated_after(repeat: Callable[[], Any], rounds: int) -> int:
    """Bytes allocated by lines of this file (the instrumented samples, where the C hooks
    run) still held after `rounds` more runs, once warmed up."""
    repeat()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(rounds):
            repeat()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    here = [tracemalloc.Filter(True, __file__)]
    diff = after.filter_traces(here).compare_to(before.filter_traces(here), "lineno")
    return sum(stat.size_diff for stat in diff)


@pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C hot path is not in use")
@pytest.mark.parametrize("failing", [None, *KINDS])
def test_c_hooks_do_not_leak(failing: str | None) -> None:
    """Every hook, also on its error paths: what a run allocates is freed again."""
    if failing is None:
        req = recording.Request(request_id=9, route="/leak", method="GET", event_cap=1 << 29)
        custom = dataclasses.replace(hooks.HOOKS, gate=[True])
    else:
        # a class: a fresh exception each time (one instance raised again keeps its tracebacks)
        custom, req = failing_hooks(KINDS[failing], ValueError, hooks.HOOKS)
    fns = instrument(custom)

    def repeat() -> None:
        with current(req.main):
            for _ in range(20):
                scenario(fns)
        for lane in req.lanes:
            lane.drain()

    assert _allocated_after(repeat, 30) < 1024  # a token a call would be ~500 kB


# -- a big real code base --------------------------------------------------------------


STDLIB_PACKAGES = ("asyncio", "email", "json", "inspect")


def _sources(package: str) -> list[Path]:
    """The package's own source files (not its subpackages), or the module's file."""
    spec = importlib.util.find_spec(package)
    origin = Path(spec.origin)
    return sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]


def test_stdlib_rewrites_pass_stackdepth_check() -> None:
    """Every function of asyncio, email, json and inspect, compiled fresh, rewrites into
    code whose stack depths check out."""
    rewritten = 0
    for package in STDLIB_PACKAGES:
        for path in _sources(package):
            code = compile(path.read_text(), str(path), "exec")
            functions: dict[int, types.CodeType] = {}
            tree = torture_cases.instrument_tree(code, hooks.HOOKS, functions)
            for old, new in _walk(code, tree):
                if rewriter.instrumentable(old):
                    stackdepth.check(new)
                    assert new.co_code != old.co_code, old.co_qualname
                    assert new.co_varnames == old.co_varnames, old.co_qualname
                    rewritten += 1
    assert rewritten > 1500


class _InstrumentingLoader(importlib.machinery.SourceFileLoader):
    """Instruments what it loads (the transformed code is never written to a .pyc)."""

    functions: ClassVar[dict[int, types.CodeType]] = {}  # shared: ids stay unique

    def get_code(self, fullname: str) -> types.CodeType:
        code = super().get_code(fullname)
        return torture_cases.instrument_tree(code, hooks.HOOKS, self.functions)


class _InstrumentingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tops: tuple[str, ...]) -> None:
        self.tops = tops

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.partition(".")[0] not in self.tops:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _InstrumentingLoader(spec.loader.name, spec.loader.path)
        return spec


@contextmanager
def instrumented_imports(*tops: str) -> Iterator[dict[str, types.ModuleType]]:
    """Fresh, instrumented copies of these packages; the originals come back after."""
    saved = {n: m for n, m in sys.modules.items() if n.partition(".")[0] in tops}
    for name in saved:
        del sys.modules[name]
    finder = _InstrumentingFinder(tops)
    sys.meta_path.insert(0, finder)
    try:
        yield {top: importlib.import_module(top) for top in tops}
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.partition(".")[0] in tops]:
            del sys.modules[name]
        sys.modules.update(saved)


RAW_EMAIL = """\
From: Ann <ann@example.com>
To: Bob <bob@example.com>, "Carol, C." <carol@example.com>
Subject: =?utf-8?q?caf=C3=A9?= report
Date: Tue, 01 Apr 2025 10:00:00 +0000
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="XYZ"

--XYZ
Content-Type: text/plain; charset="utf-8"
Content-Transfer-Encoding: quoted-printable

Caf=C3=A9 numbers: 1, 2, 3.
--XYZ
Content-Type: application/json; name="data.json"
Content-Disposition: attachment; filename="data.json"

{"a": [1, 2.5, null], "b": {"c": "d"}}
--XYZ--
"""


def _exercise(json: types.ModuleType, email: types.ModuleType) -> list:
    """JSON round trips through the pure-Python scanner and encoder, and email parsing
    (with the `email.policy` of the copy that `email` is)."""
    policy = importlib.import_module("email.policy")
    assert sys.modules["email"] is email

    data = {"n": [1, 2.5, -3e10, None, True], "s": 'caf\u00e9 \u2603 "q"', "d": {"x": {}}}
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    # iterencode, not dumps: 3.13's dumps takes the C encoder with an indent too
    encoder = json.JSONEncoder(indent=2, sort_keys=True, ensure_ascii=False)
    text = "".join(encoder.iterencode(data))
    message = email.message_from_string(RAW_EMAIL, policy=policy.default)
    attachment = next(message.iter_attachments())
    return [
        text,
        decoder.decode(text),
        json.loads(json.dumps(data)),
        str(message["subject"]),
        [a.display_name for a in message["to"].addresses],
        message.get_body(("plain",)).get_content(),
        decoder.decode(attachment.get_content().decode()),
        message.as_string(),
    ]


def test_stdlib_runs_instrumented() -> None:
    import email
    import json

    expected = _exercise(json, email)
    with instrumented_imports("json", "email") as fresh:
        assert hooks.HOOKS.enter in fresh["json"].dumps.__code__.co_consts
        assert _InstrumentingLoader.functions, "nothing was instrumented"
        assert _exercise(fresh["json"], fresh["email"]) == expected
        with request(sampled=True) as req:
            assert _exercise(fresh["json"], fresh["email"]) == expected
        entered = check_events(req, _InstrumentingLoader.functions)
    assert {"_make_iterencode.<locals>._iterencode_dict", "FeedParser.feed"} <= entered
