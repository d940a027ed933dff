"""Turns the code of matching modules into instrumented code, and back.

`transform` works on a module's code object before it runs (the import hook) and on the
code of live functions (modules imported before the profiler started: their functions
get their `__code__` swapped). Both go through one cache, so a code object shared by
many closures is rewritten once, and `uninstrument` can restore every original.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections import Counter
from collections.abc import Callable
from types import CodeType, FunctionType, ModuleType

from profiler_host import rewriter
from profiler_host.codecache import CodeCache
from profiler_host.functions import FunctionRegistry
from profiler_host.hooks import HOOKS
from profiler_host.native import extension

log = logging.getLogger("profiler_host")


def _set_code_in_python(function: FunctionType, code: CodeType) -> None:
    """Without the C module: on 3.13 the function's calls no longer specialise."""
    function.__code__ = code


_codeswap = extension("_codeswap")
# 3.13 resets a function's version when its code is set, and calls of a function with no
# version never specialise: the C module gives it the new code's version (`_codeswap.c`)
set_code = _set_code_in_python if _codeswap is None else _codeswap.set_code


def _live_functions_in_python(namespace: dict[str, object] | None = None) -> list[FunctionType]:
    """Without the C module: a thread that builds a tuple from an iterator while this
    walks the heap can fail with SystemError (see `_codeswap.c`)."""
    if namespace is None:
        return [obj for obj in gc.get_objects() if type(obj) is FunctionType]
    return [
        obj
        for obj in gc.get_referrers(namespace)
        if type(obj) is FunctionType and obj.__globals__ is namespace
    ]


# the live functions (of a module's globals), found in one heap pass that no other thread
# sees (`_codeswap.c`)
live_functions = _live_functions_in_python if _codeswap is None else _codeswap.live_functions


class Instrumenter:
    def __init__(
        self,
        wanted: Callable[[str], bool],
        registry: FunctionRegistry,
        hooks: rewriter.Hooks = HOOKS,
        cache: CodeCache | None = None,
    ) -> None:
        self.wanted = wanted
        self.registry = registry
        self.hooks = hooks
        self.cache = cache
        self._lock = threading.RLock()
        self._twins: dict[int, tuple[CodeType, CodeType]] = {}  # id(original) -> both
        self._originals: dict[int, CodeType] = {}  # id(instrumented) -> original
        self.failed_modules: set[str] = set()
        self.functions_instrumented = 0
        self.instrumented_in: Counter[str] = Counter()  # functions instrumented per module
        self.codes_transformed: Counter[str] = Counter()  # module codes that went through us
        self.failures = 0

    def is_instrumented(self, code: CodeType) -> bool:
        return id(code) in self._originals

    def transform(self, code: CodeType, module: str) -> CodeType:
        """The instrumented twin of `code` and of every code object nested in it."""
        with self._lock:
            return self._transform(code, module)

    def transform_module(self, code: CodeType, module: str) -> CodeType:
        """`transform` for a whole module's code, through the disk cache when there is one."""
        with self._lock:
            self.codes_transformed[module] += 1
            if self.cache is None:
                return self._transform(code, module)
            hit = self.cache.load(module, code, lambda c: self._register(module, c))
            if hit is not None:
                instrumented, pairs = hit
                for original, twin in pairs:
                    self._twins[id(original)] = (original, twin)
                    self._originals[id(twin)] = original
                return instrumented
            result = self._transform(code, module)
            self.cache.store(module, code, result)
            return result

    def _register(self, module: str, code: CodeType) -> int:
        self._count(module)
        return self.registry.register(module, code)

    def _count(self, module: str) -> None:
        self.functions_instrumented += 1
        self.instrumented_in[module] += 1

    def _transform(self, code: CodeType, module: str) -> CodeType:
        if id(code) in self._originals:
            return code
        known = self._twins.get(id(code))
        if known is not None:
            return known[1]
        consts = tuple(
            self._transform(c, module) if isinstance(c, CodeType) else c for c in code.co_consts
        )
        base = code
        if any(new is not old for new, old in zip(consts, code.co_consts, strict=True)):
            base = code.replace(co_consts=consts)
        result = base
        if rewriter.instrumentable(base):
            result = self._rewrite(base, module)
        self._twins[id(code)] = (code, result)
        if result is not code:
            self._originals[id(result)] = code
        return result

    def _rewrite(self, code: CodeType, module: str) -> CodeType:
        try:
            new = rewriter.rewrite(code, self.registry.register(module, code), self.hooks)
        except rewriter.NotInstrumentable:
            return code
        except Exception:
            self.failures += 1
            if module not in self.failed_modules:
                self.failed_modules.add(module)
                log.warning(
                    "request-profiler: left %s.%s uninstrumented (further failures in this "
                    "module are not logged)",
                    module,
                    code.co_qualname,
                    exc_info=True,
                )
            return code
        self._count(module)
        return new

    def sweep(self) -> int:
        """Swaps the code of live functions of wanted modules; returns how many."""
        swapped = 0
        for obj in live_functions():
            module = obj.__module__
            if isinstance(module, str) and self.wanted(module):
                swapped += self._swap(obj, module)
        return swapped

    def instrument_module(self, module: ModuleType) -> int:
        """Swaps the code of the functions `module` defined, after it ran (its loader ran
        code that never passed `transform_module`); returns how many. The functions are
        found through the module's globals, one heap pass in C: closures and decorated
        functions kept anywhere are found too."""
        namespace = module.__dict__
        swapped = 0
        for obj in live_functions(namespace):
            if compiled_from_a_file(obj.__code__):
                swapped += self._swap(obj, module.__name__)
        return swapped

    def _swap(self, function: FunctionType, module: str) -> int:
        code = function.__code__
        new = self.transform(code, module)
        if new is code:
            return 0
        set_code(function, new)
        return 1

    def uninstrument(self) -> int:
        """Puts the original code back into every live function that has ours."""
        restored = 0
        with self._lock:
            originals = self._originals
            for obj in live_functions():
                if id(obj.__code__) in originals:
                    # the original's nested code objects are originals too
                    set_code(obj, originals[id(obj.__code__)])
                    restored += 1
        return restored


def compiled_from_a_file(code: CodeType) -> bool:
    """Not generated from a string (dataclasses' `__init__`, attrs' methods: `<string>`,
    `<attrs generated init ...>`), which a module's own code never holds either."""
    return not code.co_filename.startswith("<")
