"""Per-request event records: the only state the hooks touch.

One `ContextVar` (`CURRENT`) holds the current *lane* (a thread or task of a sampled
request) and nothing else: per-call state lives in the frame's token, never here. Hooks
append `(kind, function, call, ns)` tuples to a lane's buffer without a lock; the
transport drains buffers from its own thread by slicing off the first n items, which is
safe against concurrent appends under the GIL.
"""

from __future__ import annotations

import itertools
import threading
from contextvars import ContextVar
from time import monotonic_ns

from profiler_core.model import MAIN_LANE, LaneKind

CURRENT: ContextVar[Lane | None] = ContextVar("request_profiler_lane", default=None)


class Request:
    """A sampled unit of work: an HTTP request, a job, or the whole process."""

    __slots__ = (
        "calls",
        "end_ns",
        "event_cap",
        "id",
        "lanes",
        "method",
        "route",
        "start_ns",
        "status",
        "truncated",
    )

    def __init__(self, request_id: int, route: str, method: str, event_cap: int) -> None:
        self.id = request_id
        self.route = route
        self.method = method
        self.start_ns = monotonic_ns()
        self.end_ns: int | None = None
        self.status = 0
        self.truncated = False
        self.event_cap = event_cap
        self.calls = itertools.count(1)  # request-wide call ids; next() is atomic
        self.lanes: list[Lane] = []
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
        return self._add_lane(len(self.lanes), kind, name, parent, parent_call)

    def finish(self, status: int = 0) -> None:
        self.status = status
        self.end_ns = monotonic_ns()


class Lane:
    """One thread or task of a request; its events are in order."""

    __slots__ = (
        "append",
        "events",
        "id",
        "kind",
        "name",
        "parent",
        "parent_call",
        "request",
        "start_ns",
        "thread",
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
        self.request = request
        self.id = lane_id
        self.kind = kind
        self.name = name
        self.parent = parent
        self.parent_call = parent_call
        self.start_ns = monotonic_ns()
        self.thread = threading.get_ident()
        self.events: list[tuple[int, int, int, int]] = []
        self.append = self.events.append

    def drain(self) -> list[tuple[int, int, int, int]]:
        """Takes the events recorded so far; appends racing with this stay for next time."""
        events = self.events
        count = len(events)
        taken = events[:count]
        del events[:count]
        return taken
