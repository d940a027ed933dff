"""The import hook: wanted modules execute instrumented code; their `.pyc` stays original.

The finder goes first on `sys.meta_path` and asks the other finders for the spec, then
swaps the loader for an instance of a subclass of the loader's own class (so
`importlib.resources` and friends still recognise it) whose `get_code` transforms what
the original `get_code` returned, after that wrote its cache.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

from profiler_host.instrumenter import Instrumenter


class InstrumentingFinder(MetaPathFinder):
    def __init__(self, instrumenter: Instrumenter) -> None:
        self.instrumenter = instrumenter
        self._subclasses: dict[type, type] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not self.instrumenter.wanted(fullname):
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
            return spec
        base = type(spec.loader)
        sub = self._subclasses.get(base)
        if sub is None:
            sub = self._subclasses[base] = _instrumenting_subclass(base, self.instrumenter)
        spec.loader = as_subclass(spec.loader, sub)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def spec_from_others(
    me: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    """The spec the rest of `sys.meta_path` finds (our own finders skipped)."""
    for finder in list(sys.meta_path):
        if finder is me or type(finder) is type(me):
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def as_subclass(loader: object, sub: type) -> object:
    """A copy of `loader` whose class is `sub` (a subclass of its own class)."""
    wrapped = copy.copy(loader)
    wrapped.__class__ = sub
    return wrapped


def _instrumenting_subclass(base: type, instrumenter: Instrumenter) -> type:
    original_get_code = base.get_code

    def get_code(self: object, fullname: str) -> CodeType | None:
        code = original_get_code(self, fullname)
        return None if code is None else instrumenter.transform_module(code, fullname)

    return type(base.__name__, (base,), {"get_code": get_code, "__module__": base.__module__})
