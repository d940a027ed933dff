"""What an instrumented call costs in the app's own threads, against the same plain function
in the same process: the gate closed (nothing sampled), open (another request sampled, not
this one) and sampled (enter and exit recorded), beside cProfile on the plain functions.
Also the cost of an `await` that gives control to the event loop: a coroutine call awaiting
`asyncio.sleep(0)` from a coroutine loop (two coroutines suspend and resume, the task is
woken), with the host's asyncio patches installed in every mode.

Modes run interleaved, in a shuffled order per round, so this VM's drifting speed hits all
of them alike; each figure is the median (and range) over rounds of
(mode's time - plain time) / instrumented calls. The hooks are the C hot path when it is
built (`PROFILER_PURE_PYTHON=1` measures the Python ones); the JSON records which.
"""

from __future__ import annotations

import asyncio
import cProfile
import random
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from benchmarks import results
from profiler_host import gates, hooks, propagation, recording
from profiler_host.functions import FunctionRegistry
from profiler_host.instrumenter import Instrumenter

# `nested` makes 5 instrumented calls (itself and 4 leaves), `leaf` one
SOURCE = """
def leaf(x):
    return x

def nested(x):
    return leaf(x) + leaf(x) + leaf(x) + leaf(x)

async def ping(x):
    await asyncio.sleep(0)
    return x

async def pings(n):
    for _ in range(n):
        await ping(1)
"""
CALLS = {"leaf": 1, "nested": 5}
AWAITS = "pings"  # `pings(n)` makes n awaits that reach the loop
MODULE = "benchmarks_host_calls_target"
# below 2**30 like real caps (a bigger one makes the hook's truncation check slower)
EVENT_CAP = 1 << 29
MODES = ("loop", "plain", "closed", "open", "sampled", "cprofile")


def _drive(func: Callable[[int], Any], n: int) -> int:
    """The timed loop: plain code, so only `func` differs between modes."""
    started = time.perf_counter_ns()
    for _ in range(n):
        func(1)
    return time.perf_counter_ns() - started


def _drive_awaits(func: Callable[[int], Any], n: int) -> int:
    """`n` awaits in one event loop (made before the clock starts)."""
    loop = asyncio.new_event_loop()
    try:
        started = time.perf_counter_ns()
        loop.run_until_complete(func(n))
        return time.perf_counter_ns() - started
    finally:
        loop.close()


def _loop(n: int) -> int:
    started = time.perf_counter_ns()
    for _ in range(n):
        pass
    return time.perf_counter_ns() - started


def _namespace(instrument: bool) -> dict[str, Any]:
    code = compile(SOURCE, f"<{MODULE}>", "exec")
    if instrument:
        code = Instrumenter(lambda name: True, FunctionRegistry()).transform(code, MODULE)
    namespace: dict[str, Any] = {"__name__": MODULE, "asyncio": asyncio}
    exec(code, namespace)
    return namespace


@contextmanager
def _requests(sampled: int, others: int) -> Any:
    """`sampled` requests recorded in this context and `others` recorded elsewhere (in the
    gate only); their lanes are drained afterwards so memory stays bounded."""
    made = [recording.Request(i, "/bench", "GET", EVENT_CAP) for i in range(sampled + others)]
    hooks.ACTIVE.extend(made)
    token = recording.CURRENT.set(made[0].main if sampled else None)
    try:
        yield
    finally:
        recording.CURRENT.reset(token)
        hooks.ACTIVE.clear()
        for request in made:
            for lane in request.lanes:
                lane.drain()


def _time(mode: str, plain: Callable, instrumented: Callable, n: int, drive: Callable) -> int:
    if mode == "loop":
        return _loop(n)
    if mode == "plain":
        return drive(plain, n)
    if mode == "cprofile":
        profile = cProfile.Profile()
        profile.enable()
        try:
            return drive(plain, n)
        finally:
            profile.disable()
    with _requests(sampled=int(mode == "sampled"), others=int(mode != "closed")):
        return drive(instrumented, n)


def _summary(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "n": len(values),
    }


def run(rounds: int, calls: int, seed: int = 1) -> dict:
    if hooks.ACTIVE:
        raise RuntimeError("a request is sampled in this process already")
    plain_ns, instrumented_ns = _namespace(False), _namespace(True)
    if not gates.gated(instrumented_ns["leaf"].__code__):
        raise RuntimeError("the rewriter left the benchmark functions uninstrumented")
    rng = random.Random(seed)
    figures: dict[str, dict[str, list[float]]] = {}
    propagation.install()
    try:
        for name, per_call in [*CALLS.items(), (AWAITS, 1)]:
            drive = _drive_awaits if name == AWAITS else _drive
            n = max(1, calls // per_call // (10 if name == AWAITS else 1))
            pair = (plain_ns[name], instrumented_ns[name])
            for mode in MODES:  # warm-up: specialise the bytecode, fill free lists
                _time(mode, *pair, n // 10, drive)
            added: dict[str, list[float]] = {m: [] for m in MODES if m != "plain"}
            for _ in range(rounds):
                order = list(MODES)
                rng.shuffle(order)
                took = {mode: _time(mode, *pair, n, drive) for mode in order}
                added["loop"].append((took["plain"] - took["loop"]) / (n * per_call))
                for mode in MODES[2:]:
                    added[mode].append((took[mode] - took["plain"]) / (n * per_call))
            figures[name] = added
    finally:
        propagation.uninstall()
    out = {
        name: {
            ("bare_call" if mode == "loop" else f"{mode}_added"): _summary(values)
            for mode, values in added.items()
        }
        for name, added in figures.items()
    }
    rows = [
        (name, label, f"{s['median']:.1f}", f"{s['min']:.1f}-{s['max']:.1f}", s["n"])
        for name, by_mode in out.items()
        for label, s in by_mode.items()
    ]
    print(results.table(("functions", "ns per call", "median", "range", "rounds"), rows))
    print(f"hooks: {recording.IMPLEMENTATION}")
    saved = {"rounds": rounds, "calls_per_round": calls, "hooks": recording.IMPLEMENTATION}
    path = results.save("host-calls", {**saved, **out})
    print(f"\nresults: {path}")
    return out
