"""A pytest plugin that the third-party suites' instrumented runs load first
(`-p request_profiler_probe`; tests/test_host_thirdparty.py puts this directory on
PYTHONPATH). It changes nothing in the run: it looks at the host in this process and, when
the session ends, writes what it saw as JSON to `$REQUEST_PROFILER_PROBE`:

- `instrumenter`: the instrumenter's counters (functions rewritten, code left
  uninstrumented by an error) and `hook_errors`, the hooks' own failures;
- `modules`: per imported module the filter wants, how many functions defined in its own
  file are live, how many of them run instrumented code (a module loaded past our import
  hook, say by pytest's assertion rewriter, shows 0 instrumented), its loader's class and
  whether it is a test module by the run's own `python_files` or a conftest (pytest
  rewrites those itself, which the README tells);
- `tests`: how many test calls ran, and in how many of them a tracer was set
  (`sys.gettrace()`), the whole-process request was sampled (the gate open and a lane in
  this context, so every instrumented function the test calls takes the recording copy)
  and both at once.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref
from collections.abc import Iterator
from types import FunctionType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from profiler_host.runtime import Profiler

_tests = {"run": 0, "traced": 0, "sampled": 0, "traced_and_sampled": 0}
_tracers: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    from profiler_host import hooks
    from profiler_host.recording import CURRENT

    tracer = sys.gettrace()
    sampled = bool(hooks.HOOKS.gate) and CURRENT.get() is not None
    _tests["run"] += 1
    _tests["traced"] += tracer is not None
    _tests["sampled"] += sampled
    _tests["traced_and_sampled"] += tracer is not None and sampled
    if tracer is not None:
        _tracers.add(type(tracer).__qualname__)
    return (yield)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("REQUEST_PROFILER_PROBE")
    if not path:
        return
    from profiler_host import hooks, runtime

    profiler = runtime.active()
    report: dict = {"tests": _tests, "tracers": sorted(_tracers), "started": bool(profiler)}
    if profiler is not None:
        instrumenter = profiler.instrumenter
        report["instrumenter"] = {
            name: value for name, value in vars(instrumenter).items() if type(value) is int
        }
        report["instrumenter"]["hook_errors"] = hooks.errors[0]
        report["modules"] = _modules(profiler)
    _write(path, report)
    if profiler is not None and os.environ.get("REQUEST_PROFILER_PROBE_RELEASE"):
        report["released"] = _release(profiler)
        _write(path, report)


def _write(path: str, report: dict) -> None:
    with open(path, "w") as out:
        json.dump(report, out, indent=1, sort_keys=True)


def _release(profiler: Profiler) -> dict[str, int]:
    from profiler_host import runtime

    instrumenter = profiler.instrumenter
    rewritten = [
        weakref.ref(twin)
        for original, twin in instrumenter._twins.values()  # what uninstrument reads too
        if twin is not original
    ]
    runtime.stop()
    instrumenter._twins.clear()
    instrumenter._originals.clear()
    gc.collect()
    return {"rewritten": len(rewritten), "alive": sum(ref() is not None for ref in rewritten)}


def _modules(profiler: Profiler) -> dict[str, dict]:
    """module -> live functions defined in its file, how many run instrumented code, what
    loaded it."""
    modules = {
        name: module
        for name, module in list(sys.modules.items())
        if profiler.filter(name) and isinstance(getattr(module, "__file__", None), str)
    }
    files = {name: module.__file__ for name, module in modules.items()}
    found = {
        name: {
            "functions": 0,
            "instrumented": 0,
            "loader": type(getattr(module.__spec__, "loader", None)).__qualname__,
        }
        for name, module in modules.items()
    }
    for obj in gc.get_objects():
        if type(obj) is not FunctionType:
            continue
        module = obj.__module__
        if module not in files or obj.__code__.co_filename != files[module]:
            continue
        found[module]["functions"] += 1
        found[module]["instrumented"] += profiler.instrumenter.is_instrumented(obj.__code__)
    return found
