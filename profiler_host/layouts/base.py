"""What a version's bytecode layout provides to the rewriter (see `profiler_host.rewriter`).

Every method returns fresh `bytecode.Instr` objects for the running interpreter, so a
layout is only ever used on the version it is for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, cast

from bytecode import Instr, Label
from bytecode.instr import InstrLocation

RESUME_AT_START, RESUME_AFTER_YIELD, RESUME_AFTER_YIELD_FROM, RESUME_AFTER_AWAIT = range(4)


def int_arg(instr: Instr) -> int:
    """The oparg of an instruction that takes a plain int (RESUME, YIELD_VALUE), which
    `bytecode` types as any kind of argument."""
    return cast(int, instr.arg)


class Layout(ABC):
    """The instruction sequences that differ between CPython versions."""

    version: tuple[int, int]

    @abstractmethod
    def gate(self, gate: object, instrumented: Label, location: InstrLocation) -> list[Instr]:
        """Jumps to `instrumented` unless the constant `gate` is None (see `gates`), with
        nothing left on the stack."""

    @abstractmethod
    def push_callable(self, function: Any, location: InstrLocation) -> list[Instr]:
        """Pushes `function` as the callable of a call without `self`: two stack values."""

    @abstractmethod
    def call(self, nargs: int, location: InstrLocation) -> list[Instr]:
        """Calls what `push_callable` pushed with the `nargs` values above it."""

    @abstractmethod
    def jump_if_not_none(self, target: Label, location: InstrLocation) -> Instr:
        """Pops the top of the stack; jumps forward to `target` unless it is None."""

    @abstractmethod
    def is_return(self, instr: Instr) -> bool:
        """`instr` returns from the frame."""

    @abstractmethod
    def drop_token_and_return(self, ret: Instr) -> list[Instr]:
        """`ret`, a return, with the token below what it returns popped first."""

    @abstractmethod
    def resume_kind(self, resume: Instr) -> int:
        """Where a RESUME resumes: at the start, after a yield, a yield from or an await."""

    @abstractmethod
    def in_instrumented_copy(self, instr: Instr) -> Instr:
        """`instr`, the copy's own, as the instrumented copy holds it: opargs that tell the
        interpreter which exception handlers enclose a yield count the copy's catch-all
        (see py312, py313)."""
