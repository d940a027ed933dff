"""Injects enter/exit/suspend/resume hooks into code objects (CPython 3.11 to 3.13).

A rewritten code object holds its body twice, behind a gate after the first RESUME (so
generators and coroutines enter on first resume): the original instructions, which run
while no request in the process is sampled (the gate, a constant of its own that `gates`
switches, holds None: two instructions, an identity test, no name lookup, no call,
nothing at returns or yields), and an instrumented copy. A frame that takes the copy
keeps a *token* at the bottom of its value stack, what the enter hook returned; every
return, every yield, every resume after a yield and a catch-all exception handler hand it
to a hook. A frame whose context holds no sampled lane, or whose enter hook declines, goes
back to the original copy. See docs/host.md for why each step is where it is; `stackdepth`
and `codetables` re-check every result, and a code object that fails keeps its original.

What differs between versions (the gate, a call, a return, opargs around yields) is this
interpreter's `layouts.LAYOUT`; everything here is written against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from bytecode import Bytecode, ConcreteBytecode, Instr, Label, TryBegin, TryEnd
from bytecode.concrete import _ConvertBytecodeToConcrete
from bytecode.instr import InstrLocation

from profiler_host import codetables, gates, stackdepth
from profiler_host.layouts import LAYOUT, Layout
from profiler_host.layouts.base import RESUME_AFTER_YIELD, RESUME_AT_START

CO_OPTIMIZED = 0x1
CO_VARARGS = 0x4
CO_VARKEYWORDS = 0x8
CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ITERABLE_COROUTINE = 0x100
CO_ASYNC_GENERATOR = 0x200
RESUMABLE = CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR

COMPREHENSIONS = frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"})

_NO_LINE = InstrLocation(None, None, None, None)


@dataclass(frozen=True)
class Hooks:
    """What injected code calls. Each is loaded as a constant: no names are added."""

    gate: object  # the gate's constant: gates.OPEN, switched (None: closed for good)
    enter: Callable[[int], Any]  # function id -> token, or None outside a sampled request
    enter_resumable: Callable[[int], Any]  # same, for generators and coroutines
    exit: Callable[[Any], None]
    exit_resumable: Callable[[Any], None]  # same, for generators and coroutines
    exit_exception: Callable[[Any, BaseException], None]
    suspend: Callable[[Any], None]  # before a plain yield
    resume: Callable[[Any], None]  # after a plain yield
    resume_delegated: Callable[[Any], None]  # after a yield from / await gave control away
    thrown: Callable[[Any], None]  # an exception handler of a generator or coroutine starts


class FunctionId(int):
    """The function-id constant: its own type, so it never shares a co_consts slot with an
    equal user constant (the code cache replaces it by position). Pickles as a plain int."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (int, (int(self),))


class NotInstrumentable(Exception):
    """The code object is left as it is (a reason, not a failure)."""


def instrumentable(code: CodeType) -> bool:
    """Functions, methods, lambdas, generators and coroutines; not module/class bodies or
    comprehensions (inlined on 3.12, and they would add a node per comprehension)."""
    return bool(code.co_flags & CO_OPTIMIZED) and code.co_name not in COMPREHENSIONS


def rewrite(code: CodeType, function_id: int, hooks: Hooks) -> CodeType:
    """The instrumented twin of one code object (nested code objects are not touched)."""
    if LAYOUT is None:
        raise NotInstrumentable("no bytecode layout for this Python version")
    if not instrumentable(code):
        raise NotInstrumentable(f"{code.co_name} is not a function body")
    before = stackdepth.depths(code)
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    resumable = bool(code.co_flags & RESUMABLE)
    fid = FunctionId(function_id)
    _Injector(LAYOUT, bc, hooks, fid, resumable, _depth_by_position(code, before)).run()
    return _checked(_to_code(bc, code, stacksize=code.co_stacksize + 8))


def _checked(code: CodeType) -> CodeType:
    """`code` once its tables and depths hold, with the stack size its depths need, its
    gate switched with the requests in flight from now on."""
    codetables.check(code)
    stackdepth.check(code)
    checked = code.replace(co_stacksize=max(stackdepth.depths(code).values()))
    gates.track(checked)
    return checked


def forwarding(code: CodeType, target: Callable, gate: object) -> CodeType:
    """A plain function's code behind `gate`: while the gate is closed the function runs
    its own body, as it was; while it is open it returns `target(...)` called with the
    arguments it was given, as they were passed (positional ones, `*args`, keyword-only
    ones by name, `**kwargs`). The propagation patches put this in place of a Python
    method's code instead of replacing the method on its class (see `propagation`)."""
    if LAYOUT is None:
        raise NotInstrumentable("no bytecode layout for this Python version")
    if not instrumentable(code) or code.co_flags & RESUMABLE:
        raise NotInstrumentable(f"{code.co_name} is not a plain function body")
    arguments = _argument_names(code)
    if set(arguments) & set(code.co_cellvars):
        raise NotInstrumentable(f"{code.co_name}: an argument is a cell")
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    items = list(bc)
    start = _entry_index(LAYOUT, items)
    forward = Label()
    gate_instrs = LAYOUT.gate(gate, forward, _NO_LINE)
    bc[:] = [*items[: start + 1], *gate_instrs, *items[start + 1 :], forward]
    bc.extend(_forwarding_call(LAYOUT, code, arguments, target))
    return _checked(_to_code(bc, code, stacksize=code.co_stacksize + len(arguments) + 4))


def _argument_names(code: CodeType) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & CO_VARARGS) + bool(code.co_flags & CO_VARKEYWORDS)
    return code.co_varnames[:count]


def _forwarding_call(
    layout: Layout, code: CodeType, arguments: tuple[str, ...], target: Callable
) -> list:
    """`return target(<the arguments>)` in this interpreter's bytecode, compiled from
    source (the call sequence differs per version), on the function's first line. With
    `*args` and `**kwargs` empty the call names the rest alone, which CPython makes without
    building a tuple and a dict (asyncio's `call_soon` mostly gets no `*args`). The
    arguments are let go of as it returns or raises, as asyncio's `Handle._run` lets go of
    its handle: a frame kept by a traceback keeps no cycle through them."""
    positional = list(arguments[: code.co_argcount])
    keyword = [f"{n}={n}" for n in arguments[code.co_argcount :][: code.co_kwonlyargcount]]
    rest = list(arguments[code.co_argcount + code.co_kwonlyargcount :])
    starred = rest[:1] if code.co_flags & CO_VARARGS else []
    double = rest[len(starred) :]
    name = "_target"
    while name in arguments:
        name += "_"
    spread = [*positional, *("*" + n for n in starred), *keyword, *("**" + n for n in double)]
    call = f"return {name}({', '.join(spread)})"
    if starred or double:
        call = (
            f"if {' or '.join(starred + double)}:\n   {call}\n"
            f"  return {name}({', '.join(positional + keyword)})"
        )
    body = f" {call}\n"
    if arguments:
        body = f" try:\n  {call}\n finally:\n  {' = '.join(arguments)} = None\n"
    module = compile(f"def _({', '.join(arguments)}):\n{body}", "<forward>", "exec")
    stub = next(c for c in module.co_consts if isinstance(c, CodeType))
    items = list(Bytecode.from_code(stub, conserve_exception_block_stackdepth=True))
    location = InstrLocation(code.co_firstlineno, code.co_firstlineno, None, None)
    out: list = []
    for item in items[_entry_index(layout, items) + 1 :]:
        if isinstance(item, Instr) and item.name == "LOAD_GLOBAL":
            out.extend(layout.push_callable(target, location))
            continue
        if isinstance(item, Instr):
            item.location = location
        out.append(item)
    return out


def _depth_by_position(code: CodeType, by_offset: dict[int, int]) -> list[int | None]:
    """Depths in the order `bytecode` lists real instructions (no CACHE/EXTENDED_ARG)."""
    import dis

    return [
        by_offset.get(ins.offset)
        for ins in dis.get_instructions(code)
        if ins.opname not in ("EXTENDED_ARG", "CACHE")
    ]


class _Injector:
    """Builds the two copies of the body behind the gate: the original, as it was, and the
    instrumented one with the token at the bottom of the stack."""

    def __init__(
        self,
        layout: Layout,
        bc: Bytecode,
        hooks: Hooks,
        fid: int,
        resumable: bool,
        depths: list[int | None],
    ) -> None:
        self.layout = layout
        self.bc = bc
        self.hooks = hooks
        self.fid = fid
        self.resumable = resumable
        self.depths = depths
        # (item, covered): covered items get the catch-all handler unless a user entry has them
        self.out: list[tuple[Any, bool]] = []

    def run(self) -> None:
        layout = self.layout
        items = list(self.bc)
        start = _entry_index(layout, items)
        prologue, body = items[: start + 1], items[start + 1 :]
        position = sum(isinstance(item, Instr) for item in prologue) - 1
        plain, instrumented = Label(), Label()
        self._entry(plain, instrumented)
        copy = _clone(body, _open_entries(prologue))
        handlers = _handler_depths(copy) if self.resumable else {}
        previous: Any = items[start]
        for n, item in enumerate(copy):
            if not isinstance(item, Instr):
                self.out.append((item, True))
                if id(item) in handlers:
                    location = _next_location(copy, n)
                    self._hook_call(self.hooks.thrown, handlers[id(item)], location, True)
                continue
            position += 1
            depth = self.depths[position]
            item = layout.in_instrumented_copy(item)
            if layout.is_return(item):
                self._exit_on_return(item, depth)
            elif item.name == "YIELD_VALUE" and _plain_yield(previous):
                self._hook_call(self.hooks.suspend, depth, item.location, covered=True)
                self.out.append((item, True))
            else:
                self.out.append((item, True))
            if item.name == "RESUME" and depth is not None:
                hook = self.hooks.resume
                if layout.resume_kind(item) != RESUME_AFTER_YIELD:
                    hook = self.hooks.resume_delegated
                self._hook_call(hook, depth, _next_location(copy, n), covered=True)
            previous = item
        self._handler()
        gate = [*layout.gate(self.hooks.gate, instrumented, _NO_LINE), plain]
        self.bc[:] = [*prologue, *gate, *body, *_with_catch_all(self.out)]

    def _emit(self, covered: bool, *instrs: Any) -> None:
        self.out.extend((ins, covered) for ins in instrs)

    def _entry(self, plain: Label, instrumented: Label) -> None:
        """The open gate: enter(id) pushes the token and the instrumented copy runs; outside
        a sampled request, or with no token, the frame goes back to the original. One hook
        call: enter reads the context's lane itself."""
        h, layout = self.hooks, self.layout
        body = Label()
        loc = _NO_LINE
        self._emit(
            False,
            instrumented,
            *layout.push_callable(h.enter_resumable if self.resumable else h.enter, loc),
            Instr("LOAD_CONST", self.fid, location=loc),
            *layout.call(1, loc),
            Instr("COPY", 1, location=loc),
            layout.jump_if_not_none(body, loc),
            Instr("POP_TOP", location=loc),
            Instr("JUMP_BACKWARD", plain, location=loc),
            body,
        )

    def _hook_call(self, hook: Callable, depth: int | None, location: Any, covered: bool) -> None:
        """hook(token); the stack is left as it was."""
        if depth is None:
            raise NotInstrumentable("unreachable yield or return")
        self._emit(
            covered,
            *self.layout.push_callable(hook, location),
            Instr("COPY", depth + 3, location=location),  # the token, under `depth` values
            *self.layout.call(1, location),
            Instr("POP_TOP", location=location),
        )

    def _exit_on_return(self, ret: Instr, depth: int | None) -> None:
        """[token, value] -> exit(token) -> [value] -> return. The hook call carries the
        return's line.

        Not covered by the catch-all: a BaseException from the exit hook must not also
        record an exit by exception.
        """
        hook = self.hooks.exit_resumable if self.resumable else self.hooks.exit
        self._hook_call(hook, depth, ret.location, covered=False)
        self._emit(False, *self.layout.drop_token_and_return(ret))

    def _handler(self) -> None:
        """Catch-all target: [token, lasti, exc] -> exit_exception(token, exc) -> re-raise
        with the original lasti, so tracebacks keep the instruction that raised."""
        loc = _NO_LINE
        self._emit(
            False,
            _CATCH_ALL,
            *self.layout.push_callable(self.hooks.exit_exception, loc),
            Instr("COPY", 5, location=loc),  # token
            Instr("COPY", 4, location=loc),  # exception
            *self.layout.call(2, loc),
            Instr("POP_TOP", location=loc),
            Instr("RERAISE", 1, location=loc),
        )


_CATCH_ALL = Label()  # placeholder replaced per code object in _with_catch_all


def _entry_index(layout: Layout, items: list) -> int:
    """Where the frame starts running: its first RESUME (after a generator's creation)."""
    for n, item in enumerate(items):
        if (
            isinstance(item, Instr)
            and item.name == "RESUME"
            and layout.resume_kind(item) == RESUME_AT_START
        ):
            return n
    raise NotInstrumentable("no RESUME at the start found")


def _open_entries(prologue: list) -> list[TryBegin]:
    """Exception-table entries the body starts inside (from 3.12 the implicit handler of a
    generator or coroutine covers its first RESUME)."""
    open_: dict[int, TryBegin] = {}
    for item in prologue:
        if isinstance(item, TryBegin):
            open_[id(item)] = item
        elif isinstance(item, TryEnd):
            open_.pop(id(item.entry), None)
    return list(open_.values())


def _clone(items: list, open_entries: list[TryBegin]) -> list:
    """The instructions again, with their own labels and exception-table entries; entries
    open where `items` start are opened again at the copy's start."""
    labels: dict[int, Label] = {}
    entries: dict[int, TryBegin] = {}

    def label(old: object) -> Label:
        return labels.setdefault(id(old), Label())

    def begin(old: TryBegin) -> TryBegin:
        entries[id(old)] = TryBegin(label(old.target), old.push_lasti, old.stack_depth)
        return entries[id(old)]

    copy: list[Any] = [begin(entry) for entry in open_entries]
    for item in items:
        if isinstance(item, Label):
            copy.append(label(item))
        elif isinstance(item, TryBegin):
            copy.append(begin(item))
        elif isinstance(item, TryEnd):
            copy.append(TryEnd(entries[id(item.entry)]))
        elif isinstance(item, Instr):
            twin = item.copy()
            if isinstance(twin.arg, Label):
                twin.arg = label(twin.arg)
            copy.append(twin)
        else:
            raise NotInstrumentable(f"unexpected {type(item).__name__} in the instruction list")
    return _without_empty_entries(copy)


def _without_empty_entries(items: list) -> list:
    """`items` less the entries around no instruction (an entry opened again at the copy's
    start that the original closes right after its first RESUME): a table entry may not be
    empty."""
    kept: list[Any] = []
    empty: dict[int, int] = {}  # id(TryBegin) -> its place in `kept`, while no Instr follows
    for item in items:
        if isinstance(item, Instr):
            empty.clear()
        elif isinstance(item, TryBegin):
            empty[id(item)] = len(kept)
        elif isinstance(item, TryEnd) and id(item.entry) in empty:
            kept[empty.pop(id(item.entry))] = None
            continue
        kept.append(item)
    return [item for item in kept if item is not None]


def _handler_depths(items: list) -> dict[int, int]:
    """id(handler label) -> the stack depth its handler starts with (below the token).

    A generator or coroutine suspended at a yield resumes with no hook when an exception is
    thrown in (`throw()`, `athrow()`, `close()`, a cancelled await): a handler that catches
    it runs (and calls) before any other hook of the frame, so each handler starts with the
    `thrown` hook, which records the resume then (nothing when the frame was running)."""
    return {
        id(item.target): item.stack_depth + int(item.push_lasti) + 1
        for item in items
        if isinstance(item, TryBegin)
    }


def _plain_yield(previous: Any) -> bool:
    """A yield not fed by SEND (yield from / await): nothing may stand between those two."""
    return not (isinstance(previous, Instr) and previous.name == "SEND")


def _next_location(items: list, n: int) -> Any:
    for item in items[n + 1 :]:
        if isinstance(item, Instr):
            return item.location
    return _NO_LINE


def _with_catch_all(out: list[tuple[Any, bool]]) -> list[Any]:
    """Wraps every covered run of instructions that no user entry covers in our own entry.

    Exception-table entries cannot nest (3.11 to 3.13), so instead of one try/finally
    around the body the gaps between user entries get the catch-all, and user entries keep
    one more value (the token) on the stack.
    """
    handler = Label()
    result: list[Any] = []
    open_user: set[int] = set()  # user entries open at this point of the list
    ours: TryBegin | None = None
    for item, covered in out:
        if item is _CATCH_ALL:
            item = handler
        if isinstance(item, TryBegin):
            if ours is not None:
                result.append(TryEnd(ours))
                ours = None
            item.stack_depth += 1
            open_user.add(id(item))
            result.append(item)
            continue
        if isinstance(item, TryEnd):
            open_user.discard(id(item.entry))
            result.append(item)
            continue
        if isinstance(item, Instr):
            want = covered and not open_user
            if want and ours is None:
                ours = TryBegin(handler, push_lasti=True, stack_depth=1)
                result.append(ours)
            elif not want and ours is not None:
                result.append(TryEnd(ours))
                ours = None
        result.append(item)
    if ours is not None:
        result.append(TryEnd(ours))
    return result


class _KeepTables(_ConvertBytecodeToConcrete):
    """Keeps the original co_consts/co_names/co_varnames order; new entries go last.

    `locals()` order, `co_consts[i]` and `inspect.getclosurevars` would otherwise change.
    """

    def __init__(self, code: Bytecode, original: CodeType) -> None:
        super().__init__(code)
        for const in original.co_consts:
            self.add_const(const)
        for name in original.co_names:
            self.add_name(name)
        for name in original.co_varnames:
            self.add_varname(name)


class _Locations(ConcreteBytecode):
    """Writes the location table with `codetables.location_entry` (see there why)."""

    def _pack_location(
        self, buf: bytearray, size: int, lineno: int, location: InstrLocation | None
    ) -> None:
        line: int | None
        if location is None:  # bytecode's convention: the previous entry's line
            line, end_line, column, end_column = lineno, None, None, None
        else:
            line, end_line = location.lineno, location.end_lineno
            column, end_column = location.col_offset, location.end_col_offset
        delta = 0 if line is None else line - lineno
        buf.extend(
            codetables.location_entry(min(size, 8), delta, end_line, column, end_column, line)
        )


def _to_code(bc: Bytecode, original: CodeType, stacksize: int) -> CodeType:
    concrete: ConcreteBytecode = _KeepTables(bc, original).to_concrete_bytecode(
        compute_exception_stack_depths=False
    )
    concrete.__class__ = _Locations
    code = concrete.to_code(stacksize=stacksize, compute_exception_stack_depths=False)
    for table in ("co_consts", "co_names", "co_varnames", "co_cellvars", "co_freevars"):
        kept = getattr(original, table)
        if getattr(code, table)[: len(kept)] != kept:
            raise NotInstrumentable(f"{table} would change order")
    return code
