"""What the server holds for a request until it can be assembled: its records and raw runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from profiler_core.model import LaneKind
from profiler_server.assembly.events import Run

# An open request without events holds about 800 bytes (this object, its sets and dicts);
# an event held about 25 (its columns in a run); a lane about 200 and its name.
REQUEST_WEIGHT = 32
EVENT_BYTES = 25
LANE_WEIGHT = 8


@dataclass(slots=True)
class LaneInfo:
    kind: LaneKind
    name: str
    parent_lane: int | None
    parent_call: int | None
    start_ns: int | None


@dataclass
class PendingRequest:
    request_id: int
    route: str = ""
    method: str = ""
    start_ns: int | None = None
    end_ns: int | None = None
    status: int | None = None
    host_truncated: bool = False
    # lanes whose thread, task or pool work still ran at the end: calls open then are cut
    # there as running, not repaired
    running_lanes: frozenset[int] = frozenset()
    end_seq: int = 0  # the batch that carried the end record
    lanes: dict[int, LaneInfo] = field(default_factory=dict)
    runs: list[tuple[int, Run]] = field(default_factory=list)  # (seq, run) in arrival order
    events: int = 0
    dropped_events: int = 0  # beyond the server's per-request cap
    lane_weight: int = 0  # its lane records, in events (see weight)
    seqs: set[int] = field(default_factory=set)  # batches holding part of it
    touched: float = 0.0  # server monotonic seconds of the last update
    session_id: str = ""  # its session's: a group's requests of many sessions assemble together

    @property
    def ended(self) -> bool:
        return self.end_ns is not None

    @property
    def weight(self) -> int:
        """Its share of --max-open-events: its events, and the request's own records and
        lane records as the events they match in memory (so starts without events count
        too, and so do lanes, names included)."""
        return self.events + REQUEST_WEIGHT + self.lane_weight

    @property
    def main_name(self) -> str:
        """The name of the request's main lane (its root node)."""
        return f"{self.method} {self.route}".strip() or f"request {self.request_id}"
