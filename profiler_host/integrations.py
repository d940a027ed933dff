"""Wraps the app that gunicorn or uvicorn loads in our middleware: no change to the app.

The servers' loading modules are patched right after they are imported (a finder on
`sys.meta_path` that only answers for those names), so the wrap happens wherever the app
is loaded: in the master with `--preload`, in each worker otherwise.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from profiler_host.importer import as_subclass, spec_from_others

log = logging.getLogger("profiler_host")


def _patch_gunicorn(util: Any) -> None:  # gunicorn.util, which has no types
    original = util.import_app

    def import_app(module: str) -> Any:
        from profiler_host.wsgi import ProfilerMiddleware

        app = original(module)
        return app if isinstance(app, ProfilerMiddleware) else ProfilerMiddleware(app)

    util.import_app = import_app


def _patch_uvicorn(config: ModuleType) -> None:
    original = config.Config.load

    def load(self: Any) -> None:
        from profiler_host.asgi import ProfilerMiddleware

        original(self)  # tells the app's interface first: what it is given next is ASGI 3
        app = self.loaded_app
        if not isinstance(getattr(app, "__self__", app), ProfilerMiddleware):
            self.loaded_app = ProfilerMiddleware(app).dispatch

    config.Config.load = load


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "gunicorn.util": _patch_gunicorn,
    "uvicorn.config": _patch_uvicorn,
}
# patched right after their import too, for other parts of the host (`after_import`)
_LATER: dict[str, Callable[[ModuleType], None]] = {}


class AfterImport(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        patch = PATCHES.get(fullname) or _LATER.get(fullname)
        if patch is None:
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        base = type(spec.loader)
        original_exec = base.exec_module

        def exec_module(loader: Any, module: ModuleType) -> None:
            original_exec(loader, module)
            try:
                patch(module)
            except Exception:
                log.warning("request-profiler: could not patch %s", fullname, exc_info=True)

        sub = type(base.__name__, (base,), {"exec_module": exec_module})
        spec.loader = as_subclass(spec.loader, sub)
        return spec


def serving() -> bool:
    """A server whose apps we wrap is loaded here: this process serves requests."""
    return any(name in sys.modules for name in PATCHES)


def install() -> None:
    """Patches now if the server is imported already, else right after its import."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    _finder_in()


def after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """`patch(module)` right after module `name` is imported (which has not happened yet)."""
    _LATER[name] = patch
    _finder_in()


def _finder_in() -> None:
    if not any(isinstance(f, AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport())
