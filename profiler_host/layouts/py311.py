"""CPython 3.11: PRECALL before CALL, jumps by direction, RETURN_VALUE only.

A call's stack is [NULL, callable, args...] (PUSH_NULL first), and conditional jumps name
their direction (POP_JUMP_FORWARD_IF_*): the gate and the entry code jump forward. The
opargs of YIELD_VALUE (stack depth) and RESUME (where it resumes) say nothing about
exception handlers, so the instrumented copy keeps them.
"""

from __future__ import annotations

from typing import Any, cast

from bytecode import Instr, Label
from bytecode.instr import InstrLocation

from profiler_host.layouts.base import Layout, int_arg


class Py311(Layout):
    version = (3, 11)

    def gate(self, gate: object, instrumented: Label, location: InstrLocation) -> list[Instr]:
        return [
            Instr("LOAD_CONST", cast(Any, gate), location=location),
            Instr("POP_JUMP_FORWARD_IF_NOT_NONE", instrumented, location=location),
        ]

    def push_callable(self, function: Any, location: InstrLocation) -> list[Instr]:
        return [
            Instr("PUSH_NULL", location=location),
            Instr("LOAD_CONST", function, location=location),
        ]

    def call(self, nargs: int, location: InstrLocation) -> list[Instr]:
        return [Instr("PRECALL", nargs, location=location), Instr("CALL", nargs, location=location)]

    def jump_if_not_none(self, target: Label, location: InstrLocation) -> Instr:
        return Instr("POP_JUMP_FORWARD_IF_NOT_NONE", target, location=location)

    def is_return(self, instr: Instr) -> bool:
        return instr.name == "RETURN_VALUE"

    def drop_token_and_return(self, ret: Instr) -> list[Instr]:
        return [
            Instr("SWAP", 2, location=ret.location),
            Instr("POP_TOP", location=ret.location),
            ret,
        ]

    def resume_kind(self, resume: Instr) -> int:
        return int_arg(resume)

    def in_instrumented_copy(self, instr: Instr) -> Instr:
        return instr


LAYOUT = Py311()
