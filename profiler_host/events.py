"""What the hooks record and hand each other, defined once for the Python hooks and their C
twins: `_hotpath.c` includes `_events.h`, which `./dev protos` writes from this module
(`tests/test_host_events.py` checks it is current), and `recording` uses the built
extension only when the constants it was compiled with are these.

An *event* is `EVENT_INTS` ints in a lane's buffer: `function << KIND_BITS | kind`, the
call id and the monotonic ns. The kinds are the wire's (`profiler_core.model.EventKind`).

A *token* is what the enter hook leaves at the bottom of an instrumented frame's stack for
the frame's other hooks. A plain call's reads as the tuple `(lane, function << KIND_BITS,
call id)` (the C hooks' `CallToken` holds the ids as C ints); a generator's, coroutine's
or async generator's is a list that starts with the same three fields and adds
`suspended` (its SUSPEND is recorded and its RESUME not yet) and `stamp` (a call id taken
when it last started running; see `hooks`). A field has the same index in both kinds, and
no index means two things.
"""

from __future__ import annotations

from pathlib import Path

from profiler_core.model import EventKind

EVENT_INTS = 3  # ints per event in a lane's buffer
KIND_BITS = 3  # bits of an event's first int that hold its kind
KIND_MASK = (1 << KIND_BITS) - 1

ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
EXIT_EXCEPTION = int(EventKind.EXIT_EXCEPTION)
SUSPEND = int(EventKind.SUSPEND)
RESUME = int(EventKind.RESUME)
READY = int(EventKind.READY)
EXIT_CANCELLED = int(EventKind.EXIT_CANCELLED)

TOKEN_LANE = 0  # the lane the call records in
TOKEN_FK = 1  # function << KIND_BITS: an event's first int without its kind
TOKEN_CALL = 2  # the call id
PLAIN_TOKEN_SIZE = 3
TOKEN_SUSPENDED = 3  # resumable only: True from its SUSPEND to its RESUME
TOKEN_STAMP = 4  # resumable only: the call id taken when it last started running
RESUMABLE_TOKEN_SIZE = 5

# what _events.h defines and the C module exports, in this order
CONSTANTS: dict[str, int] = {
    "EVENT_INTS": EVENT_INTS,
    "KIND_BITS": KIND_BITS,
    **{kind.name: int(kind) for kind in EventKind},
    "TOKEN_LANE": TOKEN_LANE,
    "TOKEN_FK": TOKEN_FK,
    "TOKEN_CALL": TOKEN_CALL,
    "PLAIN_TOKEN_SIZE": PLAIN_TOKEN_SIZE,
    "TOKEN_SUSPENDED": TOKEN_SUSPENDED,
    "TOKEN_STAMP": TOKEN_STAMP,
    "RESUMABLE_TOKEN_SIZE": RESUMABLE_TOKEN_SIZE,
}

HEADER = Path(__file__).with_name("_events.h")


def c_header() -> str:
    """The text of `_events.h`: each constant as a macro, and the table of them that the C
    module exports (so `recording` can tell a build from other sources)."""
    lines = [
        "/* Generated from profiler_host/events.py by `./dev protos`:",
        " * edit that module, not this file (tests/test_host_events.py checks it is current). */",
        "#ifndef PROFILER_HOST_EVENTS_H",
        "#define PROFILER_HOST_EVENTS_H",
        "",
        *(f"#define {name} {value}" for name, value in CONSTANTS.items()),
        "",
        "static const struct {",
        "    const char *name;",
        "    long value;",
        "} events_constants[] = {",
        *(f'    {{"{name}", {name}}},' for name in CONSTANTS),
        "    {NULL, 0},",
        "};",
        "",
        "#endif",
    ]
    return "\n".join(lines) + "\n"


def write_header(path: Path = HEADER) -> None:
    path.write_text(c_header())
