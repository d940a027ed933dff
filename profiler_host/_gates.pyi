"""Types of `profiler_host._gates` (`_gates.c`): the slots of rewritten code's gates,
switched all at once (twin: `gates._PythonSlots`)."""

from types import CodeType

def configure(open_value: object, /) -> None:
    """The object an open slot holds (`gates.OPEN`)."""

def track(code: CodeType, index: int, /) -> None:
    """`code.co_consts[index]`, which holds the open value, switched from now on."""

def switch(is_open: bool, /) -> None:
    """Every slot open or closed; the slots of code objects that are gone are forgotten."""

def forget() -> None:
    """Every slot opened for good and let go of (the profiler stops)."""

def tracked() -> int:
    """How many slots are switched."""
