"""Types of `profiler_host._codeswap` (`_codeswap.c`): swapping a live function's code, its
calls still specialisable (twin: `instrumenter._set_code_in_python`), and finding the live
functions safely from other threads (twin: `instrumenter._live_functions_in_python`)."""

from types import CodeType, FunctionType

def set_code(function: FunctionType, code: CodeType, /) -> None:
    """`function.__code__ = code`, then the new code's version on 3.13 (see `_codeswap.c`)."""

def live_functions(namespace: dict[str, object] | None = None, /) -> list[FunctionType]:
    """The functions the garbage collector tracks (whose globals are `namespace`)."""
