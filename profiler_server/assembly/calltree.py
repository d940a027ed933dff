"""Plain records for an assembled request: lanes of call nodes (the server's frame tree)."""

from __future__ import annotations

from dataclasses import dataclass, field

from profiler_core.model import LaneKind, Outcome


class Node:
    """One call. Times are monotonic ns; `slice_start`/`suspended_at`/`ready_at` are build state."""

    __slots__ = (
        "active_ns",
        "await_ns",
        "call",
        "children",
        "end",
        "function",
        "max_slice_ns",
        "outcome",
        "parent",
        "ready_at",
        "ready_ns",
        "self_ns",
        "slice_start",
        "start",
        "suspended_at",
        "suspensions",
    )

    def __init__(self, call: int, function: int, parent: Node | None, start: int) -> None:
        self.call = call
        self.function = function
        self.parent = parent
        self.children: list[Node] = []
        self.start = start
        self.end = -1
        self.self_ns = 0
        self.active_ns = 0
        self.await_ns = 0
        self.ready_ns = 0
        self.max_slice_ns = 0
        self.suspensions = 0
        self.outcome = Outcome.RETURN
        self.slice_start = start  # -1 while suspended
        self.suspended_at = -1
        self.ready_at = -1

    @property
    def closed(self) -> bool:
        return self.end >= 0


@dataclass
class LaneTree:
    lane_id: int
    kind: LaneKind
    name: str
    root: Node  # synthetic node for the lane itself (function -1)
    parent_lane: int | None = None
    parent_call: int | None = None  # call id of the spawning node


@dataclass
class AssembledRequest:
    session_id: str
    request_id: int
    route: str
    method: str
    status: int | None
    start: int  # monotonic ns
    end: int
    truncated: bool
    events: int
    lanes: list[LaneTree] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Globally unique id: the host session's UUID plus the host's request number."""
        return f"{self.session_id}-{self.request_id}"
