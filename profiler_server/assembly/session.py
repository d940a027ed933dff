"""One host session's state on the server: its functions, its open requests, its batches.

Nothing here is needed by another server: everything can be rebuilt from the database
(function table, spooled payloads of batches that hold unfinished requests).
"""

from __future__ import annotations

import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from profiler_core.model import LaneKind, function_name
from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.events import MAX_NS, MalformedEvents, read_runs
from profiler_server.assembly.finished import FinishedIds
from profiler_server.assembly.flatten import StackInterner, stable_id
from profiler_server.assembly.pending import EVENT_BYTES, LANE_WEIGHT, LaneInfo, PendingRequest
from profiler_server.assembly.text import storable

# What the store can hold. A value beyond these would fail the whole storage transaction,
# and with it every other session's batches in it, so they are checked (or cut) here.
MAX_SEQ = 2**62
MAX_ROUTE = 500  # requests.route
MAX_METHOD = 16  # requests.method
MAX_LINE = 2**31 - 1  # functions.line


@dataclass(frozen=True)
class Limits:
    """What one session may hold (server settings of the same names)."""

    max_request_events: int
    max_open_requests: int
    max_session_functions: int
    max_name_length: int


# a batch's records with a monotonic time: (repeated field, its time field)
_TIMED = (("request_starts", "start_ns"), ("request_ends", "end_ns"), ("lanes", "start_ns"))


def _check_ranges(batch: ingest_pb2.Batch) -> None:
    """Raises MalformedEvents for numbers the store cannot hold (event times: read_runs)."""
    if not 0 < batch.seq < MAX_SEQ:
        raise MalformedEvents(f"seq {batch.seq} out of range")
    for records, time in _TIMED:
        for record in getattr(batch, records):
            if not 0 <= getattr(record, time) < MAX_NS:
                raise MalformedEvents("timestamps out of range")


class SeqTracker:
    """Which batch seqs were seen: a contiguous watermark plus the seqs above it."""

    def __init__(self, watermark: int = 0) -> None:
        self.watermark = watermark
        self.above: set[int] = set()
        self.highest = watermark

    def seen(self, seq: int) -> bool:
        return seq <= self.watermark or seq in self.above

    def add(self, seq: int) -> bool:
        """Records seq; returns True if it came after a later one (out of order)."""
        late = seq < self.highest
        self.highest = max(self.highest, seq)
        self.above.add(seq)
        while self.watermark + 1 in self.above:
            self.watermark += 1
            self.above.discard(self.watermark)
        return late

    @property
    def has_gap(self) -> bool:
        return bool(self.above)

    def skip_gap(self) -> None:
        """Gives up on missing seqs below the lowest one received."""
        self.watermark = min(self.above) - 1
        self.add(self.watermark + 1)
        self.above.discard(self.watermark)


@dataclass
class FunctionRow:
    fid: int
    function_id: int
    name: str
    file: str
    line: int
    kind: int


@dataclass
class Applied:
    """What applying one batch changed, for the storage transaction."""

    functions: list[FunctionRow] = field(default_factory=list)
    evicted: list[PendingRequest] = field(default_factory=list)  # over --max-open-requests
    drops_requests: dict[str, int] = field(default_factory=dict)
    drops_events: dict[str, int] = field(default_factory=dict)
    events: int = 0


class Session:
    def __init__(self, hello: ingest_pb2.Hello, limits: Limits) -> None:
        self.id = str(uuid.UUID(bytes=hello.session_id))
        self.service = hello.service
        self.hello = hello
        self.limits = limits
        self.functions: dict[int, tuple[int, str]] = {}
        # names: the defined functions' and as many undefined ids' again
        self.interner = StackInterner(self.functions.get, 2 * limits.max_session_functions)
        # in the order opened; an OrderedDict, as a dict's first key gets slow to find
        # after many deletions at the front (over --max-open-requests)
        self.pending: OrderedDict[int, PendingRequest] = OrderedDict()
        self.finished = FinishedIds()
        self.seqs = SeqTracker()
        self.batch_refs: dict[int, set[int]] = {}  # seq -> open requests with data in it
        self.spooled: set[int] = set()  # seqs whose payload is in the spool
        self.connected = True
        self.stream: object | None = None  # the stream currently feeding it
        self.disconnected_at = 0.0
        self.gap_since = 0.0

    # --- batches -------------------------------------------------------------------------
    def apply(self, batch: ingest_pb2.Batch, now: float, problems: Counter) -> Applied:
        """Adds a batch's records and events to the open requests (columns already validated)."""
        seq = batch.seq
        runs = read_runs(batch.events)  # validates before anything changes
        _check_ranges(batch)
        applied = Applied()
        limit = self.limits.max_name_length
        for f in batch.functions:
            if (
                f.id not in self.functions
                and len(self.functions) >= self.limits.max_session_functions
            ):
                problems[P.FUNCTION_LIMIT] += 1
                continue
            name = function_name(
                storable(f.module, limit, problems), storable(f.qualname, limit, problems)
            )
            gid = stable_id(name)
            self.functions[f.id] = (gid, name)
            line = f.line if f.line <= MAX_LINE else 0
            file = storable(f.file, limit, problems)
            applied.functions.append(FunctionRow(f.id, gid, name, file, line, f.kind))
        for start in batch.request_starts:
            pending = self._pending(start.request_id, seq, now, problems, applied)
            if pending is not None:
                pending.route = storable(start.route, min(limit, MAX_ROUTE), problems)
                pending.method = storable(start.method, MAX_METHOD, problems)
                pending.start_ns = start.start_ns
        for lane in batch.lanes:
            pending = self._pending(lane.request_id, seq, now, problems, applied)
            if pending is not None:
                name = storable(lane.name, limit, problems) or f"lane {lane.lane_id}"
                pending.lanes[lane.lane_id] = LaneInfo(
                    LaneKind(lane.kind)
                    if lane.kind in LaneKind._value2member_map_
                    else LaneKind.THREAD,
                    name,
                    lane.parent_lane,
                    lane.parent_call or None,
                    lane.start_ns or None,
                )
                pending.lane_weight += LANE_WEIGHT + len(name) // EVENT_BYTES
        for run in runs:
            count = len(run.kinds)
            applied.events += count
            pending = self._pending(run.request_id, seq, now, problems, applied, count)
            if pending is None:
                continue
            if pending.events + count > self.limits.max_request_events:
                pending.dropped_events += count
                problems[P.EVENT_CAP] += count
                continue
            pending.events += count
            pending.runs.append((seq, run))
        for end in batch.request_ends:
            pending = self._pending(end.request_id, seq, now, problems, applied)
            if pending is not None:
                pending.end_ns = end.end_ns
                pending.status = end.status or None
                if end.route:
                    pending.route = storable(end.route, min(limit, MAX_ROUTE), problems)
                pending.host_truncated = pending.host_truncated or end.truncated
                pending.running_lanes = frozenset(end.running_lanes)
                pending.end_seq = seq
        if batch.HasField("drops"):  # most batches have none: no maps read
            applied.drops_requests = dict(batch.drops.requests)
            applied.drops_events = dict(batch.drops.events)
        return applied

    def _pending(
        self,
        request_id: int,
        seq: int,
        now: float,
        problems: Counter,
        applied: Applied,
        events: int = 1,
    ) -> PendingRequest | None:
        pending = self.pending.get(request_id)
        if pending is None:
            if request_id in self.finished:
                problems[P.EVENTS_AFTER_END] += events
                return None
            if len(self.pending) >= self.limits.max_open_requests:
                self._evict_oldest(applied)
            pending = self.pending[request_id] = PendingRequest(request_id, session_id=self.id)
        if seq not in pending.seqs:
            pending.seqs.add(seq)
            self.batch_refs.setdefault(seq, set()).add(request_id)
        pending.touched = now
        return pending

    def _evict_oldest(self, applied: Applied) -> None:
        """Makes room for a new request: the first one opened is to be stored truncated now
        (the caller stores it, and `finish()`es it); its later events count as after its end."""
        oldest = self.pending.pop(next(iter(self.pending)))
        self.finished.add(oldest.request_id)
        applied.evicted.append(oldest)

    # --- finishing -------------------------------------------------------------------------
    def complete(self) -> list[PendingRequest]:
        """Ended requests whose every earlier batch has arrived."""
        watermark = self.seqs.watermark
        return [p for p in self.pending.values() if p.ended and p.end_seq <= watermark]

    def stale(self, idle_before: float) -> list[PendingRequest]:
        return [p for p in self.pending.values() if p.touched < idle_before]

    def finish(self, pending: PendingRequest) -> list[int]:
        """Forgets a stored request; returns spooled seqs that no longer hold open requests."""
        rid = pending.request_id
        self.pending.pop(rid, None)
        self.finished.add(rid)
        released = []
        for seq in pending.seqs:
            refs = self.batch_refs.get(seq)
            if refs is None:
                continue
            refs.discard(rid)
            if not refs:
                del self.batch_refs[seq]
                if seq in self.spooled:
                    self.spooled.discard(seq)
                    released.append(seq)
        return released

    def holds_open(self, seq: int) -> bool:
        return bool(self.batch_refs.get(seq))
