"""The bytecode layout of this interpreter, chosen once at import.

What the rewriter writes is the same on every version but for a few instruction sequences
(the gate, a hook call, a return, the opargs around a yield); each version's are one module
here, and `LAYOUT` is this interpreter's, or None on a version the host is not built and
tested for (the host then instruments nothing). A new version is one more module and one
more line in `_MODULES`.
"""

from __future__ import annotations

import importlib
import sys

from profiler_host.layouts.base import Layout

_MODULES = {(3, 11): "py311", (3, 12): "py312", (3, 13): "py313"}
SUPPORTED = tuple(_MODULES)


def for_version(version: tuple[int, int]) -> Layout | None:
    """The layout of CPython `version` (major, minor), or None when it has none."""
    name = _MODULES.get(version)
    if name is None:
        return None
    return importlib.import_module(f"{__name__}.{name}").LAYOUT


LAYOUT = for_version(sys.version_info[:2])
