"""Which modules the import hook instruments, whichever loader loads them: `--include`
names packages with their submodules, loaders without `get_code` (pytest's assertion
rewriter) are instrumented after the module ran, finders put in front of ours are caught
up with, and the host says at exit which wanted modules have no instrumented function."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_host import hooks
from profiler_host.filters import ModuleFilter
from profiler_host.functions import FunctionRegistry
from profiler_host.importer import InstrumentingFinder
from profiler_host.instrumenter import Instrumenter

CORE = """
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
REGISTRY = [lambda: 1]

class Shape:
    def area(self):
        return 1

    @property
    def name(self):
        return "shape"
"""


def instrumented(func) -> bool:
    return hooks.ACTIVE in func.__code__.co_consts


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`shopapp` (with `core`, `sub.deep`), `shopapp_extra` and `otherapp` on sys.path."""
    root = tmp_path / "site"
    pkg = root / "shopapp"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def top():\n    return 0\n")
    (pkg / "core.py").write_text(textwrap.dedent(CORE))
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("def deep():\n    return 1\n")
    (root / "shopapp_extra.py").write_text("def extra():\n    return 2\n")
    (root / "otherapp.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(root))
    yield pkg
    for name in [m for m in sys.modules if m.split(".")[0].startswith(("shopapp", "otherapp"))]:
        del sys.modules[name]


def hooked(*include: str) -> tuple[Instrumenter, InstrumentingFinder]:
    inst = Instrumenter(ModuleFilter(include), FunctionRegistry())
    finder = InstrumentingFinder(inst)
    finder.install()
    return inst, finder


@pytest.fixture
def unhook() -> Iterator[list]:
    """Uninstalls what a test hooked up (finders, instrumenters), whatever it did."""
    made: list = []
    yield made
    for thing in made:
        if isinstance(thing, InstrumentingFinder):
            thing.uninstall()
        elif isinstance(thing, Instrumenter):
            thing.uninstrument()
        else:
            while thing in sys.meta_path:
                sys.meta_path.remove(thing)


def test_include_names_a_package_and_its_submodules():
    wanted = ModuleFilter(("shopapp",))
    assert wanted("shopapp") and wanted("shopapp.core") and wanted("shopapp.sub.deep")
    assert not wanted("shopapp_extra") and not wanted("other.shopapp")
    globs = ModuleFilter(("shop*",), ("shopapp.sub",))
    assert globs("shopapp_extra") and globs("shopapp.core")
    assert not globs("shopapp.sub") and not globs("shopapp.sub.deep")  # so does exclude
    assert ModuleFilter(("shopapp.*",))("shopapp")  # `pkg.*` still includes pkg
    assert ModuleFilter(("json",))("json.decoder")  # named literally: protected is allowed
    assert not ModuleFilter(("*",))("json.decoder")


def test_include_of_a_package_instruments_its_submodules(package: Path, unhook: list):
    inst, finder = hooked("shopapp")
    unhook += [finder, inst]
    core = importlib.import_module("shopapp.core")
    deep = importlib.import_module("shopapp.sub.deep")
    assert instrumented(core.plain) and instrumented(deep.deep)
    assert instrumented(sys.modules["shopapp"].top)
    assert not instrumented(importlib.import_module("shopapp_extra").extra)
