"""An assembled request: its calls as columns in the order they were entered (all lanes),
plus the lanes. Columns, not node objects: a request may hold a million calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from profiler_core.model import LaneKind, Outcome

LANE_ROOT = -1  # function of a lane's synthetic root node

# Layout of CallTree.extras values (calls that suspended: generators, coroutines).
ACTIVE, AWAIT, READY, MAX_SLICE, SUSPENSIONS, SLICE_START, SUSPENDED_AT, READY_AT = range(8)
MAX_WAITS = 10_000  # suspensions kept with their times per request (all are in the totals)


@dataclass
class LaneTree:
    lane_id: int
    kind: LaneKind
    name: str
    root: int  # node index of the lane's synthetic root
    parent_lane: int | None = None
    parent_node: int | None = None  # node index of the spawning call


@dataclass
class CallTree:
    call: list[int] = field(default_factory=list)  # the host's call id; 0 for lane roots
    function: list[int] = field(default_factory=list)  # session function id or LANE_ROOT
    parent: list[int] = field(default_factory=list)  # node index; -1 for lane roots
    start: list[int] = field(default_factory=list)  # monotonic ns
    end: list[int] = field(default_factory=list)
    self_ns: list[int] = field(default_factory=list)
    # Sparse columns: only calls that suspended, or did not simply return.
    extras: dict[int, list[int]] = field(default_factory=dict)
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    # Time each call waited as its lane's innermost suspended await chain, while nothing ran
    # in the lane (node -> [awaiting ns, ready ns]): the lane's waits, charged to one stack.
    charged: dict[int, list[int]] = field(default_factory=dict)
    # (node, suspended, ready or -1, resumed) per suspension, up to MAX_WAITS
    waits: list[tuple[int, int, int, int]] = field(default_factory=list)
    lanes: list[LaneTree] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.function)

    def active_ns(self, node: int) -> int:
        extra = self.extras.get(node)
        return self.end[node] - self.start[node] if extra is None else extra[ACTIVE]


@dataclass
class RequestMeta:
    """What is known of an assembled request besides its calls."""

    session_id: str
    request_id: int
    route: str
    method: str
    status: int | None
    start: int  # monotonic ns
    end: int
    truncated: bool
    events: int

    @property
    def key(self) -> str:
        """Globally unique id: the host session's UUID plus the host's request number."""
        return f"{self.session_id}-{self.request_id}"


@dataclass
class AssembledRequest(RequestMeta):
    """One request assembled on its own (the general path, which repairs bad input)."""

    tree: CallTree

    @property
    def calls(self) -> int:
        return len(self.tree) - len(self.tree.lanes)
