"""The import hook and the sweep: which modules get instrumented code, and that nothing else
changes (the .pyc cache, the loader's type, resources, uninstrument)."""

from __future__ import annotations

import dis
import importlib
import importlib.machinery
import importlib.resources
import importlib.util
import marshal
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from profiler_host import gates, hooks, recording
from profiler_host.codecache import CodeCache
from profiler_host.filters import ModuleFilter
from profiler_host.functions import FunctionRegistry
from profiler_host.importer import InstrumentingFinder
from profiler_host.instrumenter import (
    Instrumenter,
    _codeswap,
    _live_functions_in_python,
    _set_code_in_python,
    live_functions,
)

MODULE = """
import functools

def plain(x):
    return x + 1

def decorate(func):
    @functools.wraps(func)
    def wrapper(*args):
        return func(*args) * 2
    return wrapper

@decorate
def decorated(x):
    return x

def make_adder(n):
    def add(x):
        return x + n
    return add

add_two = make_adder(2)

class Shape:
    def area(self):
        return 1

    @property
    def name(self):
        return "shape"

    @staticmethod
    def unit():
        return 1

    @classmethod
    def make(cls):
        return cls()
"""


def instrumented(func) -> bool:
    return gates.gated(func.__code__)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "site"
    pkg = root / "shopapp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text(textwrap.dedent(MODULE))
    (pkg / "data.txt").write_text("resource")
    (root / "otherapp.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # see the .pyc path too
    yield pkg
    for name in [m for m in sys.modules if m.split(".")[0] in ("shopapp", "otherapp")]:
        del sys.modules[name]


@pytest.fixture
def instrumenter() -> Iterator[Instrumenter]:
    inst = Instrumenter(ModuleFilter(("shopapp.*",)), FunctionRegistry())
    finder = InstrumentingFinder(inst)
    finder.install()
    try:
        yield inst
    finally:
        finder.uninstall()
        inst.uninstrument()


def record(func, *args):
    """Calls func inside a sampled request; returns (result, function names entered)."""
    request = recording.Request(1, "/t", "GET", 1000)
    hooks.ACTIVE.append(request)
    token = recording.CURRENT.set(request.main)
    try:
        result = func(*args)
    finally:
        recording.CURRENT.reset(token)
        hooks.ACTIVE.remove(request)
    return result, [e for e in request.main.drain() if e[0] == hooks.ENTER]


def test_import_hook_instruments_wanted_modules_only(package: Path, instrumenter: Instrumenter):
    core = importlib.import_module("shopapp.core")
    other = importlib.import_module("otherapp")
    for func in (
        core.plain,
        core.decorated,
        core.decorated.__wrapped__,
        core.add_two,
        core.Shape.area,
        core.Shape.unit,
        core.Shape.make.__func__,
        core.Shape.name.fget,
    ):
        assert instrumented(func), func
    assert not instrumented(other.f)
    assert not instrumented(importlib.import_module("json").dumps)
    result, entered = record(core.decorated, 5)
    assert result == 10
    names = {instrumenter.registry.defs[e[1] - 1].qualname for e in entered}
    assert names == {"decorate.<locals>.wrapper", "decorated"}


def test_pyc_cache_keeps_the_original_code(package: Path, instrumenter: Instrumenter):
    importlib.import_module("shopapp.core")
    cached = Path(importlib.util.cache_from_source(str(package / "core.py")))
    data = cached.read_bytes()
    code = marshal.loads(data[16:])  # header: magic, flags, mtime, size
    source = (package / "core.py").read_text()
    assert code == compile(source, str(package / "core.py"), "exec", dont_inherit=True)


def test_loader_keeps_its_type_and_resources_work(package: Path, instrumenter: Instrumenter):
    core = importlib.import_module("shopapp.core")
    assert isinstance(core.__loader__, importlib.machinery.SourceFileLoader)
    assert type(core.__loader__) is not importlib.machinery.SourceFileLoader
    text = importlib.resources.files("shopapp").joinpath("data.txt").read_text()
    assert text == "resource"


def test_sweep_swaps_modules_imported_before_start(package: Path):
    core = importlib.import_module("shopapp.core")
    early_adder = core.make_adder(5)  # a closure created before instrumentation
    assert not instrumented(core.plain)
    inst = Instrumenter(ModuleFilter(("shopapp.*",)), FunctionRegistry())
    try:
        assert inst.sweep() >= 8
        assert instrumented(core.plain) and instrumented(early_adder)
        assert instrumented(core.make_adder(1))  # nested code was swapped too
        result, entered = record(early_adder, 1)
        assert result == 6 and len(entered) == 1
        inst.sweep()
        assert inst.functions_instrumented == len(inst.registry.defs)  # no double rewrite
    finally:
        inst.uninstrument()
    assert not instrumented(core.plain) and not instrumented(early_adder)
    assert not instrumented(core.make_adder(1))
    assert record(core.plain, 1) == (2, [])


def specialised_call(function: Callable[[int], object]) -> str:
    """What a new call site of `function` has specialised to after warming up (compiled
    anew: a call site's specialisation lives in its code object)."""
    namespace = {"function": function}
    exec("def call_site():\n    return function(1)\n", namespace)
    call_site = namespace["call_site"]
    for _ in range(64):
        call_site()
    calls = dis.get_instructions(call_site, adaptive=True)
    return next(i.opname for i in calls if i.opname.startswith("CALL"))


@pytest.mark.skipif(_codeswap is None, reason="the C module is not in use")
def test_swapped_functions_keep_their_calls_specialised(package: Path):
    """3.13 takes a function's version away when its `__code__` is set and never gives it
    another, so its calls would stay generic for good; `set_code` gives it back."""
    core = importlib.import_module("shopapp.core")
    inst = Instrumenter(ModuleFilter(("shopapp.*",)), FunctionRegistry())
    try:
        inst.sweep()
        assert instrumented(core.plain) and instrumented(core.Shape.area)
        assert specialised_call(core.plain) == "CALL_PY_EXACT_ARGS"
        assert specialised_call(core.Shape().area.__func__) == "CALL_PY_EXACT_ARGS"
    finally:
        inst.uninstrument()
    assert not instrumented(core.plain)
    assert specialised_call(core.plain) == "CALL_PY_EXACT_ARGS"


@pytest.mark.skipif(sys.version_info[:2] != (3, 13), reason="the trap is 3.13's")
def test_setting_code_in_python_leaves_calls_generic_on_3_13():
    """Why `set_code` is in C: the plain attribute assignment is what loses the version."""

    def plain(x: int) -> int:
        return x + 1

    _set_code_in_python(plain, plain.__code__.replace())
    assert specialised_call(plain) == "CALL"


def _tuples_built_while(scan: Callable[[], object], scans: int) -> list[BaseException]:
    """What a thread that builds tuples from generators raises while `scan` runs `scans`
    times, with the interpreter switching threads as often as it can."""
    errors: list[BaseException] = []
    done = threading.Event()

    def build() -> None:
        while not done.is_set():
            try:
                tuple(str(i) for i in range(200))
            except SystemError as error:
                errors.append(error)
                return

    interval = sys.getswitchinterval()
    builder = threading.Thread(target=build)
    sys.setswitchinterval(1e-6)
    try:
        builder.start()
        for _ in range(scans):
            scan()
            if errors:
                break
    finally:
        sys.setswitchinterval(interval)
        done.set()
        builder.join()
    return errors


@pytest.mark.skipif(_codeswap is None, reason="the C module is not in use")
def test_finding_live_functions_never_breaks_another_threads_tuple(package: Path):
    """gc.get_objects() lists a tuple another thread is still filling; held by Python code
    while that thread runs, the list makes the tuple's resize fail in the app's code. The
    sweep, uninstrument and the import hook find functions in C, where no thread runs."""
    core = importlib.import_module("shopapp.core")
    assert _tuples_built_while(live_functions, 300) == []
    assert _tuples_built_while(lambda: live_functions(vars(core)), 300) == []
    assert _tuples_built_while(_live_functions_in_python, 300) != []  # why it is in C


def test_both_ways_of_finding_live_functions_find_the_same(package: Path):
    core = importlib.import_module("shopapp.core")
    namespace = vars(core)
    found = {id(f) for f in live_functions(namespace)}
    assert found == {id(f) for f in _live_functions_in_python(namespace)}
    assert id(core.plain) in found and id(core.Shape.area) in found
    assert all(f.__globals__ is namespace for f in live_functions(namespace))
    everywhere = live_functions()
    assert any(f is core.plain for f in everywhere)
    assert all(type(f) is types.FunctionType for f in everywhere)


def test_profiler_and_protected_packages_are_never_instrumented():
    wanted = ModuleFilter(("*",), ("shop.admin*",))
    assert wanted("shop.views") and wanted("otherlib")
    assert not wanted("shop.admin.views")
    assert not wanted("profiler_host.hooks") and not wanted("profiler_core.model")
    assert not wanted("json") and not wanted("asyncio.tasks") and not wanted("grpc")
    explicit = ModuleFilter(("json", "json.*", "profiler_host.*"))
    assert explicit("json.decoder") and explicit("json")
    assert not explicit("profiler_host.hooks")


def import_fresh(name: str, cache_dir: Path) -> tuple[object, Instrumenter]:
    """Imports `name` anew under an instrumenter whose rewritten code goes through the cache."""
    for loaded in [m for m in sys.modules if m.split(".")[0] == name.split(".")[0]]:
        del sys.modules[loaded]
    inst = Instrumenter(
        ModuleFilter(("shopapp.*",)), FunctionRegistry(), cache=CodeCache(cache_dir, hooks.HOOKS)
    )
    finder = InstrumentingFinder(inst)
    finder.install()
    try:
        return importlib.import_module(name), inst
    finally:
        finder.uninstall()


def test_code_cache_gives_the_same_instrumented_module(package: Path, tmp_path: Path):
    cache_dir = tmp_path / "cache"
    cold, cold_inst = import_fresh("shopapp.core", cache_dir)
    try:
        assert cold_inst.cache.misses == 2 and len(list(cache_dir.iterdir())) == 2  # + __init__
        cold_names = [(d.qualname, d.line) for d in cold_inst.registry.defs]
    finally:
        cold_inst.uninstrument()
    warm, warm_inst = import_fresh("shopapp.core", cache_dir)
    try:
        assert warm_inst.cache.hits == 2
        assert [(d.qualname, d.line) for d in warm_inst.registry.defs] == cold_names
        assert warm_inst.functions_instrumented == len(cold_names) >= 8
        assert instrumented(warm.plain) and instrumented(warm.Shape.name.fget)
        assert warm.plain.__code__.co_consts[: len(cold.plain.__code__.co_consts)]
        result, entered = record(warm.decorated, 5)
        assert result == 10
        names = {warm_inst.registry.defs[e[1] - 1].qualname for e in entered}
        assert names == {"decorate.<locals>.wrapper", "decorated"}
    finally:
        warm_inst.uninstrument()
    assert not instrumented(warm.plain) and not instrumented(warm.add_two)
    (package / "core.py").write_text(textwrap.dedent(MODULE) + "\n\ndef later():\n    pass\n")
    changed, changed_inst = import_fresh("shopapp.core", cache_dir)
    try:
        assert changed_inst.cache.hits == 1 and changed_inst.cache.misses == 1  # core only
        assert instrumented(changed.later)
    finally:
        changed_inst.uninstrument()
