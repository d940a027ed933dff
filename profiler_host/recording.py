"""Per-request event records: the only state the hooks touch.

One `ContextVar` (`CURRENT`) holds the current *lane* (a thread or task of a sampled
request) and nothing else: per-call state lives in the frame's token, never here.

A lane's buffer is a flat sequence of ints, three per event (`events`): the function id and
kind packed (`function << KIND_BITS | kind`), the call id and the monotonic ns. With the C
cores it is an `_hotpath.EventBuffer`, a growable array of 64-bit ints that the C hooks
write with three stores (no int object per event, nothing for the garbage collector to
walk); the Python twin's is a list of ints, which the collector does not track either.
Hooks add an event with one `extend` (atomic under the GIL, so a signal or a drain never
splits it) and no lock; the transport drains from its own thread by reading strided
slices and deleting the first n items.

What the hooks touch lives in `RequestCore` and `LaneCore`: C types from
`profiler_host._hotpath` when it is built (the hooks then read C fields, not attributes),
else the Python classes below. `PROFILER_PURE_PYTHON=1` picks the Python ones.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from time import monotonic_ns
from typing import TYPE_CHECKING, Protocol

from profiler_core.model import MAIN_LANE, LaneKind
from profiler_host import native
from profiler_host.events import CONSTANTS, EVENT_INTS, KIND_BITS, KIND_MASK

CURRENT: ContextVar[Lane | None] = ContextVar("request_profiler_lane", default=None)


class _PyRequestCore:
    """What the hooks read and write of a request (Python twin of `_hotpath.RequestCore`)."""

    __slots__ = ("calls", "event_cap", "truncated", "unrecorded")

    def __init__(self, event_cap: int) -> None:
        self.event_cap = event_cap
        self.truncated = False
        self.unrecorded = 0  # calls entered past the cap (they ran their original code)
        self.calls: Iterator[int] = itertools.count(1)  # request-wide call ids; next() is atomic


class _PyLaneCore:
    """What the hooks read and write of a lane (Python twin of `_hotpath.LaneCore`)."""

    __slots__ = ("buffer", "record", "request", "thread")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.thread = threading.get_ident()
        self.buffer: list[int] = []
        # record((function << KIND_BITS | kind, call, ns))
        self.record: Callable[[tuple[int, int, int]], None] = self.buffer.extend


def _cores() -> tuple[type, type, str]:
    _hotpath = native.extension("_hotpath")
    if _hotpath is None:
        return _PyRequestCore, _PyLaneCore, "python"
    built_for = {name: getattr(_hotpath, name, None) for name in CONSTANTS}
    if built_for != CONSTANTS:
        return _PyRequestCore, _PyLaneCore, "python"  # built from other sources: stale
    return _hotpath.RequestCore, _hotpath.LaneCore, "c"


if TYPE_CHECKING:  # the C cores have the Python twins' fields (_hotpath.pyi)
    import asyncio

    from profiler_host._hotpath import EventBuffer

    Buffer = list[int] | EventBuffer  # a lane's buffer: the Python twin's, the C cores'
    RequestCore = _PyRequestCore
    LaneCore = _PyLaneCore
    IMPLEMENTATION = "python"
else:
    RequestCore, LaneCore, IMPLEMENTATION = _cores()


def _ended(event: tuple[int, int, int]) -> None:
    """What a lane of an ended request records: nothing."""


class Request(RequestCore):
    """A sampled unit of work: an HTTP request, a job, or the whole process.

    From the core: `calls` (iterator of call ids), `event_cap`, `truncated`, `unrecorded`."""

    __slots__ = (
        "_lane_ids",
        "end_ns",
        "id",
        "lanes",
        "method",
        "route",
        "running_lanes",
        "start_ns",
        "status",
    )

    def __init__(self, request_id: int, route: str, method: str, event_cap: int) -> None:
        super().__init__(event_cap)
        self.id = request_id
        self.route = route
        self.method = method
        self.start_ns = monotonic_ns()
        self.end_ns: int | None = None
        self.status = 0
        self.lanes: list[Lane] = []
        self.running_lanes: tuple[int, ...] = ()
        self._lane_ids = itertools.count(1)  # next() is atomic: threads may spawn at once
        self._add_lane(MAIN_LANE, LaneKind.MAIN, "main", None, 0)

    @property
    def main(self) -> Lane:
        return self.lanes[0]

    def _add_lane(
        self, lane_id: int, kind: LaneKind, name: str, parent: Lane | None, parent_call: int
    ) -> Lane:
        lane = Lane(self, lane_id, kind, name, parent, parent_call)
        self.lanes.append(lane)  # list.append is atomic; the transport reads a snapshot
        return lane

    def spawn(self, parent: Lane, kind: LaneKind, name: str, parent_call: int = 0) -> Lane:
        """A new lane (thread or task) hung under `parent`'s call `parent_call`."""
        return self._add_lane(next(self._lane_ids), kind, name, parent, parent_call)

    @property
    def duration_ns(self) -> int:
        return (self.end_ns or monotonic_ns()) - self.start_ns

    def finish(self, status: int = 0) -> None:
        """Ends the request and its recording: threads, tasks and pool work that outlive
        it (a pool's worker thread started by it, a task left running) record nothing
        more into it, so it stays bounded and its events end with it."""
        self.status = status
        self.end_ns = monotonic_ns()
        self.event_cap = 0  # no new call is recorded, and none counts as lost
        # their calls still open end with the request, as running then, not as lost
        self.running_lanes = tuple(lane.id for lane in self.lanes[1:] if not lane.done)
        for lane in list(self.lanes):
            lane.record = _ended  # suspensions, resumes, exits of calls still open


def kind_of(function_kind: int) -> int:
    """The kind of an event from its first int."""
    return function_kind & KIND_MASK


Columns = tuple[bytes, list[int], list[int], list[int]]  # kinds, functions, calls, ns


def columns(buffer: Buffer, start: int, stop: int) -> Columns:
    """The wire's columns of `buffer[start:stop]`: strided slices (no copy of the whole) and
    two comprehensions (the transport's C path, `batching.PackedColumns`, makes none)."""
    packed = buffer[start:stop:EVENT_INTS]
    kinds = bytes([fk & KIND_MASK for fk in packed])
    functions = [fk >> KIND_BITS for fk in packed]
    calls = buffer[start + 1 : stop : EVENT_INTS]
    return kinds, functions, calls, buffer[start + 2 : stop : EVENT_INTS]


def _decode(buffer: Buffer, start: int) -> list[tuple[int, int, int, int]]:
    return list(zip(*columns(buffer, start, len(buffer)), strict=True))


class Lane(LaneCore):
    """One thread or task of a request; its events are in order.

    From the core: `request`, `thread` (ident), `buffer` and `record` (its `extend`)."""

    __slots__ = (
        "carried",
        "done",
        "handing_over",
        "id",
        "kind",
        "name",
        "parent",
        "parent_call",
        "start_ns",
        "task",
    )

    def __init__(
        self,
        request: Request,
        lane_id: int,
        kind: LaneKind,
        name: str,
        parent: Lane | None,
        parent_call: int,
    ) -> None:
        super().__init__(request)
        self.id = lane_id
        self.kind = kind
        self.name = name
        self.parent = parent
        self.parent_call = parent_call
        self.start_ns = monotonic_ns()
        self.carried = 0  # ints at the buffer's start that were taken already
        self.done = False  # its thread, task or pool work finished (set by propagation)
        self.handing_over = 0  # > 0 while it hands work to a pool (whose threads are no lanes)
        # the asyncio task whose steps run in it (a weak reference to it), None until one
        # does (see propagation.task_lane)
        self.task: Callable[[], asyncio.Task | None] | None = None

    def append(self, event: tuple[int, int, int, int]) -> None:
        """Records one `(kind, function, call, ns)` event (for tools and tests: the hooks
        call `record` directly)."""
        kind, function, call, ns = event
        self.record((function << KIND_BITS | kind, call, ns))

    @property
    def events(self) -> list[tuple[int, int, int, int]]:
        """The events not drained yet as `(kind, function, call, ns)`, left in place."""
        return _decode(self.buffer, self.carried)

    def drain(self) -> list[tuple[int, int, int, int]]:
        """Takes the events recorded so far as `(kind, function, call, ns)` (for tools and
        tests: the transport uses `drain_into`); events recorded meanwhile stay."""
        count = len(self.buffer)
        taken = columns(self.buffer, self.carried, count)
        self._taken(count)
        return list(zip(*taken, strict=True))

    def discard(self) -> int:
        """Forgets the events recorded so far; how many there were."""
        count = len(self.buffer)
        events = (count - self.carried) // EVENT_INTS
        self._taken(count)
        return events

    def drain_into(self, into: LaneColumns) -> None:
        """Moves the events recorded so far into a batch's columns (the transport's way: no
        columns of its own in between)."""
        count = len(self.buffer)
        into.add_buffer(self.request.id, self.id, self.buffer, self.carried, count)
        self._taken(count)

    def _taken(self, count: int) -> None:
        """Forgets the buffer's first `count` ints but the last event, which stays (marked
        taken): a frame that gives control away without a hook is suspended since the
        lane's last event, which hooks read at the end."""
        keep = min(count, EVENT_INTS)
        del self.buffer[: count - keep]
        self.carried = keep


class LaneColumns(Protocol):
    """A batch's events as `profiler_host.batching` gathers them from lane buffers."""

    def add_buffer(
        self, request_id: int, lane_id: int, buffer: Buffer, start: int, stop: int
    ) -> None: ...
