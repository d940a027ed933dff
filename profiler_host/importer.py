"""The import hook: wanted modules execute instrumented code; their `.pyc` stays original.

The finder goes first on `sys.meta_path` and asks the other finders for the spec, then
swaps the loader for an instance of a subclass of the loader's own class (so
`importlib.resources`, `isinstance` checks and friends still recognise it) that shares the
loader's attributes. Its `get_code` transforms what the original `get_code` returned,
after that wrote its cache. A loader that runs a module without our `get_code` (pytest's
assertion rewriter compiles and execs test modules, conftests and plugins itself) has the
module's functions instrumented right after the module ran.

A finder inserted in front of ours later (pytest puts its rewriter first as it starts)
loads modules we never see: the next import that reaches us puts us first again and
catches up on the wanted modules imported meanwhile, those still running once they ended.
`uninstrumented` tells, at exit, which wanted modules still have no instrumented function.
"""

from __future__ import annotations

import copy
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ExtensionFileLoader, ModuleSpec
from types import CodeType, ModuleType
from typing import Any, TypeGuard, TypeVar

from profiler_host.instrumenter import Instrumenter, compiled_from_a_file, live_functions


class ModuleSet:
    """Modules, not kept alive where they can be weakly referenced; module-like objects
    that cannot be (cffi's `Lib`, which `cryptography` puts in sys.modules) are held, as
    sys.modules holds them for the process's life."""

    def __init__(self) -> None:
        self._weak: weakref.WeakSet[ModuleType] = weakref.WeakSet()
        self._held: set[ModuleType] = set()

    def add(self, module: ModuleType) -> None:
        try:
            self._weak.add(module)
        except TypeError:
            self._held.add(module)

    def update(self, modules: Iterable[ModuleType]) -> None:
        for module in modules:
            self.add(module)

    def __contains__(self, module: object) -> bool:
        return module in self._weak or module in self._held


class InstrumentingFinder(MetaPathFinder):
    def __init__(self, instrumenter: Instrumenter) -> None:
        self.instrumenter = instrumenter
        self._subclasses: dict[type, type] = {}
        self._handled = ModuleSet()  # ran through us
        self._swept = ModuleSet()  # there at install
        # to instrument once imported and finished (other threads add while we look)
        self._pending: dict[str, None] = {}
        self._unwrapped: dict[str, str] = {}  # module -> why its loader was left as it was
        self._catching_up = threading.Lock()
        self._asking = threading.local()  # names this thread is asking the other finders

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        meta_path = sys.meta_path
        if self._pending or not meta_path or meta_path[0] is not self:
            self._catch_up()
        if not self.instrumenter.wanted(fullname):
            return None
        return self._wrapped_spec(fullname, path, target)

    def install(self) -> None:
        """First on `sys.meta_path`; the modules imported so far are the sweep's."""
        self._swept.update(m for m in list(sys.modules.values()) if isinstance(m, ModuleType))
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def _wrapped_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        """The others' spec with our loader; a finder we ask that asks us back (it also
        delegates to the rest) is answered None, or each would ask the other forever."""
        asking = self._asking.__dict__.setdefault("names", set())
        if fullname in asking:
            return None
        asking.add(fullname)
        try:
            spec = spec_from_others(self, fullname, path, target)
        finally:
            asking.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        try:
            spec.loader = as_subclass(spec.loader, self._subclass(type(spec.loader)))
        except Exception as exc:  # the module must import all the same
            self._unwrapped[fullname] = f"its loader could not be wrapped ({exc})"
            self._pending[fullname] = None
        return spec

    def _subclass(self, base: type) -> type:
        sub = self._subclasses.get(base)
        if sub is None:
            sub = self._subclasses[base] = _instrumenting_subclass(base, self)
        return sub

    def executed(self, module: ModuleType, loader: object, codes_before: int) -> None:
        """A wanted module ran: unless its code went through our `get_code`, its
        functions are instrumented now (C extensions have none)."""
        unseen_code = self.instrumenter.codes_transformed[module.__name__] == codes_before
        if unseen_code and not isinstance(loader, ExtensionFileLoader):
            self.instrumenter.instrument_module(module)
        self._handled.add(module)

    def _catch_up(self) -> None:
        """Takes the front of `sys.meta_path` back, with the wanted modules loaded in front
        of us meanwhile, and instruments the pending modules that finished. One thread at
        a time; an import made while catching up does not catch up again."""
        if not self._catching_up.acquire(blocking=False):
            return
        try:
            meta_path = sys.meta_path
            if self in meta_path and meta_path[0] is not self:
                meta_path.remove(self)  # importlib iterates this list: the finders after
                meta_path.insert(0, self)  # us keep their places, so none is skipped
                self._pending.update(dict.fromkeys(self._missed()))
            pending = [(name, sys.modules.get(name)) for name in list(self._pending)]
            for name, module in pending:
                if not _finished(module):
                    continue
                del self._pending[name]
                self.instrumenter.instrument_module(module)
                self._handled.add(module)
        finally:
            self._catching_up.release()

    def _missed(self) -> Iterable[str]:
        """Wanted modules imported without passing through us."""
        for name, module in list(sys.modules.items()):
            unseen = isinstance(module, ModuleType) and module not in self._handled
            if unseen and module not in self._swept and self.instrumenter.wanted(name):
                yield name

    def uninstrumented(self, skip: Iterable[str] = ()) -> dict[str, str]:
        """Wanted modules that define functions of their own and have none instrumented
        (`skip` left out), each with the reason."""
        skipped = set(skip)
        candidates = {
            name: module
            for name, module in list(sys.modules.items())
            if isinstance(module, ModuleType)
            and name not in skipped
            and not self.instrumenter.instrumented_in[name]
            and self.instrumenter.wanted(name)
        }
        if not candidates:
            return {}
        defining = _namespaces_defining_functions()
        return {
            name: self._why(name, module)
            for name, module in candidates.items()
            if id(module.__dict__) in defining
        }

    def _why(self, name: str, module: ModuleType) -> str:
        if name in self._unwrapped:
            return self._unwrapped[name]
        if name in self.instrumenter.failed_modules:
            return "the rewriter failed on its functions (see the warning above)"
        loader = getattr(module, "__loader__", None)
        if name in self._pending:
            return f"loaded by {_name(loader)} in front of the import hook, never caught up with"
        if module in self._handled:
            return "none of its functions could be rewritten"
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name != name:  # `python -m NAME`: runpy's __main__
            return f"runpy ran {spec.name} as {name} (--include {spec.name} instruments it)"
        if loader is None:
            return "made without the import system (exec into a module object)"
        return f"{_name(loader)} ran it past the import hook"


def _finished(module: object) -> TypeGuard[ModuleType]:
    """Imported and done running (importlib marks a module's spec while it runs)."""
    spec = getattr(module, "__spec__", None)
    return isinstance(module, ModuleType) and not getattr(spec, "_initializing", False)


def _name(loader: object) -> str:
    """The loader's class, as importlib's own are known (not `_frozen_importlib...`)."""
    kind = loader if isinstance(loader, type) else type(loader)
    if kind.__module__.startswith("_frozen_importlib"):
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _namespaces_defining_functions() -> set[int]:
    """ids of the globals of every live function compiled from a file (one heap pass)."""
    return {id(obj.__globals__) for obj in live_functions() if compiled_from_a_file(obj.__code__)}


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


_Loader = TypeVar("_Loader")


def as_subclass(loader: _Loader, sub: type) -> _Loader:
    """An instance of `sub` (a subclass of the loader's own class) sharing the loader's
    attributes: a stateful loader (pytest's rewriter flags itself while it writes its
    cache, and its finder half reads the flag) sees one state whichever of the two runs."""
    wrapped = copy.copy(loader)
    wrapped.__class__ = sub
    if hasattr(loader, "__dict__"):
        wrapped.__dict__ = loader.__dict__
    return wrapped


def _instrumenting_subclass(base: type, finder: InstrumentingFinder) -> type:
    """`base` with `get_code` transforming and `exec_module` (or the older `load_module`)
    instrumenting after the module ran, when `get_code` did not see its code."""
    namespace: dict[str, Any] = {"__module__": base.__module__, "__slots__": ()}
    if hasattr(base, "get_code"):
        namespace["get_code"] = _transforming_get_code(base.get_code, finder.instrumenter)
    if hasattr(base, "exec_module"):
        namespace["exec_module"] = _instrumenting_exec_module(base.exec_module, finder)
    elif hasattr(base, "load_module"):
        namespace["load_module"] = _instrumenting_load_module(base.load_module, finder)
    return type(base.__name__, (base,), namespace)


def _transforming_get_code(
    original: Callable[[Any, str], CodeType | None], instrumenter: Instrumenter
) -> Callable[[Any, str], CodeType | None]:
    def get_code(self: object, fullname: str) -> CodeType | None:
        code = original(self, fullname)
        return None if code is None else instrumenter.transform_module(code, fullname)

    return get_code


def _instrumenting_exec_module(
    original: Callable[[Any, ModuleType], None], finder: InstrumentingFinder
) -> Callable[[Any, ModuleType], None]:
    def exec_module(self: object, module: ModuleType) -> None:
        before = finder.instrumenter.codes_transformed[module.__name__]
        original(self, module)
        finder.executed(module, self, before)

    return exec_module


def _instrumenting_load_module(
    original: Callable[[Any, str], ModuleType], finder: InstrumentingFinder
) -> Callable[[Any, str], ModuleType]:
    def load_module(self: object, fullname: str) -> ModuleType:
        before = finder.instrumenter.codes_transformed[fullname]
        module = original(self, fullname)
        finder.executed(module, self, before)
        return module

    return load_module
