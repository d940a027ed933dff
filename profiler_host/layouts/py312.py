"""CPython 3.12: no PRECALL, RETURN_CONST, jumps without direction, YIELD_VALUE's oparg
counts the exception handlers around the yield.

- CALL takes [NULL, callable, args...] as on 3.11, without PRECALL.
- `return <constant>` is one RETURN_CONST, with nothing on the stack but the token.
- POP_JUMP_IF_* jump forward (the assembler picks no direction).
- YIELD_VALUE's oparg is the depth of exception handlers around the yield, 1 meaning only
  the implicit one that turns StopIteration into RuntimeError. `gen.close()` was meant to
  clear a frame at depth 1 without throwing GeneratorExit in (cpython#100762; 3.12.1 reads
  the opcode instead and never does, cpython#111107). The instrumented copy's catch-all is
  one more handler, which must run at close() to record the exit: its yields count it.
"""

from __future__ import annotations

from typing import Any, cast

from bytecode import Instr, Label
from bytecode.instr import InstrLocation

from profiler_host.layouts.base import int_arg
from profiler_host.layouts.py311 import Py311


class Py312(Py311):
    version = (3, 12)

    def gate(self, gate: object, instrumented: Label, location: InstrLocation) -> list[Instr]:
        return [
            Instr("LOAD_CONST", cast(Any, gate), location=location),
            Instr("POP_JUMP_IF_NOT_NONE", instrumented, location=location),
        ]

    def call(self, nargs: int, location: InstrLocation) -> list[Instr]:
        return [Instr("CALL", nargs, location=location)]

    def jump_if_not_none(self, target: Label, location: InstrLocation) -> Instr:
        return Instr("POP_JUMP_IF_NOT_NONE", target, location=location)

    def is_return(self, instr: Instr) -> bool:
        return instr.name in ("RETURN_VALUE", "RETURN_CONST")

    def drop_token_and_return(self, ret: Instr) -> list[Instr]:
        """RETURN_CONST returns with the stack empty, inside the implicit handler's entry
        in generators and coroutines, whose depth the copy raises by the token: popping
        the token first would leave the stack below that depth, so the copy loads the
        constant and returns it with RETURN_VALUE."""
        if ret.name == "RETURN_CONST":
            loaded = Instr("LOAD_CONST", ret.arg, location=ret.location)
            return [
                loaded,
                *super().drop_token_and_return(Instr("RETURN_VALUE", location=ret.location)),
            ]
        return super().drop_token_and_return(ret)

    def in_instrumented_copy(self, instr: Instr) -> Instr:
        if instr.name == "YIELD_VALUE":
            instr.arg = int_arg(instr) + 1
        return instr


LAYOUT = Py312()
