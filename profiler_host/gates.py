"""The gates of rewritten code, and the requests in flight that open them.

Every code object the rewriter makes starts, after its first RESUME, with
`LOAD_CONST <slot>; POP_JUMP_IF_NOT_NONE <instrumented copy>`. The slot is a constant of
its own that holds None while no request in the process is sampled (the frame runs the
original instructions: an identity test, the cheapest branch CPython has) and `OPEN` while
one is. `track` registers a fresh code object's slot; `InFlight`, the list of sampled
requests in flight (`hooks.ACTIVE`), switches every tracked slot as it fills and empties.
A code object that is never tracked keeps `OPEN` and is always open, which is correct
(its enter hook declines outside a sampled request), only slower. Writing a constant of a
live code object is what `_gates.c` (or its twin here, through ctypes) does, and why it is
safe is written there.
"""

from __future__ import annotations

import dis
import sys
import threading
from collections.abc import Iterable
from types import CodeType
from typing import TYPE_CHECKING

from profiler_host import native

if TYPE_CHECKING:
    import ctypes

_NONE_HASH = hash(None)


def _switchable() -> bool:
    """Whether gates can be switched on this interpreter. One built with 3.13's
    experimental JIT copies constants into the traces it compiles, which would keep a gate
    as it was; one without the GIL reads constants while another thread writes them. On
    those no gate is switched: each stays open (correct, slower)."""
    if sys.version_info < (3, 13):
        return True
    import sysconfig  # here only: 3.11 and 3.12 have neither build

    jit = "experimental-jit" in str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    return not jit and not sysconfig.get_config_var("Py_GIL_DISABLED")


SWITCHED = _switchable()


class Open:
    """What an open gate's slot holds. It hashes as None, so a code object's hash stays
    the same whichever the slot holds, and it pickles as None (code pickled by value, as
    cloudpickle and dill do, loads with a gate closed for good)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return _NONE_HASH

    def __reduce__(self) -> tuple:
        return (type(None), ())

    def __repr__(self) -> str:
        return "<request-profiler gate: open>"


OPEN = Open()


def index(code: CodeType) -> int | None:
    """Where the gate of `code` (made by the rewriter) reads its slot: the constant the
    first LOAD_CONST after the first RESUME loads; None when it has no such gate."""
    seen_resume = False
    for instr in dis.get_instructions(code):
        if not seen_resume:
            seen_resume = instr.opname == "RESUME"
        elif instr.opname != "EXTENDED_ARG":
            return instr.arg if instr.opname == "LOAD_CONST" else None
    return None


def gated(code: CodeType) -> bool:
    """Whether `code` has a gate the requests in flight switch (or will once tracked)."""
    position = index(code)
    return position is not None and code.co_consts[position] in (None, OPEN)


class _PythonSlots:
    """The twin of `_gates.c` for a host without its C extensions: the same slots, each
    written through a ctypes pointer at its tuple item. A switch only moves pointers: each
    slot holds a reference to None and one to OPEN from the start (one of them taken at
    `track`), and whichever it does not hold stays referenced for good, which costs
    nothing, as both live as long as the process."""

    _ITEMS = tuple.__basicsize__  # offset of a tuple's first item

    def __init__(self) -> None:
        import ctypes  # here only: a host with the C extension never loads it (3 ms)

        self._pointer_at = ctypes.c_void_p.from_address
        self._word = ctypes.sizeof(ctypes.c_void_p)
        # a prototype of our own: setting argtypes on pythonapi's would change it for all
        self._incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
        self._slots: list[tuple[tuple, ctypes.c_void_p]] = []
        self._lock = threading.Lock()  # a slot tracked while a switch runs is not lost
        self._open = False
        self._value: object = None

    def configure(self, value: object) -> None:
        self._value = value

    def track(self, code: CodeType, position: int, /) -> None:
        if not isinstance(code, CodeType) or not 0 <= position < len(code.co_consts):
            raise TypeError("track(code, index)")
        consts = code.co_consts
        if consts[position] is not self._value:
            raise ValueError("the slot does not hold gates.OPEN")
        self._incref(None)
        pointer = self._pointer_at(id(consts) + self._ITEMS + position * self._word)
        with self._lock:
            self._slots.append((consts, pointer))
            pointer.value = id(self._value if self._open else None)

    def switch(self, is_open: bool, /) -> None:
        with self._lock:
            self._open = bool(is_open)
            # a tuple nothing else holds counts this list's pair and the call's argument
            self._slots = [slot for slot in self._slots if sys.getrefcount(slot[0]) > 2]
            target = id(self._value if self._open else None)
            for _, pointer in self._slots:
                pointer.value = target

    def forget(self) -> None:
        self.switch(True)
        with self._lock:
            self._slots = []
            self._open = False

    def tracked(self) -> int:
        return len(self._slots)


_slots = native.extension("_gates") or _PythonSlots()
_slots.configure(OPEN)
tracked = _slots.tracked
# as the profiler stops: every gate open for good (correct, as an untracked one), nothing held
forget = _slots.forget


def track(code: CodeType) -> None:
    """Switches the gate of `code`, fresh from the rewriter or the code cache, with the
    requests in flight from now on. Its slot is the one constant that is `OPEN` (found by
    identity: a code cache's warm start tracks thousands); a gate the rewriter was given
    another constant for stays as it is."""
    if not SWITCHED:
        return
    for position, const in enumerate(code.co_consts):
        if const is OPEN:
            _slots.track(code, position)
            return


class InFlight(list):
    """The sampled requests in flight (one list per process, `hooks.ACTIVE`). While there
    is one, every tracked gate is open: the change that fills the list opens them all, the
    one that empties it closes them. The C hot path reads its length."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # list's is None

    def append(self, request: object) -> None:
        super().append(request)
        if len(self) == 1:
            _slots.switch(True)

    def extend(self, requests: Iterable[object]) -> None:
        was_empty = not self
        super().extend(requests)
        if was_empty and self:
            _slots.switch(True)

    def remove(self, request: object) -> None:
        super().remove(request)
        if not self:
            _slots.switch(False)

    def clear(self) -> None:
        super().clear()
        _slots.switch(False)
