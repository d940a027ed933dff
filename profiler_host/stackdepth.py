"""Value-stack depth of every instruction of a code object, checked as the interpreter needs.

The rewriter uses it twice: on the original code, to know how deep the per-call token
sits under each yield; on the rewritten code, to refuse any result whose depths disagree at
a merge point, whose exception handlers would pop below the token, or whose COPY or
SWAP reaches below the stack (a handler entered with too few values does). `bytecode`'s own
depth computation is not trusted for this (see docs/host.md).
"""

from __future__ import annotations

import dis
import opcode
from types import CodeType

_UNCONDITIONAL = frozenset(
    opcode.opmap[name]
    for name in ("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
    if name in opcode.opmap
)
_TERMINAL = frozenset(
    opcode.opmap[name]
    for name in ("RETURN_VALUE", "RETURN_CONST", "RERAISE", "RAISE_VARARGS")
    if name in opcode.opmap
)
_JUMPS = frozenset(opcode.hasjrel) | frozenset(opcode.hasjabs)
# read the value `arg` deep without popping it: the depth must reach that far
_READ_DEEP = frozenset({opcode.opmap["COPY"], opcode.opmap["SWAP"]})
_SKIPPED = frozenset({opcode.opmap["EXTENDED_ARG"], opcode.opmap.get("CACHE", -1)})
# the frame resumes after it with the first value sent pushed (dis.stack_effect says 0 on
# 3.11 and 3.12, 1 from 3.13)
_RETURN_GENERATOR = opcode.opmap.get("RETURN_GENERATOR", -1)


class StackDepthError(ValueError):
    """The code's stack depths are inconsistent: running it could corrupt the frame."""


def depths(code: CodeType) -> dict[int, int]:
    """Depth before each instruction, by offset; raises StackDepthError on inconsistency."""
    instructions: list[dis.Instruction] = []
    index: dict[int, int] = {}  # offset -> position in `instructions`
    prefixes: list[int] = []  # EXTENDED_ARG offsets waiting for the instruction they extend
    for ins in dis.get_instructions(code):
        if ins.opcode in _SKIPPED:
            prefixes.append(ins.offset)  # a jump to an extended instruction lands here
            continue
        for offset in (*prefixes, ins.offset):
            index[offset] = len(instructions)
        prefixes.clear()
        instructions.append(ins)
    entries = dis._parse_exception_table(code)  # type: ignore[attr-defined]  # the only parser
    found: dict[int, int] = {}
    work: list[tuple[int, int]] = [(0, 0)]

    def reach(offset: int, depth: int) -> None:
        position = index.get(offset)
        if position is None:
            raise StackDepthError(f"no instruction at offset {offset}")
        offset = instructions[position].offset
        if depth < 0:
            raise StackDepthError(f"negative stack depth at offset {offset}")
        seen = found.get(offset)
        if seen is None:
            found[offset] = depth
            work.append((offset, depth))
        elif seen != depth:
            raise StackDepthError(f"depth {seen} and {depth} meet at offset {offset}")

    while work:
        offset, depth = work.pop()
        position = index[offset]
        ins = instructions[position]
        for entry in entries:
            if entry.start <= offset < entry.end:
                if entry.depth > depth:
                    raise StackDepthError(
                        f"handler at {entry.target} keeps {entry.depth} values but only "
                        f"{depth} are on the stack at offset {offset}"
                    )
                reach(entry.target, entry.depth + 1 + int(entry.lasti))
        op, arg = ins.opcode, ins.arg
        if op in _READ_DEEP and (arg or 0) > depth:
            raise StackDepthError(f"{ins.opname} {arg} at offset {offset}, {depth} deep")
        if op in _JUMPS:
            reach(ins.argval, depth + dis.stack_effect(op, arg, jump=True))
        if op in _UNCONDITIONAL or op in _TERMINAL:
            continue
        if op == _RETURN_GENERATOR:
            effect = 1
        else:
            effect = dis.stack_effect(op, arg if op >= dis.HAVE_ARGUMENT else None, jump=False)
        if position + 1 < len(instructions):
            reach(instructions[position + 1].offset, depth + effect)
    return found


def check(code: CodeType) -> None:
    """Raises StackDepthError unless every reachable depth fits co_stacksize."""
    deepest = max(depths(code).values(), default=0)
    if deepest > code.co_stacksize:
        raise StackDepthError(f"depth {deepest} exceeds co_stacksize {code.co_stacksize}")
