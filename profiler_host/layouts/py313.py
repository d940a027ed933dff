"""CPython 3.13: the callable below NULL, exact bools for conditional jumps, RESUME's oparg
says whether `close()` may skip the frame.

- CALL takes [callable, NULL, args...]: LOAD_CONST, then PUSH_NULL.
- POP_JUMP_IF_TRUE/FALSE require an exact bool (the compiler puts TO_BOOL before them);
  POP_JUMP_IF_NONE/NOT_NONE take any object, so the gate is 3.12's.
- YIELD_VALUE's oparg only says whether it is part of a yield from/await (kept as it is);
  RESUME's oparg is where it resumes in its low two bits, and bit 2 (DEPTH1) is set after
  a yield whose only exception handler is the implicit StopIteration one. `gen.close()`
  clears such a frame without throwing GeneratorExit in (cpython#111354), so the
  instrumented copy's catch-all would never record its exit: the copy clears the bit.
"""

from __future__ import annotations

from typing import Any

from bytecode import Instr
from bytecode.instr import InstrLocation

from profiler_host.layouts.base import int_arg
from profiler_host.layouts.py312 import Py312

_LOCATION_MASK = 3
_DEPTH1 = 4


class Py313(Py312):
    version = (3, 13)

    def push_callable(self, function: Any, location: InstrLocation) -> list[Instr]:
        return [
            Instr("LOAD_CONST", function, location=location),
            Instr("PUSH_NULL", location=location),
        ]

    def resume_kind(self, resume: Instr) -> int:
        return int_arg(resume) & _LOCATION_MASK

    def in_instrumented_copy(self, instr: Instr) -> Instr:
        if instr.name == "RESUME":
            instr.arg = int_arg(instr) & ~_DEPTH1
        return instr


LAYOUT = Py313()
