"""Which modules are instrumented: include/exclude globs over dotted module names.

A glob names modules together with everything under them, as coverage's `--source` and
ddtrace do: `--include shop` is the package `shop` and its submodules, and so is `shop.*`.
"""

from __future__ import annotations

import sys
from fnmatch import fnmatchcase

# Never instrumented: the profiler itself (its hooks would call themselves).
OWN = ("profiler_core", "profiler_host", "profiler_server")
# Instrumented only when an include glob names their top-level package literally.
PROTECTED = frozenset(sys.stdlib_module_names) | {
    "grpc",
    "google",
    "bytecode",
    "prometheus_client",
    "sqlalchemy",
    "psycopg",
    "orjson",
    "_pytest",
    "pytest",
    "pluggy",
    "pip",
    "setuptools",
    "pkg_resources",
    "_distutils_hack",
}


def parse_globs(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


class ModuleFilter:
    def __init__(self, include: tuple[str, ...], exclude: tuple[str, ...] = ()) -> None:
        self.include = include
        self.exclude = exclude
        self._known: dict[str, bool] = {}  # the import hook asks for every import

    def __call__(self, module: str) -> bool:
        known = self._known.get(module)
        if known is None:
            known = self._known[module] = self._decide(module)
        return known

    def _decide(self, module: str) -> bool:
        top = module.partition(".")[0]
        if top in OWN:
            return False
        matched = [glob for glob in self.include if _matches(glob, module)]
        if not matched or any(_matches(glob, module) for glob in self.exclude):
            return False
        if top in PROTECTED:
            return any(glob.partition(".")[0] == top for glob in matched)
        return True


def _matches(glob: str, module: str) -> bool:
    """The module or a package above it matches; `pkg.*` also matches `pkg` itself (a
    package's __init__ is part of it)."""
    parts = module.split(".")
    if any(fnmatchcase(".".join(parts[:depth]), glob) for depth in range(1, len(parts) + 1)):
        return True
    return glob.endswith(".*") and module == glob[:-2]
