"""Function ids and definitions: each instrumented code object gets one id per process."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import CodeType

from profiler_core.model import FunctionKind
from profiler_host.rewriter import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR


@dataclass(frozen=True, slots=True)
class FunctionDef:
    id: int
    module: str
    qualname: str
    file: str
    line: int
    kind: FunctionKind


def kind_of(code: CodeType) -> FunctionKind:
    if code.co_flags & CO_ASYNC_GENERATOR:
        return FunctionKind.ASYNC_GENERATOR
    if code.co_flags & CO_COROUTINE:
        return FunctionKind.COROUTINE
    if code.co_flags & CO_GENERATOR:
        return FunctionKind.GENERATOR
    return FunctionKind.FUNCTION


class FunctionRegistry:
    """Append-only list of definitions; a session sends those past its own cursor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.defs: list[FunctionDef] = []

    def register(self, module: str, code: CodeType) -> int:
        with self._lock:
            fid = len(self.defs) + 1
            self.defs.append(
                FunctionDef(
                    fid,
                    module,
                    code.co_qualname,
                    code.co_filename,
                    code.co_firstlineno,
                    kind_of(code),
                )
            )
            return fid

    def since(self, cursor: int) -> list[FunctionDef]:
        return self.defs[cursor:]
