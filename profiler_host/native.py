"""Which of the host's C extensions are used: each one that is built, unless
`PROFILER_PURE_PYTHON=1` asks for the Python twins (tests run both)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def extension(name: str) -> ModuleType | None:
    """`profiler_host.<name>` when it is built and wanted, else None (its Python twin)."""
    if os.environ.get("PROFILER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(f"profiler_host.{name}")
    except ImportError:  # not built (no compiler at install time)
        return None
